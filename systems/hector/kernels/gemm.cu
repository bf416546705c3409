// Hector's GEMM template, specialized by the code generator (systems/hector/codegen.py) with
// #defines put before this text: exact float32 by default; with TENSOR_CORES the labelled TF32
// variant; with BF16 as well, bfloat16 rows, weights and results on bf16 tensor cores
// (segment_gemm alone; its own kernel body, after the float32 one). As it stands (no #defines) it
// is the plain float32 variant, and CI compiles it so for sm_90 like every kernel of the suite.
//
// Rows are visited in a *sorted position* order in which each type (relation or node type) is one
// contiguous segment; the host cuts the segments into tiles once per graph (a tile never spans
// two types) and passes, per tile, its type and its first and one-past-last position.
//
//   segment_gemm:  for each position i of a tile of type t:
//                    C[c_rows[i]] (+)= A[a_rows[i]] @ op(B[t])      op(B) = B or B^T
//     GATHER_A   reads A's rows through a_rows (a fused gather: no gathered copy of A is made);
//     SCATTER_C  writes C's rows through c_rows;
//     ACCUMULATE adds into C atomically (several positions may write one row);
//     TRANSPOSE_B multiplies by B[t]^T (the data gradient of a typed product).
//   segment_outer (OUTER): for each tile of type t, the weight gradient's share
//                    D[t] += sum over its positions i of A[a_rows[i]]^T G[g_rows[i]]   (atomic)
//     OUTER_BF16 reads bfloat16 rows of A and G (widened exactly); D stays float32, so that the
//                gradient is summed in float32 and rounded once, by the host, when it is whole.
//
// No headers: the same text compiles with NVRTC at run time and with nvcc in CI.

#ifndef GATHER_A
#define GATHER_A 0
#endif
#ifndef SCATTER_C
#define SCATTER_C 0
#endif
#ifndef ACCUMULATE
#define ACCUMULATE 0
#endif
#ifndef TRANSPOSE_B
#define TRANSPOSE_B 0
#endif
#ifndef GATHER_G
#define GATHER_G 0
#endif
#ifndef GEMM_NAME
#define GEMM_NAME segment_gemm
#endif
#ifndef OUTER_NAME
#define OUTER_NAME segment_outer
#endif
#ifndef OUTER_BF16
#define OUTER_BF16 0
#endif

typedef unsigned short bf16;  // a bfloat16's bits (no headers, see above)

#ifndef TILE_M
#define TILE_M 64  // rows of a tile: 64 or 128 (the host cuts segments into tiles of this many rows)
#endif
#ifndef TILE_N
#define TILE_N 64  // columns of a tile: 64 or 128
#endif
#ifndef VEC4
// K and N multiples of 4 and every row 16-byte aligned: float4 loads and stores. With BF16: K and
// N multiples of 8 and every row 16-byte aligned, so that rows move in 16-byte pieces (cp.async in,
// vector stores out); codegen.gemm_shape decides which.
#define VEC4 0
#endif
#ifndef TENSOR_CORES
#define TENSOR_CORES 0  // 1: the labelled TF32 variant (inputs rounded to TF32, fp32 accumulate)
#endif
// 1 (with TENSOR_CORES): A, B and C hold bfloat16s, multiplied on bf16 tensor cores
// (mma.m16n8k16, fp32 accumulate) and C rounded to bf16 once, to nearest, ties to even.
#ifndef BF16
#define BF16 0
#endif
#if BF16 && (!TENSOR_CORES || ACCUMULATE)
#error "the bf16 variant multiplies on tensor cores and writes its rows (there are no bf16 atomic adds here)"
#endif
#define TILE_K 16
#define THREADS 256  // 16 x 16 threads, each a (TILE_M / 16) x (TILE_N / 16) block of the output tile
#define MI (TILE_M / 16)
#define NJ (TILE_N / 16)
// Pads the shared tiles' rows: keeps them 16-byte aligned, and spreads the banks of the float32
// path's transposing stores (4) or of the tensor-core path's fragment loads (8), whichever is hot.
#define PAD (TENSOR_CORES ? 8 : 4)

// A thread's i-th row of a tile: runs of 4 neighbouring rows, the runs 64 apart, so that a
// warp's float4 reads of a shared k-row cover neighbouring addresses (no bank conflicts).
__device__ __forceinline__ int own_row(int i, int ty) { return (i / 4) * 64 + ty * 4 + i % 4; }

// acc[i][j] += sum over the TILE_K steps k of left[k][own_row(i)] * right[k][own_row(j)].
template <int LM, int LN>
__device__ __forceinline__ void accumulate_tile(const float (&left)[TILE_K][LM + PAD],
                                                const float (&right)[TILE_K][LN + PAD], float (&acc)[LM / 16][LN / 16],
                                                int tx, int ty) {
#pragma unroll
    for (int k = 0; k < TILE_K; ++k) {
        float a[LM / 16], b[LN / 16];
#pragma unroll
        for (int i = 0; i < LM / 16; i += 4) {
            const float4 v = *reinterpret_cast<const float4*>(&left[k][own_row(i, ty)]);
            a[i] = v.x, a[i + 1] = v.y, a[i + 2] = v.z, a[i + 3] = v.w;
        }
#pragma unroll
        for (int j = 0; j < LN / 16; j += 4) {
            const float4 v = *reinterpret_cast<const float4*>(&right[k][own_row(j, tx)]);
            b[j] = v.x, b[j + 1] = v.y, b[j + 2] = v.z, b[j + 3] = v.w;
        }
#pragma unroll
        for (int i = 0; i < LM / 16; ++i)
#pragma unroll
            for (int j = 0; j < LN / 16; ++j) acc[i][j] += a[i] * b[j];
    }
}

// The TF32 variant: 8 warps as 2 (rows) x 4 (columns), each a (LM / 2) x (LN / 4) share of the
// tile in m16n8k8 tensor-core products; acc[mi][nj][r] is the fragment element at row
// mi * 16 + g + 8 (r / 2), column nj * 8 + 2 t + r % 2 of the warp's share (g = lane / 4,
// t = lane % 4), as PTX's mma.m16n8k8 lays out its accumulators.
__device__ __forceinline__ unsigned to_tf32(float x) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

__device__ __forceinline__ float4 tf32_quad(float4 v) {
    return make_float4(__uint_as_float(to_tf32(v.x)), __uint_as_float(to_tf32(v.y)), __uint_as_float(to_tf32(v.z)),
                       __uint_as_float(to_tf32(v.w)));
}

// The tiles hold TF32 values already (rounded as they are stored): their bits are the operands.
template <int LM, int LN>
__device__ __forceinline__ void mma_tile(const float (&left)[TILE_K][LM + PAD], const float (&right)[TILE_K][LN + PAD],
                                         float (&acc)[LM / 32][LN / 32][4], int warp, int lane) {
    const int g = lane / 4, t = lane % 4;
    const int row0 = (warp / 4) * (LM / 2), col0 = (warp % 4) * (LN / 4);
#pragma unroll
    for (int k = 0; k < TILE_K; k += 8) {
        unsigned a[LM / 32][4], b[LN / 32][2];
#pragma unroll
        for (int mi = 0; mi < LM / 32; ++mi) {
            const int r = row0 + mi * 16 + g;
            a[mi][0] = __float_as_uint(left[k + t][r]), a[mi][1] = __float_as_uint(left[k + t][r + 8]);
            a[mi][2] = __float_as_uint(left[k + t + 4][r]), a[mi][3] = __float_as_uint(left[k + t + 4][r + 8]);
        }
#pragma unroll
        for (int nj = 0; nj < LN / 32; ++nj) {
            const int c = col0 + nj * 8 + g;
            b[nj][0] = __float_as_uint(right[k + t][c]), b[nj][1] = __float_as_uint(right[k + t + 4][c]);
        }
#pragma unroll
        for (int mi = 0; mi < LM / 32; ++mi)
#pragma unroll
            for (int nj = 0; nj < LN / 32; ++nj) {
                float* d = acc[mi][nj];
                asm volatile(
                    "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                    "{%8, %9}, {%0, %1, %2, %3};"
                    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                    : "r"(a[mi][0]), "r"(a[mi][1]), "r"(a[mi][2]), "r"(a[mi][3]), "r"(b[nj][0]), "r"(b[nj][1]));
            }
    }
}

// One result of the tile, at its row position and column: written, or added atomically.
__device__ __forceinline__ void put(float* __restrict__ C, const long long* __restrict__ c_rows, long long position,
                                    long long end, int n, int N, float value) {
    if (position >= end || n >= N) return;
    const long long row = SCATTER_C ? c_rows[position] : position;
#if ACCUMULATE
    atomicAdd(C + row * N + n, value);
#else
    C[row * N + n] = value;
#endif
}

// Four neighbouring entries of a row-major matrix's row (row < 0: a padding row of zeros). With
// VEC4 one float4 load (K a multiple of 4, so a quad never straddles the row's end); else four.
__device__ __forceinline__ float4 load_quad(const float* __restrict__ m, long long row, int col, int cols) {
    if (row < 0 || col >= cols) return make_float4(0.f, 0.f, 0.f, 0.f);
    const float* p = m + row * cols + col;
    if (VEC4) return *reinterpret_cast<const float4*>(p);
    return make_float4(p[0], col + 1 < cols ? p[1] : 0.f, col + 2 < cols ? p[2] : 0.f, col + 3 < cols ? p[3] : 0.f);
}

// The same of bfloat16s, widened to float32 (exactly); with VEC4 one 8-byte load (K a multiple of
// 4 and the rows 16-byte aligned: every quad 8-byte aligned).
__device__ __forceinline__ float widen(bf16 x) { return __uint_as_float((unsigned)x << 16); }
__device__ __forceinline__ float4 load_quad(const bf16* __restrict__ m, long long row, int col, int cols) {
    if (row < 0 || col >= cols) return make_float4(0.f, 0.f, 0.f, 0.f);
    const bf16* p = m + row * cols + col;
    if (VEC4) {
        const uint2 v = *reinterpret_cast<const uint2*>(p);
        return make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u), __uint_as_float(v.y << 16),
                           __uint_as_float(v.y & 0xffff0000u));
    }
    return make_float4(widen(p[0]), col + 1 < cols ? widen(p[1]) : 0.f, col + 2 < cols ? widen(p[2]) : 0.f,
                       col + 3 < cols ? widen(p[3]) : 0.f);
}

#if !BF16
// The quads a thread stages per k-step: TILE_M x TILE_K of A and TILE_K x TILE_N of B.
#define A_QUADS (TILE_M * TILE_K / 4 / THREADS)
#define B_QUADS (TILE_K * TILE_N / 4 / THREADS)

// C[rows of the tile, n0 : n0 + TILE_N] of one tile; grid (tiles, ceil(N / TILE_N)). The next
// k-step's tiles are loaded into registers while the current one is multiplied (two shared buffers).
extern "C" __global__ void __launch_bounds__(THREADS, 2)  // two blocks per SM: at most 128 registers
GEMM_NAME(const float* __restrict__ A, const long long* __restrict__ a_rows, const float* __restrict__ B,
          float* __restrict__ C, const long long* __restrict__ c_rows, const int* __restrict__ tile_type,
          const long long* __restrict__ tile_begin, const long long* __restrict__ tile_end, int K, int N) {
    __shared__ __align__(16) float As[2][TILE_K][TILE_M + PAD];  // A's tile, k-major
    __shared__ __align__(16) float Bs[2][TILE_K][TILE_N + PAD];
    __shared__ long long a_row[TILE_M];
    const int tile = blockIdx.x, n0 = blockIdx.y * TILE_N;
    const long long begin = tile_begin[tile], end = tile_end[tile];
    if (begin >= end) return;  // an empty tile (the schedule may end with some)
    const float* Bt = B + (long long)tile_type[tile] * K * N;
#if !TENSOR_CORES
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#endif
    for (int m = threadIdx.x; m < TILE_M; m += THREADS) {
        const long long i = begin + m;
        a_row[m] = i < end ? (GATHER_A ? a_rows[i] : i) : -1;
    }
    __syncthreads();
    float4 a_quad[A_QUADS], b_quad[B_QUADS];
    // Quad q of a thread: A's row m, columns k0 + 4 kq ..; B's (k, n) likewise (see the stores).
    auto load = [&](int k0) {
#pragma unroll
        for (int q = 0; q < A_QUADS; ++q) {
            const int e = threadIdx.x + q * THREADS, m = e / (TILE_K / 4), kq = e % (TILE_K / 4);
            a_quad[q] = load_quad(A, a_row[m], k0 + 4 * kq, K);
        }
#pragma unroll
        for (int q = 0; q < B_QUADS; ++q) {
            const int e = threadIdx.x + q * THREADS;
            if (TRANSPOSE_B) {  // B[t]^T: row n of B[t] holds column n of the product's right side
                const int n = e / (TILE_K / 4), kq = e % (TILE_K / 4);
                b_quad[q] = load_quad(Bt, n0 + n < N ? n0 + n : -1, k0 + 4 * kq, K);
            } else {
                const int k = e / (TILE_N / 4), nq = e % (TILE_N / 4);
                b_quad[q] = load_quad(Bt, k0 + k < K ? k0 + k : -1, n0 + 4 * nq, N);
            }
        }
    };
    auto store = [&](int buffer) {
#if TENSOR_CORES  // rounded to TF32 once here, not by every warp that reads the element
#pragma unroll
        for (int q = 0; q < A_QUADS; ++q) a_quad[q] = tf32_quad(a_quad[q]);
#pragma unroll
        for (int q = 0; q < B_QUADS; ++q) b_quad[q] = tf32_quad(b_quad[q]);
#endif
#pragma unroll
        for (int q = 0; q < A_QUADS; ++q) {
            const int e = threadIdx.x + q * THREADS, m = e / (TILE_K / 4), kq = e % (TILE_K / 4);
            As[buffer][4 * kq][m] = a_quad[q].x, As[buffer][4 * kq + 1][m] = a_quad[q].y;
            As[buffer][4 * kq + 2][m] = a_quad[q].z, As[buffer][4 * kq + 3][m] = a_quad[q].w;
        }
#pragma unroll
        for (int q = 0; q < B_QUADS; ++q) {
            const int e = threadIdx.x + q * THREADS;
            if (TRANSPOSE_B) {
                const int n = e / (TILE_K / 4), kq = e % (TILE_K / 4);
                Bs[buffer][4 * kq][n] = b_quad[q].x, Bs[buffer][4 * kq + 1][n] = b_quad[q].y;
                Bs[buffer][4 * kq + 2][n] = b_quad[q].z, Bs[buffer][4 * kq + 3][n] = b_quad[q].w;
            } else {
                const int k = e / (TILE_N / 4), nq = e % (TILE_N / 4);
                *reinterpret_cast<float4*>(&Bs[buffer][k][4 * nq]) = b_quad[q];
            }
        }
    };
#if TENSOR_CORES
    float acc[TILE_M / 32][TILE_N / 32][4] = {};
#else
    float acc[MI][NJ] = {};
#endif
    load(0);
    store(0);
    __syncthreads();
    int buffer = 0;
    for (int k0 = 0; k0 < K; k0 += TILE_K) {
        const bool more = k0 + TILE_K < K;
        if (more) load(k0 + TILE_K);
#if TENSOR_CORES
        mma_tile<TILE_M, TILE_N>(As[buffer], Bs[buffer], acc, threadIdx.x / 32, threadIdx.x % 32);
#else
        accumulate_tile<TILE_M, TILE_N>(As[buffer], Bs[buffer], acc, tx, ty);
#endif
        // The other buffer was last read before the previous barrier: safe to fill now.
        if (more) store(buffer ^ 1);
        __syncthreads();
        buffer ^= 1;
    }
#if TENSOR_CORES
    const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
#pragma unroll
    for (int mi = 0; mi < TILE_M / 32; ++mi)
#pragma unroll
        for (int nj = 0; nj < TILE_N / 32; ++nj)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int m = (warp / 4) * (TILE_M / 2) + mi * 16 + g + 8 * (r / 2);
                const int n = n0 + (warp % 4) * (TILE_N / 4) + nj * 8 + 2 * t + r % 2;
                put(C, c_rows, begin + m, end, n, N, acc[mi][nj][r]);
            }
#else
#pragma unroll
    for (int i = 0; i < MI; ++i) {
        const long long position = begin + own_row(i, ty);
        if (position >= end) continue;
        const long long row = SCATTER_C ? c_rows[position] : position;
        float* out = C + row * N;
#pragma unroll
        for (int j = 0; j < NJ; j += 4) {
            const int n = n0 + own_row(j, tx);
            if (VEC4 && !ACCUMULATE && n < N) {
                *reinterpret_cast<float4*>(out + n) = make_float4(acc[i][j], acc[i][j + 1], acc[i][j + 2], acc[i][j + 3]);
                continue;
            }
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
                if (n + jj >= N) continue;
                if (ACCUMULATE) {
                    atomicAdd(out + n + jj, acc[i][j + jj]);
                } else {
                    out[n + jj] = acc[i][j + jj];
                }
            }
        }
    }
#endif
}

#else
// The bf16 variant (BF16): its own kernel body, on bf16 tensor cores.
// Each k-stage's tiles go from global to shared memory by cp.async (16-byte pieces; STAGES - 1
// stages in flight while one is multiplied, so a short k is one round trip), warps take their mma
// operands from shared memory by ldmatrix, and the fp32 results are rounded to bf16 once, staged
// in shared memory and written out a row's 16 bytes at a time. Without VEC4 (widths not multiples of 8, or rows not 16-byte
// aligned) the stages are filled by guarded 2-byte loads and the rows written entry by entry; the
// products are the same.
#define STAGE_K 32  // k per stage: two m16n8k16 steps
// Stages in shared memory: what four blocks of 64-column tiles, or two of 128-column ones, fit on
// an SM. The memory is dynamic (over the 48 KB a static array may take): the host passes
// codegen.GemmShape.shared_bytes(), and a launch with less stops at a trap.
#define STAGES (TILE_N == 64 ? 3 : 4)
// 8 warps as WARPS_M x WARPS_N, each a WARP_M x WARP_N share of the tile, in FRAG_M x FRAG_N
// tensor-core products of 16 x 8 (a share's columns come in pairs of 8: one ldmatrix.x4 of B).
#define WARPS_N (TILE_N >= TILE_M ? 4 : 2)
#define WARPS_M (THREADS / 32 / WARPS_N)
#define WARP_M (TILE_M / WARPS_M)
#define WARP_N (TILE_N / WARPS_N)
#define FRAG_M (WARP_M / 16)
#define FRAG_N (WARP_N / 8)
#if WARP_M % 16 || WARP_N % 16 || TILE_M * STAGE_K / 8 % THREADS || TILE_N * STAGE_K / 8 % THREADS
#error "the bf16 variant's warps take 16-row, 16-column pieces of the tile, its threads whole rounds of pieces"
#endif
// Shared rows are padded by 16 bytes: the 8 rows an ldmatrix reads (and a warp's fragment stores
// into the staged results) fall in distinct banks, and every row stays 16-byte aligned.
#define SKEW 8
#define A_STRIDE (STAGE_K + SKEW)  // A's stage: TILE_M rows of STAGE_K
#define B_ROWS (TRANSPOSE_B ? TILE_N : STAGE_K)  // B's stage as B[t] lays it out: n-major under TRANSPOSE_B
#define B_COLUMNS (TRANSPOSE_B ? STAGE_K : TILE_N)
#define B_STRIDE (B_COLUMNS + SKEW)
#define C_STRIDE (TILE_N + SKEW)  // the staged results: TILE_M rows of TILE_N
#define STAGE_SIZE (TILE_M * A_STRIDE + B_ROWS * B_STRIDE)
#define POOL (STAGES * STAGE_SIZE > TILE_M * C_STRIDE ? STAGES * STAGE_SIZE : TILE_M * C_STRIDE)

__device__ __forceinline__ unsigned shared_address(const void* p) {
    unsigned address;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(address) : "l"(p));
    return address;
}

// 16 bytes from global to shared memory, asynchronously; with bytes = 0 nothing is read and the 16
// bytes are zeros (a row past the tile's end, or columns past the matrix's).
__device__ __forceinline__ void copy_async(unsigned to, const void* from, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(to), "l"(from), "r"(bytes) : "memory");
}
__device__ __forceinline__ void commit_copies() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int PENDING>
__device__ __forceinline__ void wait_copies() {  // all but this thread's PENDING latest groups have landed
    asm volatile("cp.async.wait_group %0;" ::"n"(PENDING) : "memory");
}

// Four 8 x 8 bf16 matrices; lanes 8 i .. 8 i + 7 give the row addresses of matrix i. A lane gets
// row lane / 4, columns 2 (lane % 4) + {0, 1} of each (of its transpose with .trans).
__device__ __forceinline__ void load_matrices(unsigned (&r)[4], unsigned address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
}
__device__ __forceinline__ void load_matrices_transposed(unsigned (&r)[4], unsigned address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
}

// d += a (16 x 16, row-major fragments) b (16 x 8, column-major), bf16 in, fp32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two results rounded to the nearest bf16 (ties to even), the first in the low half (the lower
// address): cvt's first source goes to the high half.
__device__ __forceinline__ unsigned round_pair(float first, float second) {
    unsigned pair;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(pair) : "f"(second), "f"(first));
    return pair;
}

// Blocks an SM is to hold (it caps the registers): four of the 64-column tiles, whose short k
// leaves nothing to hide the reads behind but other blocks' products.
#define BF16_BLOCKS (TILE_N == 64 ? (VEC4 ? 4 : 3) : 2)

// C[rows of the tile, n0 : n0 + TILE_N] of one tile; grid (tiles, ceil(N / TILE_N)) as for the
// float32 variants.
extern "C" __global__ void __launch_bounds__(THREADS, BF16_BLOCKS)
GEMM_NAME(const bf16* __restrict__ A, const long long* __restrict__ a_rows, const bf16* __restrict__ B,
          bf16* __restrict__ C, const long long* __restrict__ c_rows, const int* __restrict__ tile_type,
          const long long* __restrict__ tile_begin, const long long* __restrict__ tile_end, int K, int N) {
    extern __shared__ __align__(16) bf16 pool[];  // STAGES x (A's stage, B's stage); then the staged results
    __shared__ long long a_row[TILE_M], c_row[TILE_M];  // -1: past the tile's end
    // Blocks start in the order of their linear id (x fastest): renumbered so that a tile's column
    // blocks start together, and all but the first read its rows of A from L2.
    const long long linear = (long long)blockIdx.y * gridDim.x + blockIdx.x;
    const int tile = (int)(linear / gridDim.y), n0 = (int)(linear % gridDim.y) * TILE_N;
    const long long begin = tile_begin[tile], end = tile_end[tile];
    if (begin >= end) return;  // an empty tile (the schedule may end with some)
    unsigned shared_bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(shared_bytes));
    if (shared_bytes < POOL * sizeof(bf16)) asm volatile("trap;");  // launched with too little
    const bf16* Bt = B + (long long)tile_type[tile] * K * N;
    for (int m = threadIdx.x; m < TILE_M; m += THREADS) {
        const long long i = begin + m;
        a_row[m] = i < end ? (GATHER_A ? a_rows[i] : i) : -1;
        c_row[m] = i < end ? (SCATTER_C ? c_rows[i] : i) : -1;
    }
    __syncthreads();

    // Stage s holds A[rows, k0 : k0 + STAGE_K] as [m][k] and B[t]'s matching piece as it is laid
    // out ([k][n], or [n][k] under TRANSPOSE_B); entries past K, N or the tile's end are zeros.
    auto fill = [&](int s, int k0) {
        bf16* As = pool + s * STAGE_SIZE;
        bf16* Bs = As + TILE_M * A_STRIDE;
#if VEC4
#pragma unroll
        for (int q = 0; q < TILE_M * STAGE_K / 8 / THREADS; ++q) {
            const int e = threadIdx.x + q * THREADS, m = e / (STAGE_K / 8), k = 8 * (e % (STAGE_K / 8));
            const bool inside = a_row[m] >= 0 && k0 + k < K;  // K a multiple of 8: a piece is all in or all out
            copy_async(shared_address(As + m * A_STRIDE + k), inside ? A + a_row[m] * K + k0 + k : A, inside ? 16 : 0);
        }
#pragma unroll
        for (int q = 0; q < TILE_N * STAGE_K / 8 / THREADS; ++q) {
            const int e = threadIdx.x + q * THREADS, r = e / (B_COLUMNS / 8), c = 8 * (e % (B_COLUMNS / 8));
            const bf16* from = TRANSPOSE_B ? Bt + (long long)(n0 + r) * K + k0 + c : Bt + (long long)(k0 + r) * N + n0 + c;
            const bool inside = TRANSPOSE_B ? n0 + r < N && k0 + c < K : k0 + r < K && n0 + c < N;
            copy_async(shared_address(Bs + r * B_STRIDE + c), inside ? from : B, inside ? 16 : 0);
        }
#else
#pragma unroll 4
        for (int e = threadIdx.x; e < TILE_M * STAGE_K; e += THREADS) {
            const int m = e / STAGE_K, k = e % STAGE_K;
            As[m * A_STRIDE + k] = a_row[m] >= 0 && k0 + k < K ? A[a_row[m] * K + k0 + k] : (bf16)0;
        }
#pragma unroll 4
        for (int e = threadIdx.x; e < TILE_N * STAGE_K; e += THREADS) {
            const int r = e / B_COLUMNS, c = e % B_COLUMNS;
            const bool inside = TRANSPOSE_B ? n0 + r < N && k0 + c < K : k0 + r < K && n0 + c < N;
            const long long at = TRANSPOSE_B ? (long long)(n0 + r) * K + k0 + c : (long long)(k0 + r) * N + n0 + c;
            Bs[r * B_STRIDE + c] = inside ? Bt[at] : (bf16)0;
        }
#endif
    };

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int warp_m = (warp / WARPS_N) * WARP_M, warp_n = (warp % WARPS_N) * WARP_N;
    float acc[FRAG_M][FRAG_N][4] = {};
    // acc[i][j][r]: the share's row 16 i + lane / 4 + 8 (r / 2), column 8 j + 2 (lane % 4) + r % 2.
    auto multiply = [&](int s) {
        const unsigned As = shared_address(pool + s * STAGE_SIZE), Bs = As + 2 * TILE_M * A_STRIDE;
#pragma unroll
        for (int k = 0; k < STAGE_K; k += 16) {
            unsigned a[FRAG_M][4], b[FRAG_N][2];
            // Matrices 0-3: rows 0-7 and 8-15 at k .. k + 7, then both at k + 8 .. k + 15: the
            // fragment registers a0-a3 of mma.m16n8k16.
#pragma unroll
            for (int i = 0; i < FRAG_M; ++i)
                load_matrices(a[i], As + 2 * ((warp_m + 16 * i + lane % 16) * A_STRIDE + k + 8 * (lane / 16)));
            // Per pair of 8-column blocks j, j + 1: matrices b0, b1 of j, then of j + 1, each 8 k x 8 n.
#pragma unroll
            for (int j = 0; j < FRAG_N; j += 2) {
                unsigned r[4];
#if TRANSPOSE_B  // [n][k]: a lane's pair of k is its row's, as ldmatrix gives it
                load_matrices(r, Bs + 2 * ((warp_n + 8 * j + lane % 8 + 8 * (lane / 16)) * B_STRIDE + k +
                                           8 * (lane / 8 % 2)));
#else  // [k][n]: transposed on the way, so that a lane holds two k of one column
                load_matrices_transposed(r, Bs + 2 * ((k + lane % 16) * B_STRIDE + warp_n + 8 * j + 8 * (lane / 16)));
#endif
                b[j][0] = r[0], b[j][1] = r[1], b[j + 1][0] = r[2], b[j + 1][1] = r[3];
            }
#pragma unroll
            for (int i = 0; i < FRAG_M; ++i)
#pragma unroll
                for (int j = 0; j < FRAG_N; ++j) mma_bf16(acc[i][j], a[i], b[j][0], b[j][1]);
        }
    };

    // One group of copies per k-stage, empty ones past the last, so that "all but the latest
    // STAGES - 2 have landed" always means "stage s has".
    const int stages = (K + STAGE_K - 1) / STAGE_K;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < stages) fill(s, s * STAGE_K);
        commit_copies();
    }
    for (int s = 0; s < stages; ++s) {
        wait_copies<STAGES - 2>();  // this thread's copies into stage s have landed
        __syncthreads();  // everyone's have, and everyone is done with stage s - 1, which is refilled now
        if (s + STAGES - 1 < stages) fill((s + STAGES - 1) % STAGES, (s + STAGES - 1) * STAGE_K);
        commit_copies();
        multiply(s % STAGES);
    }
    wait_copies<0>();  // none left in flight: the results reuse the stages' memory
    __syncthreads();  // and every warp is done reading them

    // The results rounded to bf16 once and staged as [m][n], then written out row by row.
#pragma unroll
    for (int i = 0; i < FRAG_M; ++i)
#pragma unroll
        for (int j = 0; j < FRAG_N; ++j) {
            const int m = warp_m + 16 * i + lane / 4, n = warp_n + 8 * j + 2 * (lane % 4);
            *reinterpret_cast<unsigned*>(pool + m * C_STRIDE + n) = round_pair(acc[i][j][0], acc[i][j][1]);
            *reinterpret_cast<unsigned*>(pool + (m + 8) * C_STRIDE + n) = round_pair(acc[i][j][2], acc[i][j][3]);
        }
    __syncthreads();
#if VEC4
#pragma unroll
    for (int q = 0; q < TILE_M * TILE_N / 8 / THREADS; ++q) {
        const int e = threadIdx.x + q * THREADS, m = e / (TILE_N / 8), n = 8 * (e % (TILE_N / 8));
        if (c_row[m] >= 0 && n0 + n < N)  // N a multiple of 8: a piece is all in or all out
            *reinterpret_cast<uint4*>(C + c_row[m] * N + n0 + n) = *reinterpret_cast<const uint4*>(pool + m * C_STRIDE + n);
    }
#else
#pragma unroll 4
    for (int e = threadIdx.x; e < TILE_M * TILE_N; e += THREADS) {
        const int m = e / TILE_N, n = e % TILE_N;
        if (c_row[m] >= 0 && n0 + n < N) C[c_row[m] * N + n0 + n] = pool[m * C_STRIDE + n];
    }
#endif
}
#endif  // BF16

// D[t][k0 : k0 + 64, n0 : n0 + 64] += A[rows of the tile]^T G[rows of the tile]; grid (tiles,
// ceil(N / 64), ceil(K / 64)). A has K columns, G and D[t] N. Always 64 x 64 output tiles. A tile
// (at most OUTER_ROWS positions) sums in registers and adds to D once: long tiles keep the atomics
// few, since every tile of a type adds into the same K x N entries. Its row ids are read into
// shared memory first, and the next TILE_K positions are loaded while the current ones multiply.
#ifndef OUTER_ROWS
#define OUTER_ROWS 512
#endif
#if OUTER_BF16
typedef bf16 outer_element;
#else
typedef float outer_element;
#endif
extern "C" __global__ void __launch_bounds__(THREADS)
OUTER_NAME(const outer_element* __restrict__ A, const long long* __restrict__ a_rows, const outer_element* __restrict__ G,
           const long long* __restrict__ g_rows, float* __restrict__ D, const int* __restrict__ tile_type,
           const long long* __restrict__ tile_begin, const long long* __restrict__ tile_end, int K, int N) {
    __shared__ __align__(16) float As[2][TILE_K][64 + PAD];  // TILE_K positions x 64 columns of A
    __shared__ __align__(16) float Gs[2][TILE_K][64 + PAD];
    __shared__ long long a_row[OUTER_ROWS], g_row[OUTER_ROWS];
    const int tile = blockIdx.x, n0 = blockIdx.y * 64, k0 = blockIdx.z * 64;
    const long long begin = tile_begin[tile], end = tile_end[tile];
    if (begin >= end) return;
    const int rows = (int)(end - begin);  // at most OUTER_ROWS: the host cuts the tiles so
    for (int p = threadIdx.x; p < rows; p += THREADS) {
        a_row[p] = GATHER_A ? a_rows[begin + p] : begin + p;
        g_row[p] = GATHER_G ? g_rows[begin + p] : begin + p;
    }
    __syncthreads();
    // Each thread stages one quad of A and one of G per step: position p, columns 4 q .. 4 q + 3.
    const int p = threadIdx.x / 16, q = threadIdx.x % 16;
    float4 a_quad, g_quad;
    auto load = [&](int p0) {
        const bool inside = p0 + p < rows;
        a_quad = load_quad(A, inside ? a_row[p0 + p] : -1, k0 + 4 * q, K);
        g_quad = load_quad(G, inside ? g_row[p0 + p] : -1, n0 + 4 * q, N);
    };
    auto store = [&](int buffer) {
        *reinterpret_cast<float4*>(&As[buffer][p][4 * q]) = a_quad;
        *reinterpret_cast<float4*>(&Gs[buffer][p][4 * q]) = g_quad;
    };
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float acc[4][4] = {};
    load(0);
    store(0);
    __syncthreads();
    int buffer = 0;
    for (int p0 = 0; p0 < rows; p0 += TILE_K) {
        const bool more = p0 + TILE_K < rows;
        if (more) load(p0 + TILE_K);
        accumulate_tile<64, 64>(As[buffer], Gs[buffer], acc, tx, ty);
        if (more) store(buffer ^ 1);  // last read before the previous barrier
        __syncthreads();
        buffer ^= 1;
    }
    float* Dt = D + (long long)tile_type[tile] * K * N;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int k = k0 + own_row(i, ty);
        if (k >= K) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int n = n0 + own_row(j, tx);
            if (n < N) atomicAdd(&Dt[(long long)k * N + n], acc[i][j]);
        }
    }
}
