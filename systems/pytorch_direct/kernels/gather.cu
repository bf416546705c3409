// Zero-copy row gather: out[i, :] = table[idx[i], :] for a table in page-locked host memory,
// read by GPU threads over PCIe (PyTorch-Direct's GPU-centric access).
//
// One warp copies one row at a time (grid-stride over rows) in words of W bytes (1..16). The
// table is read through the read-only data path (__ldg, ld.global.nc): on an H200 that took
// 2 KiB rows from 47.5 to the bare read kernel's 50.8 GB/s (tools/gather_kernel_probe.py).
// ALIGNED: the warp's window starts at the 128-byte line that holds the row's first byte, so
// every request the warp issues covers whole 128-byte lines; lanes outside the row are masked.
// Without it, a row that starts mid-line is split into more, partial requests.
// CACHED: rows listed in `slots` (0 <= slot < cache_rows) are read from a copy in GPU memory
// instead; a slot outside the cache (a hand-made slot table gone wrong) reads the table's row, so
// no memory past the cache is read.
// An index outside [0, table_rows) is never read: the smallest position holding one is written
// to *bad_pos (initialised to n by the caller), and the host raises an error naming the value.
//
// No headers: this file compiles with NVRTC at run time and with nvcc in CI.

typedef unsigned long long u64;

template <typename Word, bool kAligned, bool kCached, typename Index>
__device__ __forceinline__ void gather_rows(const unsigned char* __restrict__ table, long long table_rows,
                                            const Index* __restrict__ idx, long long n, long long row_bytes,
                                            const int* __restrict__ slots,
                                            const unsigned char* __restrict__ cache, long long cache_rows,
                                            unsigned char* __restrict__ out, long long* bad_pos) {
    const long long W = sizeof(Word);
    const int lane = threadIdx.x & 31;
    const long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    const long long num_warps = (gridDim.x * (long long)blockDim.x) >> 5;
    for (long long i = warp; i < n; i += num_warps) {
        const long long r = (long long)idx[i];
        if (r < 0 || r >= table_rows) {
            if (lane == 0) atomicMin(bad_pos, i);
            continue;
        }
        const unsigned char* src = table + r * row_bytes;
        if (kCached) {
            const int slot = slots[r];
            if (slot >= 0 && slot < cache_rows) src = cache + (long long)slot * row_bytes;
        }
        unsigned char* dst = out + i * row_bytes;
        long long first = 0;
        if (kAligned) first = -(long long)(((u64)src) & 127);  // back to the start of the line
        for (long long off = first + lane * W; off < row_bytes; off += 32 * W) {
            if (!kAligned || off >= 0) {
                *reinterpret_cast<Word*>(dst + off) = __ldg(reinterpret_cast<const Word*>(src + off));
            }
        }
    }
}

#define GATHER_ENTRY(NAME, WORD, ALIGNED, CACHED, INDEX)                                             \
    extern "C" __global__ void NAME(const unsigned char* table, long long table_rows, const INDEX* idx, \
                                    long long n, long long row_bytes, const int* slots,                 \
                                    const unsigned char* cache, long long cache_rows, unsigned char* out, \
                                    long long* bad_pos) {                                               \
        gather_rows<WORD, ALIGNED, CACHED, INDEX>(table, table_rows, idx, n, row_bytes, slots, cache,    \
                                                  cache_rows, out, bad_pos);                            \
    }

#define GATHER_WORDS(MODE, ALIGNED, CACHED, ITAG, INDEX)                          \
    GATHER_ENTRY(gather_##MODE##_w1_##ITAG, unsigned char, ALIGNED, CACHED, INDEX)  \
    GATHER_ENTRY(gather_##MODE##_w2_##ITAG, unsigned short, ALIGNED, CACHED, INDEX) \
    GATHER_ENTRY(gather_##MODE##_w4_##ITAG, unsigned int, ALIGNED, CACHED, INDEX)   \
    GATHER_ENTRY(gather_##MODE##_w8_##ITAG, u64, ALIGNED, CACHED, INDEX)            \
    GATHER_ENTRY(gather_##MODE##_w16_##ITAG, uint4, ALIGNED, CACHED, INDEX)

// Entry points: gather_{plain|aligned|cached}_w{1,2,4,8,16}_{i32|i64}.
GATHER_WORDS(plain, false, false, i32, int)
GATHER_WORDS(plain, false, false, i64, long long)
GATHER_WORDS(aligned, true, false, i32, int)
GATHER_WORDS(aligned, true, false, i64, long long)
GATHER_WORDS(cached, true, true, i32, int)
GATHER_WORDS(cached, true, true, i64, long long)

// Index check for stock torch ops on the CUDA alias of the table: torch's index_select asserts on
// the device for an out-of-range index, which leaves the CUDA context unusable. This copies idx
// to `safe` with each out-of-range index replaced by row 0, and writes the smallest position
// holding one to *bad_pos (initialised to n), so the host can raise after the gather instead.
template <typename Index>
__device__ __forceinline__ void sanitize(const Index* __restrict__ idx, long long n, long long table_rows,
                                         Index* __restrict__ safe, long long* bad_pos) {
    const long long stride = gridDim.x * (long long)blockDim.x;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += stride) {
        const Index r = idx[i];
        const bool bad = r < 0 || (long long)r >= table_rows;
        if (bad) atomicMin(bad_pos, i);
        safe[i] = bad ? (Index)0 : r;
    }
}

extern "C" __global__ void sanitize_indices_i32(const int* idx, long long n, long long table_rows, int* safe,
                                                long long* bad_pos) {
    sanitize<int>(idx, n, table_rows, safe, bad_pos);
}

extern "C" __global__ void sanitize_indices_i64(const long long* idx, long long n, long long table_rows,
                                                long long* safe, long long* bad_pos) {
    sanitize<long long>(idx, n, table_rows, safe, bad_pos);
}
