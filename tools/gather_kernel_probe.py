"""Why does the suite's gather kernel trail stock torch's index_select on the CUDA alias?

One process, one registered table, the same 262,144 distinct random rows for every kernel; each
kernel's output checked against the host table before it is timed (CUDA events, 3 warm-ups, 10
timed launches, median). Kernels, each a hypothesis:

  suite        systems/pytorch_direct gather, vectorized (a warp per row, grid-stride, 16 B words)
  read_rows    the ceilings' bare read kernel (same shape, no bounds check or aligned window)
  one_pass     the suite kernel with one row per warp and a grid covering every row (no loop)
  packed       rows packed into lane groups (a 128 B row takes 8 lanes, so a warp reads 4 rows),
               each lane loading all its words into registers before storing any
  flat         one thread per 16-byte word of the output, a grid covering all of it (torch's
               index_select shape, with 16-byte instead of element-sized loads)
  torch        stock torch.index_select on the fp32 alias
suite_plain16 the suite's kernel without the aligned window (16 B words; rows already on lines)
and every kernel again on the same rows sorted (the read only, no scatter back), plus the suite
kernel capped at 16,384 and 4,096 threads (fewer rows in flight: a narrower address window).

    python tools/gather_kernel_probe.py [--table-gib 4] [--rows 262144] [--row-bytes 128 512 2048]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch

from harness import machine
from harness.errors import exit_on_user_error
from systems import nvrtc
from systems.pytorch_direct import UnifiedTensor
from systems.pytorch_direct.ops import KERNEL_SOURCE as GATHER_SOURCE
from systems.pytorch_direct.ops import launch_gather
from systems.zero_copy.ops import launch_read_rows

SOURCE = r"""
typedef unsigned long long u64;

extern "C" __global__ void one_pass(const uint4* __restrict__ table, const long long* __restrict__ idx,
                                    long long n, long long words, uint4* __restrict__ out) {
    const long long i = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (i >= n) return;
    const uint4* src = table + idx[i] * words;
    uint4* dst = out + i * words;
    for (long long w = lane; w < words; w += 32) dst[w] = src[w];
}

// Lane groups of `group` lanes (a power of two <= 32) per row; up to 8 words per lane in registers.
extern "C" __global__ void packed(const uint4* __restrict__ table, const long long* __restrict__ idx,
                                  long long n, long long words, int group, uint4* __restrict__ out) {
    const int lane = threadIdx.x & 31;
    const int sub = lane % group;
    const long long rows_per_warp = 32 / group;
    const long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
    const long long num_warps = (gridDim.x * (long long)blockDim.x) >> 5;
    for (long long i = warp * rows_per_warp + lane / group; i < n; i += num_warps * rows_per_warp) {
        const uint4* src = table + idx[i] * words;
        uint4* dst = out + i * words;
        uint4 r[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const long long w = sub + (long long)k * group;
            if (w < words) r[k] = src[w];
        }
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const long long w = sub + (long long)k * group;
            if (w < words) dst[w] = r[k];
        }
    }
}

extern "C" __global__ void flat(const uint4* __restrict__ table, const long long* __restrict__ idx,
                                long long n, long long words, uint4* __restrict__ out) {
    const long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (t >= n * words) return;
    const long long i = t / words, w = t - i * words;
    out[t] = table[idx[i] * words + w];
}
"""


def timed(fn, repeat=10, warmup=3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeat)]
    for start, stop in events:
        start.record()
        fn()
        stop.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(stop) / 1e3 for start, stop in events)


@exit_on_user_error
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table-gib", type=float, nargs="+", default=[4.0])
    parser.add_argument("--rows", type=int, default=262_144)
    parser.add_argument("--row-bytes", type=int, nargs="+", default=[128, 512, 2048])
    args = parser.parse_args()
    machine.require_gpu(
        "tools/gather_kernel_probe.py", "it times CUDA kernels on one", cupy_for="to compile its CUDA kernels"
    )

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "probe.cu"
        path.write_text(SOURCE)
        module = nvrtc.load_module(path)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{'table':>6} {'row':>5} {'kernel':>14} {'GB/s':>7}")
    for table_gib in args.table_gib:
        nbytes = int(table_gib * 2**30)
        host = torch.randint(0, 256, (nbytes,), dtype=torch.uint8)
        unified = UnifiedTensor(host)
        alias = unified.cuda_alias()
        for row_bytes in args.row_bytes:
            words = row_bytes // 16
            rows = nbytes // row_bytes
            table = host[: rows * row_bytes].view(rows, row_bytes)
            table_f32 = alias[: rows * row_bytes].view(torch.float32).view(rows, row_bytes // 4)
            idx = torch.randperm(rows, device="cuda")[: args.rows]
            idx_sorted, order = torch.sort(idx)
            expected = table[idx.cpu()].cuda()
            out = torch.empty((args.rows, row_bytes), dtype=torch.uint8, device="cuda")
            table_ptr = nvrtc.device_pointer_of_pinned(table)
            n = idx.shape[0]
            group = min(32, words)
            bad_pos = torch.full((1,), n, dtype=torch.int64, device="cuda")

            def raw(name, grid, extra=()):
                return lambda: nvrtc.launch(
                    module,
                    name,
                    grid=(grid,),
                    block=(256,),
                    args=(
                        np.uint64(table_ptr),
                        np.uint64(idx.data_ptr()),
                        np.int64(n),
                        np.int64(words),
                        *extra,
                        np.uint64(out.data_ptr()),
                    ),
                )

            plain16 = "gather_plain_w16_i64"
            suite_module = nvrtc.load_module(GATHER_SOURCE)
            kernels = {
                "suite": lambda: launch_gather(table, idx, out, kernel="vectorized", check=False),
                "suite_plain16": lambda: nvrtc.launch(
                    suite_module,
                    plain16,
                    grid=(sms * 8,),
                    block=(256,),
                    args=(
                        np.uint64(table_ptr),
                        np.int64(rows),
                        np.uint64(idx.data_ptr()),
                        np.int64(n),
                        np.int64(row_bytes),
                        np.uint64(0),  # slots
                        np.uint64(0),  # cache
                        np.int64(0),  # cache rows
                        np.uint64(out.data_ptr()),
                        np.uint64(bad_pos.data_ptr()),
                    ),
                ),
                "read_rows": lambda: launch_read_rows(table, idx, out),
                "one_pass": raw("one_pass", -(-n // 8)),
                "packed": raw("packed", min(-(-n // (8 * (32 // group))), sms * 8), (np.int32(group),)),
                "flat": raw("flat", -(-(n * words) // 256)),
                "torch": lambda: torch.index_select(table_f32, 0, idx, out=out.view(torch.float32).view(n, -1)),
            }
            for name, fn in kernels.items():
                out.fill_(0)
                fn()
                torch.cuda.synchronize()
                if not torch.equal(out, expected):
                    print(f"{table_gib:>5g}G {row_bytes:>5} {name:>14}   WRONG ROWS")
                    continue
                seconds = timed(fn)
                print(f"{table_gib:>5g}G {row_bytes:>5} {name:>14} {n * row_bytes / seconds / 1e9:7.1f}")
            # The same kernels reading the rows in ascending order (the gather only: no scatter back).
            idx_in_order = idx
            idx = idx_sorted
            expected = table[idx.cpu()].cuda()
            kernels["suite_cap16k"] = lambda: launch_gather(
                table, idx, out, kernel="vectorized", check=False, max_threads=16384
            )
            kernels["suite_cap4k"] = lambda: launch_gather(
                table, idx, out, kernel="vectorized", check=False, max_threads=4096
            )
            for name, fn in kernels.items():
                out.fill_(0)
                fn()
                torch.cuda.synchronize()
                if not torch.equal(out, expected):
                    print(f"{table_gib:>5g}G {row_bytes:>5} {name + '/sorted':>14}   WRONG ROWS")
                    continue
                seconds = timed(fn)
                print(f"{table_gib:>5g}G {row_bytes:>5} {name + '/sorted':>14} {n * row_bytes / seconds / 1e9:7.1f}")
            idx = idx_in_order
            table_f32 = None  # a view of the alias: it must go before the table is unregistered
        del alias
        unified.close()


if __name__ == "__main__":
    main()
