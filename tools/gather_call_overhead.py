"""Where a gather call's time goes besides reading rows: each path's per-call cost, on one GPU.

For every path of systems/pytorch_direct/dispatch.py, plus stock torch's bare ``index_select`` on
the alias (no bounds check) and the suite's kernel launched alone, one registered table and the
same indices already on the GPU; each path checked against the table first. Timed per call:

  wall_1row    host wall time of a call that gathers one row, to its end (pure per-call cost)
  wall_us      host wall time of a call of --rows rows, to its end
  gpu_us       CUDA-event time of the same call (what the GPU spent, launches included)

    python tools/gather_call_overhead.py [--table-gib 1] [--rows 262144] [--row-bytes 128 512 2048]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from harness import machine
from harness.errors import exit_on_user_error
from systems.pytorch_direct import UnifiedTensor, dispatch
from systems.pytorch_direct.ops import launch_gather

REPEAT, WARMUP = 30, 5


def wall_us(fn) -> float:
    times = []
    for i in range(WARMUP + REPEAT):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        if i >= WARMUP:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def gpu_us(fn) -> float:
    times = []
    for i in range(WARMUP + REPEAT):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        if i >= WARMUP:
            times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


@exit_on_user_error
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table-gib", type=float, default=1.0)
    parser.add_argument("--rows", type=int, default=262144)
    parser.add_argument("--row-bytes", type=int, nargs="+", default=[128, 512, 2048])
    args = parser.parse_args()
    machine.require_gpu(
        "tools/gather_call_overhead.py", "it times gathers on one", cupy_for="to compile its CUDA kernels"
    )
    host = torch.randint(0, 255, (int(args.table_gib * 2**30),), dtype=torch.uint8)
    print(f"{torch.cuda.get_device_name()}, {args.table_gib:g} GiB table, {args.rows} distinct random rows per call")
    print(f"{'row':>6} {'path':<14} {'wall_1row':>10} {'wall_us':>10} {'gpu_us':>10} {'GB/s':>7}")
    with UnifiedTensor(host) as unified:
        alias_bytes = unified.cuda_alias()
        for row_bytes in args.row_bytes:
            table = host.view(torch.float32).view(-1, row_bytes // 4)
            alias = alias_bytes.view(torch.float32).view(table.shape)
            idx = torch.randperm(table.shape[0], device="cuda")[: args.rows]
            one = idx[:1].clone()
            out = torch.empty((args.rows, table.shape[1]), device="cuda")
            paths = {p: (lambda i, p=p, a=alias: dispatch.gather_rows(p, table, a, i)) for p in dispatch.PATHS}
            paths["bare_torch"] = lambda i, a=alias: torch.index_select(a, 0, i)
            paths["kernel_alone"] = lambda i: (launch_gather(table, i, out[: i.shape[0]], check=False), out)[1]
            expected = table[idx[:4096].cpu()]
            for name, fn in paths.items():
                got = fn(idx)
                if not torch.equal(got[:4096].cpu().view(torch.int32), expected.view(torch.int32)):  # bytes: NaNs
                    raise RuntimeError(f"{name} returned wrong rows")
                w1, w, g = wall_us(lambda fn=fn: fn(one)), wall_us(lambda fn=fn: fn(idx)), gpu_us(lambda fn=fn: fn(idx))
                rate = args.rows * row_bytes / (w * 1e-6) / 1e9
                print(f"{row_bytes:>6} {name:<14} {w1:>10.1f} {w:>10.1f} {g:>10.1f} {rate:>7.1f}")
        del paths, alias, alias_bytes  # views of the registered memory go before close()


if __name__ == "__main__":
    main()
