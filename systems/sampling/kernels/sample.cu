// Uniform neighbour sampling from a CSR (indptr, indices), one thread per seed node.
//
// indptr and indices may live in GPU memory or in pinned host memory (read over PCIe through
// unified addressing): the kernels only see pointers. Random numbers are a counter-based hash
// of (rng_seed, node, counter), so the CPU reference draws exactly the same neighbours.
// Without replacement a node with more than `fanout` neighbours gets `fanout` distinct ones
// (Floyd's algorithm); otherwise all of them. With replacement it gets `fanout` draws (none if
// it has no neighbours). No headers: this file compiles with NVRTC and with nvcc in CI.

typedef unsigned long long u64;

#define MAX_FANOUT 64

__device__ __forceinline__ u64 mix64(u64 x) {  // splitmix64 finaliser
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

__device__ __forceinline__ u64 draw(u64 rng_seed, long long node, long long counter) {
    return mix64(mix64(rng_seed ^ mix64((u64)node)) + (u64)counter);
}

__device__ __forceinline__ long long sample_count(long long degree, int fanout, int replace) {
    if (replace) return degree > 0 ? fanout : 0;
    return degree < fanout ? degree : fanout;
}

extern "C" __global__ void count_samples(const long long* __restrict__ indptr, const long long* __restrict__ seeds,
                                         long long num_seeds, int fanout, int replace,
                                         long long* __restrict__ counts) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= num_seeds) return;
    const long long node = seeds[i];
    counts[i] = sample_count(indptr[node + 1] - indptr[node], fanout, replace);
}

extern "C" __global__ void sample_neighbors(const long long* __restrict__ indptr,
                                            const long long* __restrict__ indices,
                                            const long long* __restrict__ seeds, long long num_seeds,
                                            int fanout, int replace, u64 rng_seed,
                                            const long long* __restrict__ offsets,
                                            long long* __restrict__ out) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= num_seeds) return;
    const long long node = seeds[i];
    const long long start = indptr[node];
    const long long degree = indptr[node + 1] - start;
    long long* dst = out + offsets[i];
    if (replace) {
        if (degree == 0) return;
        for (int s = 0; s < fanout; ++s) dst[s] = indices[start + (long long)(draw(rng_seed, node, s) % (u64)degree)];
        return;
    }
    if (degree <= fanout) {
        for (long long s = 0; s < degree; ++s) dst[s] = indices[start + s];
        return;
    }
    long long chosen[MAX_FANOUT];
    int count = 0;
    for (long long j = degree - fanout; j < degree; ++j) {  // Floyd: fanout distinct positions
        long long t = (long long)(draw(rng_seed, node, j) % (u64)(j + 1));
        for (int c = 0; c < count; ++c) {
            if (chosen[c] == t) { t = j; break; }
        }
        chosen[count++] = t;
    }
    for (int c = 0; c < fanout; ++c) dst[c] = indices[start + chosen[c]];
}

// The same draws in fixed slots, for sampling without waiting for the host: seed i's samples go
// to out[i * fanout ...], counts[i] says how many are real, and unused slots hold -1. Only the
// first *num_valid seeds are sampled (the count lives in GPU memory, written by the hop before);
// the grid covers num_seeds, a bound on it, so no one needs to read the count back to launch.
extern "C" __global__ void sample_into_slots(const long long* __restrict__ indptr,
                                             const long long* __restrict__ indices,
                                             const long long* __restrict__ seeds, long long num_seeds,
                                             const long long* __restrict__ num_valid, int fanout, int replace,
                                             u64 rng_seed, long long* __restrict__ counts,
                                             long long* __restrict__ out) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= num_seeds) return;
    long long* dst = out + i * fanout;
    long long count = 0;
    if (i < *num_valid) {
        const long long node = seeds[i];
        const long long start = indptr[node];
        const long long degree = indptr[node + 1] - start;
        count = sample_count(degree, fanout, replace);
        if (replace) {
            for (int s = 0; s < count; ++s)
                dst[s] = indices[start + (long long)(draw(rng_seed, node, s) % (u64)degree)];
        } else if (degree <= fanout) {
            for (long long s = 0; s < degree; ++s) dst[s] = indices[start + s];
        } else {
            long long chosen[MAX_FANOUT];
            int picked = 0;
            for (long long j = degree - fanout; j < degree; ++j) {  // Floyd, as in sample_neighbors
                long long t = (long long)(draw(rng_seed, node, j) % (u64)(j + 1));
                for (int c = 0; c < picked; ++c) {
                    if (chosen[c] == t) { t = j; break; }
                }
                chosen[picked++] = t;
            }
            for (int c = 0; c < fanout; ++c) dst[c] = indices[start + chosen[c]];
        }
    }
    counts[i] = count;
    for (long long s = count; s < fanout; ++s) dst[s] = -1;
}
