// Uniform neighbour sampling from a CSR (indptr, indices), one thread per seed node.
//
// indptr and indices may live in GPU memory or in pinned host memory (read over PCIe through
// unified addressing): the kernels only see pointers. Random numbers are a counter-based hash
// of (rng_seed, node, counter), so the CPU reference draws exactly the same neighbours.
// Without replacement a node with more than `fanout` neighbours gets `fanout` distinct ones
// (Floyd's algorithm); otherwise all of them. With replacement it gets `fanout` draws (none if
// it has no neighbours). No headers: this file compiles with NVRTC and with nvcc in CI.
//
// Nothing is read or written out of bounds whatever the input: a seed that is not a node, or a
// CSR row or neighbour id out of range, samples nothing there and sets a bit in *error, from
// which the op raises the CPU kernel's error (the CPU kernel checks the same things).

typedef unsigned long long u64;

#define MAX_FANOUT 64
#define SEED_OUT_OF_RANGE 1
#define BAD_CSR 2

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

// The CSR row of `node` (start, degree), or false with the error bit set where the node or its
// row is out of range.
__device__ __forceinline__ bool checked_row(const long long* __restrict__ indptr, long long num_nodes,
                                            long long num_indices, long long node, long long* start,
                                            long long* degree, int* error) {
    if (node < 0 || node >= num_nodes) {
        atomicOr(error, SEED_OUT_OF_RANGE);
        return false;
    }
    const long long first = indptr[node], end = indptr[node + 1];
    if (first < 0 || end < first || end > num_indices) {
        atomicOr(error, BAD_CSR);
        return false;
    }
    *start = first;
    *degree = end - first;
    return true;
}

// indices[position], or -1 with the error bit set where it is not a node id.
__device__ __forceinline__ long long checked_neighbor(const long long* __restrict__ indices, long long position,
                                                      long long num_nodes, int* error) {
    const long long v = indices[position];
    if (v < 0 || v >= num_nodes) {
        atomicOr(error, BAD_CSR);
        return -1;
    }
    return v;
}

// Floyd's algorithm: `fanout` distinct positions in [0, degree), degree > fanout.
__device__ __forceinline__ void floyd(u64 rng_seed, long long node, long long degree, int fanout,
                                      long long* chosen) {
    int picked = 0;
    for (long long j = degree - fanout; j < degree; ++j) {
        long long t = (long long)(draw(rng_seed, node, j) % (u64)(j + 1));
        for (int c = 0; c < picked; ++c) {
            if (chosen[c] == t) { t = j; break; }
        }
        chosen[picked++] = t;
    }
}

// Seed `node`'s draws into dst (sample_count of them); the row is checked already.
__device__ __forceinline__ void draw_row(const long long* __restrict__ indices, long long num_nodes, long long node,
                                         long long start, long long degree, int fanout, int replace, u64 rng_seed,
                                         long long* dst, int* error) {
    if (replace) {
        if (degree == 0) return;
        for (int s = 0; s < fanout; ++s)
            dst[s] = checked_neighbor(indices, start + (long long)(draw(rng_seed, node, s) % (u64)degree), num_nodes, error);
        return;
    }
    if (degree <= fanout) {
        for (long long s = 0; s < degree; ++s) dst[s] = checked_neighbor(indices, start + s, num_nodes, error);
        return;
    }
    long long chosen[MAX_FANOUT];
    floyd(rng_seed, node, degree, fanout, chosen);
    for (int c = 0; c < fanout; ++c) dst[c] = checked_neighbor(indices, start + chosen[c], num_nodes, error);
}

extern "C" __global__ void count_samples(const long long* __restrict__ indptr, long long num_nodes,
                                         long long num_indices, const long long* __restrict__ seeds,
                                         long long num_seeds, int fanout, int replace,
                                         long long* __restrict__ counts, int* error) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= num_seeds) return;
    long long start, degree;
    const bool ok = checked_row(indptr, num_nodes, num_indices, seeds[i], &start, &degree, error);
    counts[i] = ok ? sample_count(degree, fanout, replace) : 0;
}

extern "C" __global__ void sample_neighbors(const long long* __restrict__ indptr,
                                            const long long* __restrict__ indices, long long num_nodes,
                                            long long num_indices, const long long* __restrict__ seeds,
                                            long long num_seeds, int fanout, int replace, u64 rng_seed,
                                            const long long* __restrict__ offsets,
                                            long long* __restrict__ out, int* error) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= num_seeds) return;
    const long long node = seeds[i];
    long long start, degree;
    if (!checked_row(indptr, num_nodes, num_indices, node, &start, &degree, error)) return;  // counted 0
    draw_row(indices, num_nodes, node, start, degree, fanout, replace, rng_seed, out + offsets[i], error);
}

// The same draws in fixed slots, for sampling without waiting for the host: seed i's samples go
// to out[i * fanout ...], counts[i] says how many are real, and unused slots hold -1. Only the
// first *num_valid seeds are sampled (the count lives in GPU memory, written by the hop before);
// the grid covers num_seeds, a bound on it, so no one needs to read the count back to launch.
extern "C" __global__ void sample_into_slots(const long long* __restrict__ indptr,
                                             const long long* __restrict__ indices, long long num_nodes,
                                             long long num_indices, const long long* __restrict__ seeds,
                                             long long num_seeds, const long long* __restrict__ num_valid,
                                             int fanout, int replace, u64 rng_seed,
                                             long long* __restrict__ counts, long long* __restrict__ out,
                                             int* error) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= num_seeds) return;
    long long* dst = out + i * fanout;
    long long count = 0, start, degree;
    if (i < *num_valid && checked_row(indptr, num_nodes, num_indices, seeds[i], &start, &degree, error)) {
        count = sample_count(degree, fanout, replace);
        draw_row(indices, num_nodes, seeds[i], start, degree, fanout, replace, rng_seed, dst, error);
    }
    counts[i] = count;
    for (long long s = count; s < fanout; ++s) dst[s] = -1;
}
