// Zero-copy row reads: out[i, :] = table[rows[i], :] for a table in page-locked host memory.
//
// One warp copies one row at a time (grid-stride over rows), so each row becomes a run of
// coalesced PCIe read requests. `table` is the device-side address of the pinned host buffer.
// No headers: this file compiles with NVRTC at run time and with nvcc in CI.

// 16-byte loads and stores; needs row_bytes % 16 == 0 and 16-byte aligned table and out.
extern "C" __global__ void read_rows_vec16(const uint4* __restrict__ table,
                                           const long long* __restrict__ rows,
                                           long long num_rows, long long row_bytes,
                                           uint4* __restrict__ out) {
    const long long vecs_per_row = row_bytes / 16;
    const int lane = threadIdx.x % 32;
    const long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32;
    const long long num_warps = (gridDim.x * (long long)blockDim.x) / 32;
    for (long long i = warp; i < num_rows; i += num_warps) {
        const uint4* src = table + rows[i] * vecs_per_row;
        uint4* dst = out + i * vecs_per_row;
        for (long long v = lane; v < vecs_per_row; v += 32) dst[v] = src[v];
    }
}

// Byte-wise fallback for any row size and alignment.
extern "C" __global__ void read_rows_bytes(const unsigned char* __restrict__ table,
                                           const long long* __restrict__ rows,
                                           long long num_rows, long long row_bytes,
                                           unsigned char* __restrict__ out) {
    const int lane = threadIdx.x % 32;
    const long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32;
    const long long num_warps = (gridDim.x * (long long)blockDim.x) / 32;
    for (long long i = warp; i < num_rows; i += num_warps) {
        const unsigned char* src = table + rows[i] * row_bytes;
        unsigned char* dst = out + i * row_bytes;
        for (long long b = lane; b < row_bytes; b += 32) dst[b] = src[b];
    }
}
