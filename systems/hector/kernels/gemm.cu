// Hector's GEMM template (float32, exact: no tensor cores), specialized by the code generator
// (systems/hector/codegen.py) with #defines put before this text. As it stands it is the plain
// variant, and CI compiles it so for sm_90 like every kernel of the suite.
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

#define TILE_M 64
#define TILE_N 64
#define TILE_K 16
#define THREADS 256  // 16 x 16 threads, each a 4 x 4 block of the 64 x 64 output tile

// acc[i][j] += sum over the TILE_K steps k of left[k][ty + 16 i] * right[k][tx + 16 j]: each
// thread's 4 x 4 share of a 64 x 64 tile (rows and columns strided by 16: no bank conflicts).
__device__ __forceinline__ void accumulate_tile(const float (&left)[TILE_K][TILE_M + 1],
                                                const float (&right)[TILE_K][TILE_N + 1], float (&acc)[4][4], int tx,
                                                int ty) {
#pragma unroll
    for (int k = 0; k < TILE_K; ++k) {
        float a[4], b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) a[i] = left[k][ty + 16 * i];
#pragma unroll
        for (int j = 0; j < 4; ++j) b[j] = right[k][tx + 16 * j];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
    }
}

// C[rows of the tile, n0 : n0 + 64] of one tile; grid (tiles, ceil(N / 64)).
extern "C" __global__ void __launch_bounds__(THREADS)
GEMM_NAME(const float* __restrict__ A, const long long* __restrict__ a_rows, const float* __restrict__ B,
          float* __restrict__ C, const long long* __restrict__ c_rows, const int* __restrict__ tile_type,
          const long long* __restrict__ tile_begin, const long long* __restrict__ tile_end, int K, int N) {
    __shared__ float As[TILE_K][TILE_M + 1];  // A's tile, k-major (+1: no bank conflicts)
    __shared__ float Bs[TILE_K][TILE_N + 1];
    __shared__ long long a_row[TILE_M];
    const int tile = blockIdx.x, n0 = blockIdx.y * TILE_N;
    const long long begin = tile_begin[tile], end = tile_end[tile];
    const float* Bt = B + (long long)tile_type[tile] * K * N;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    if (threadIdx.x < TILE_M) {
        const long long i = begin + threadIdx.x;
        a_row[threadIdx.x] = i < end ? (GATHER_A ? a_rows[i] : i) : -1;
    }
    __syncthreads();
    float acc[4][4] = {};
    for (int k0 = 0; k0 < K; k0 += TILE_K) {
        for (int e = threadIdx.x; e < TILE_M * TILE_K; e += THREADS) {
            const int m = e / TILE_K, k = e % TILE_K;
            const long long r = a_row[m];
            As[k][m] = (r >= 0 && k0 + k < K) ? A[r * K + k0 + k] : 0.0f;
        }
        for (int e = threadIdx.x; e < TILE_K * TILE_N; e += THREADS) {
            // Neighbouring threads read neighbouring addresses: along n for B, along k for B^T.
            const int k = TRANSPOSE_B ? e % TILE_K : e / TILE_N;
            const int n = TRANSPOSE_B ? e / TILE_K : e % TILE_N;
            float b = 0.0f;
            if (k0 + k < K && n0 + n < N) {
                b = TRANSPOSE_B ? Bt[(long long)(n0 + n) * K + k0 + k] : Bt[(long long)(k0 + k) * N + n0 + n];
            }
            Bs[k][n] = b;
        }
        __syncthreads();
        accumulate_tile(As, Bs, acc, tx, ty);
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const long long position = begin + ty + 16 * i;
        if (position >= end) continue;
        const long long row = SCATTER_C ? c_rows[position] : position;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int n = n0 + tx + 16 * j;
            if (n >= N) continue;
            if (ACCUMULATE) {
                atomicAdd(&C[row * N + n], acc[i][j]);
            } else {
                C[row * N + n] = acc[i][j];
            }
        }
    }
}

// D[t][k0 : k0 + 64, n0 : n0 + 64] += A[rows of the tile]^T G[rows of the tile]; grid (tiles,
// ceil(N / 64), ceil(K / 64)). A has K columns, G and D[t] N.
extern "C" __global__ void __launch_bounds__(THREADS)
OUTER_NAME(const float* __restrict__ A, const long long* __restrict__ a_rows, const float* __restrict__ G,
           const long long* __restrict__ g_rows, float* __restrict__ D, const int* __restrict__ tile_type,
           const long long* __restrict__ tile_begin, const long long* __restrict__ tile_end, int K, int N) {
    __shared__ float As[TILE_K][TILE_M + 1];  // TILE_K positions x 64 columns of A
    __shared__ float Gs[TILE_K][TILE_N + 1];
    const int tile = blockIdx.x, n0 = blockIdx.y * TILE_N, k0 = blockIdx.z * TILE_M;
    const long long begin = tile_begin[tile], end = tile_end[tile];
    float* Dt = D + (long long)tile_type[tile] * K * N;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    float acc[4][4] = {};
    for (long long p0 = begin; p0 < end; p0 += TILE_K) {
        for (int e = threadIdx.x; e < TILE_K * TILE_M; e += THREADS) {
            const int p = e / TILE_M, c = e % TILE_M;
            const long long position = p0 + p;
            float a = 0.0f, g = 0.0f;
            if (position < end) {
                const long long ra = GATHER_A ? a_rows[position] : position;
                const long long rg = GATHER_G ? g_rows[position] : position;
                if (k0 + c < K) a = A[ra * K + k0 + c];
                if (n0 + c < N) g = G[rg * N + n0 + c];
            }
            As[p][c] = a;
            Gs[p][c] = g;
        }
        __syncthreads();
        accumulate_tile(As, Gs, acc, tx, ty);
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int k = k0 + ty + 16 * i;
        if (k >= K) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int n = n0 + tx + 16 * j;
            if (n < N) atomicAdd(&Dt[(long long)k * N + n], acc[i][j]);
        }
    }
}
