// Hector's traversal template, specialized by the code generator (systems/hector/codegen.py) with
// #defines put before this text; as it stands, the plain float32 variant that CI compiles for sm_90.
// With BF16 every row a kernel reads or writes (`element`) is a bfloat16, widened to float as it
// is read: the arithmetic, the softmax and every sum are float32, and each result is rounded to
// bf16 once, to nearest, ties to even, as it is stored. A sum into targets adds into a float32
// buffer (`out` stays float*): bf16 atomic adds would round once per chunk; the host rounds the
// finished sums to bf16.
//
// Rows are edges, pairs or nodes. An operand is read in one of four ways (OPERAND_A / _B):
//   0 its own row i; 1 row index[i] (a fused gather: no gathered copy is made);
//   2 a scalar passed as an argument; 3 row 0 for every i (a shared vector).
// An operand narrower than the output is read head by head: of width w under an output of width
// W, column c reads its column c / (W / w) (one value per head's block; width 1: column 0).
//
//   rows_map:     out[i, c] = ROW_EXPR(a, b)
//   rows_dot:     out[i, h] = sum over c in head h's block of a[., c] * b[., c]   (a warp per row and head)
//   scatter_rows: out[index[i], c] += in[i, c]                     (a sum into targets, below)
//   scatter_map:  out[index[i], c] += ROW_EXPR(a, b)               (the same, the row never stored)
//   fused_map:    out[i, c] = FUSED_VALUE(i, c)           (a chain of row-wise operators, one pass)
//   fused_scatter_map: out[index[i], c] += FUSED_VALUE(i, c)
//                 FUSED_PARAMS lists each leaf operand k's (t_k, x_k, s_k, w_k); FUSED_VALUE is the
//                 chain's expression of operand(K_k, t_k, x_k, s_k, i, c, w_k) reads
//   edge_softmax: per target v and column h, over its incoming edges (by_dst[dst_begin[v] ..
//                 dst_begin[v + 1]]): out[e, h] = exp(s[e, h] - max) / sum of exp(s[., h] - max)
//                 (one warp per target and column)
//   max_rows:     out[v, c] = max over v's edges e (order[begin[v] .. begin[v + 1]]) of in[e, c],
//                 0 for a node with none (one thread per node and column)
//
// A sum into targets is destination-parallel: the rows of each target, in ``order`` (the row ids
// sorted by target), come in chunks of at most 32 rows of one target (chunk_target, chunk_begin,
// chunk_end: positions in order; chunks past the last are empty). A warp adds up a chunk's rows in
// registers and adds the sum to its target once: one atomic per chunk and column, where an
// edge-parallel loop would do one per row and column, all of them to random targets. out is zeroed
// first (a target may get several chunks, and one with no rows gets none).
// No headers: the same text compiles with NVRTC at run time and with nvcc in CI.

#ifndef OPERAND_A
#define OPERAND_A 0
#endif
#ifndef OPERAND_B
#define OPERAND_B 0
#endif
#ifndef ROW_EXPR
#define ROW_EXPR(a, b) ((a) + (b))
#endif
#ifndef MAP_NAME
#define MAP_NAME rows_map
#endif
#ifndef DOT_NAME
#define DOT_NAME rows_dot
#endif
#ifndef SCATTER_MAP_NAME
#define SCATTER_MAP_NAME scatter_map
#endif
#ifndef FUSED_MAP_NAME
#define FUSED_MAP_NAME fused_map
#endif
#ifndef FUSED_SCATTER_MAP_NAME
#define FUSED_SCATTER_MAP_NAME fused_scatter_map
#endif
#ifndef BF16
#define BF16 0
#endif

#if BF16
typedef unsigned short element;  // a bfloat16's bits (no headers, see above)
__device__ __forceinline__ float widen(element x) { return __uint_as_float((unsigned)x << 16); }  // exact
__device__ __forceinline__ element narrow(float x) {
    unsigned short bits;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(bits) : "f"(x));
    return bits;
}
#else
typedef float element;
__device__ __forceinline__ float widen(float x) { return x; }
__device__ __forceinline__ float narrow(float x) { return x; }
#endif

__device__ __forceinline__ float operand(int kind, const element* __restrict__ t, const long long* __restrict__ index,
                                         float scalar, long long i, int c, int width, int out_width) {
    const int column = width == 1 ? 0 : (width == out_width ? c : c / (out_width / width));
    if (kind == 2) return scalar;
    const long long row = kind == 1 ? index[i] : (kind == 3 ? 0 : i);
    return widen(t[row * width + column]);
}

// ROW_EXPR of both operands at row i, column c of width columns.
__device__ __forceinline__ float row_value(const element* __restrict__ a, const long long* __restrict__ a_index,
                                           float a_scalar, int a_width, const element* __restrict__ b,
                                           const long long* __restrict__ b_index, float b_scalar, int b_width,
                                           long long i, int c, int width) {
    const float x = operand(OPERAND_A, a, a_index, a_scalar, i, c, a_width, width);
    const float y = operand(OPERAND_B, b, b_index, b_scalar, i, c, b_width, width);
    return ROW_EXPR(x, y);
}

// grid-stride over rows x width
extern "C" __global__ void MAP_NAME(const element* __restrict__ a, const long long* __restrict__ a_index,
                                    float a_scalar, int a_width, const element* __restrict__ b,
                                    const long long* __restrict__ b_index, float b_scalar, int b_width,
                                    element* __restrict__ out, long long rows, int width) {
    const long long total = rows * width;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        out[e] = narrow(row_value(a, a_index, a_scalar, a_width, b, b_index, b_scalar, b_width, e / width,
                                  (int)(e % width), width));
    }
}

// one warp per row and head, grid-stride; width is a multiple of heads
extern "C" __global__ void DOT_NAME(const element* __restrict__ a, const long long* __restrict__ a_index,
                                    float a_scalar, const element* __restrict__ b, const long long* __restrict__ b_index,
                                    float b_scalar, element* __restrict__ out, long long rows, int width, int heads) {
    const int lane = threadIdx.x % 32;
    const long long warps = (long long)gridDim.x * blockDim.x / 32;
    const int block = width / heads;
    for (long long j = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32; j < rows * heads; j += warps) {
        const long long i = j / heads;
        const int first = (int)(j % heads) * block;
        float sum = 0.0f;
        for (int c = first + lane; c < first + block; c += 32) {
            sum += operand(OPERAND_A, a, a_index, a_scalar, i, c, width, width) *
                   operand(OPERAND_B, b, b_index, b_scalar, i, c, width, width);
        }
        for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
        if (lane == 0) out[j] = narrow(sum);
    }
}

// The sum of value(i, c) over each chunk's rows i, added to its target (see the top). A chunk has
// at most 32 rows (lower.SUM_ROWS): the warp reads their ids at once, one per lane, and hands them
// round by shuffles, so the rows' values are loaded without waiting on the ids one by one. Narrow
// rows share the warp: lanes take `cols` columns (a power of two, at most 32) and 32 / cols rows
// at a time, and shuffles add the lanes' partial sums of a column together.
template <class Value>
__device__ __forceinline__ void sum_into_targets(Value value, const long long* __restrict__ order,
                                                 const int* __restrict__ chunk_target,
                                                 const long long* __restrict__ chunk_begin,
                                                 const long long* __restrict__ chunk_end, float* __restrict__ out,
                                                 long long chunks, int width) {
    const int lane = threadIdx.x % 32;
    int cols = 1;
    while (cols < width && cols < 32) cols *= 2;
    const int groups = 32 / cols, group = lane / cols;
    const long long warps = (long long)gridDim.x * blockDim.x / 32;
    for (long long k = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32; k < chunks; k += warps) {
        const long long begin = chunk_begin[k];
        const int rows = (int)(chunk_end[k] - begin);
        if (rows == 0) continue;  // the same k across the warp: the warp skips together
        const long long mine = lane < rows ? order[begin + lane] : 0;
        float* target = out + (long long)chunk_target[k] * width;
        for (int c0 = 0; c0 < width; c0 += cols) {
            const int c = c0 + lane % cols;
            float sum = 0.0f;
#pragma unroll 4
            for (int r0 = 0; r0 < rows; r0 += groups) {  // the same turns for every lane: the shuffles need them all
                const int r = r0 + group;
                const long long i = __shfl_sync(0xffffffffu, mine, r % 32);
                if (r < rows && c < width) sum += value(i, c);
            }
            for (int offset = cols; offset < 32; offset *= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
            if (c < width && group == 0) atomicAdd(target + c, sum);
        }
    }
}

// out[index[i], c] += ROW_EXPR(a, b): a row-wise product summed into its target without the
// per-row result ever being stored.
extern "C" __global__ void SCATTER_MAP_NAME(const element* __restrict__ a, const long long* __restrict__ a_index,
                                            float a_scalar, int a_width, const element* __restrict__ b,
                                            const long long* __restrict__ b_index, float b_scalar, int b_width,
                                            const long long* __restrict__ order, const int* __restrict__ chunk_target,
                                            const long long* __restrict__ chunk_begin,
                                            const long long* __restrict__ chunk_end, float* __restrict__ out,
                                            long long chunks, int width) {
    const auto value = [&](long long i, int c) {
        return row_value(a, a_index, a_scalar, a_width, b, b_index, b_scalar, b_width, i, c, width);
    };
    sum_into_targets(value, order, chunk_target, chunk_begin, chunk_end, out, chunks, width);
}

#ifdef FUSED_VALUE
// grid-stride over rows x width: the whole chain per element, no intermediate row stored
extern "C" __global__ void FUSED_MAP_NAME(FUSED_PARAMS, element* __restrict__ out, long long rows, int width) {
    const long long total = rows * width;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const long long i = e / width;
        const int c = (int)(e % width);
        out[e] = narrow(FUSED_VALUE(i, c));
    }
}

extern "C" __global__ void FUSED_SCATTER_MAP_NAME(FUSED_PARAMS, const long long* __restrict__ order,
                                                  const int* __restrict__ chunk_target,
                                                  const long long* __restrict__ chunk_begin,
                                                  const long long* __restrict__ chunk_end, float* __restrict__ out,
                                                  long long chunks, int width) {
    sum_into_targets([&](long long i, int c) { return FUSED_VALUE(i, c); }, order, chunk_target, chunk_begin,
                     chunk_end, out, chunks, width);
}
#endif

extern "C" __global__ void scatter_rows(const element* __restrict__ in, const long long* __restrict__ order,
                                        const int* __restrict__ chunk_target, const long long* __restrict__ chunk_begin,
                                        const long long* __restrict__ chunk_end, float* __restrict__ out,
                                        long long chunks, int width) {
    sum_into_targets([&](long long i, int c) { return widen(in[i * width + c]); }, order, chunk_target, chunk_begin,
                     chunk_end, out, chunks, width);
}

extern "C" __global__ void edge_softmax(const element* __restrict__ scores, const long long* __restrict__ by_dst,
                                        const long long* __restrict__ dst_begin, element* __restrict__ out,
                                        long long nodes, int width) {
    const int lane = threadIdx.x % 32;
    const long long warps = (long long)gridDim.x * blockDim.x / 32;
    for (long long j = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / 32; j < nodes * width; j += warps) {
        const long long v = j / width;
        const int h = (int)(j % width);
        const long long begin = dst_begin[v], end = dst_begin[v + 1];
        float top = -__int_as_float(0x7f800000);  // -inf
        for (long long p = begin + lane; p < end; p += 32) top = fmaxf(top, widen(scores[by_dst[p] * width + h]));
        for (int offset = 16; offset > 0; offset /= 2) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, offset));
        float total = 0.0f;
        for (long long p = begin + lane; p < end; p += 32) total += expf(widen(scores[by_dst[p] * width + h]) - top);
        for (int offset = 16; offset > 0; offset /= 2) total += __shfl_xor_sync(0xffffffffu, total, offset);
        for (long long p = begin + lane; p < end; p += 32) {
            const long long e = by_dst[p] * width + h;
            out[e] = narrow(expf(widen(scores[e]) - top) / total);
        }
    }
}

// grid-stride over nodes x width; consecutive threads take consecutive columns of one node, so
// each edge's row is read in order. A NaN is the maximum once met, as in torch's amax (fmaxf
// would drop it).
extern "C" __global__ void max_rows(const element* __restrict__ in, const long long* __restrict__ order,
                                    const long long* __restrict__ begin, element* __restrict__ out, long long nodes,
                                    int width) {
    const long long total = nodes * width;
    for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k < total;
         k += (long long)gridDim.x * blockDim.x) {
        const long long v = k / width;
        const int c = (int)(k % width);
        const long long first = begin[v], end = begin[v + 1];
        float top = first < end ? widen(in[order[first] * width + c]) : 0.0f;
        for (long long p = first + 1; p < end; ++p) {
            const float x = widen(in[order[p] * width + c]);
            if (x > top || x != x) top = x;
        }
        out[k] = narrow(top);  // a bf16 maximum is one of the rows' bf16s: exact
    }
}
