"""The measured sweeps of the feature_gather topic, one function per part (see __init__)."""

from __future__ import annotations

import os

import torch

from harness.progress import progress
from harness.timing import measure
from systems.pytorch_direct import dispatch
from systems.pytorch_direct.ops import gather
from workloads.feature_gather import variants, wholegraph
from workloads.feature_gather.tables import DTYPES, HostTable, Popularity, mib, uniform_rows, window_rows
from workloads.feature_gather.variants import Batch


def dgl_skip_reason(device: str) -> str:
    """Why DGL's pinned gather (gather_pinned_tensor_rows) was not measured in this run."""
    try:
        import dgl  # noqa: F401
    except Exception as err:  # DGL's import fails in many ways on a torch it was not built for
        return f"dgl not importable ({type(err).__name__}: {str(err).splitlines()[0][:160]})"
    if device != "cuda":
        return "no GPU"
    return "dgl imports, but the suite has no DGL variant yet (DGL's PyPI wheels are CPU-only)"


class Sweep:
    """Shared state of one part: timing settings, the writer, index generators, the host table."""

    def __init__(self, writer, host: HostTable, *, repeat: int, warmup: int, device: str, seed: int = 0):
        self.writer, self.host, self.repeat, self.warmup, self.device = writer, host, repeat, warmup, device
        gen_device = "cuda" if device == "cuda" else "cpu"
        self.generator = torch.Generator(device=gen_device).manual_seed(seed)
        self.threads = len(os.sched_getaffinity(0))

    def batch(self, table, rows_on_gen_device: torch.Tensor, **extra) -> Batch:
        idx = rows_on_gen_device.to("cpu")
        if self.device == "cuda":
            idx = idx.pin_memory()
        return Batch(table=table, idx=idx, device=self.device, alias=self.host.cuda_view(table), **extra)

    def run_with_threads(self, variant: str, batch: Batch, config: dict) -> float:
        """:meth:`run`, with every CPU thread for the CPU baselines (recorded in the config)."""
        if variant in variants.CPU_BASELINES:
            return self.run(variant, batch, config | {"threads": self.threads}, threads=self.threads)
        return self.run(variant, batch, config)

    def run(self, variant: str, batch: Batch, config: dict, *, pcie_bytes: int | None = None, **options) -> float:
        """Check, then time one variant on one batch; returns its median bandwidth (GB/s)."""
        fn = variants.make(variant, batch, **options)
        variants.check(fn, batch, variant)
        clock = "cuda" if variant in variants.KERNEL_ONLY else "cpu"
        m = measure(fn, device=clock, repeat=self.repeat, warmup=self.warmup)
        role = variants.role(variant)
        full = {"device": self.device, "batch_rows": batch.idx.shape[0], **config}
        if variant == "cpu_gather_pipelined":
            full["chunk_rows"] = batch.chunk_rows
        if variant == "default":
            full["path"] = dispatch.choose_for(batch.table).path
        self.writer.add_measurement(m, role=role, variant=variant, config=full, bytes_moved=batch.bytes)
        crossed = batch.bytes if pcie_bytes is None else pcie_bytes
        if self.device == "cuda" and variant != "all_in_gpu":
            for rep in range(len(m.seconds)):
                self.writer.add(
                    role=role,
                    variant=variant,
                    config=full,
                    metric="pcie_bytes",
                    value=float(crossed),
                    unit="B",
                    repetition=rep,
                )
        return batch.bytes / m.median / 1e9


def wholegraph_state(device: str) -> tuple[bool, str]:
    """Whether WholeGraph is measured in this run, and what the provenance records: its version,
    or why it is not measured."""
    if device != "cuda":
        return False, "not measured: no GPU"
    reason = wholegraph.available()
    if reason is not None:
        return False, f"not measured: {reason}"
    return True, f"pylibwholegraph {wholegraph.version()}, host-mapped 'continuous' table in location 'cpu'"


def _run_wholegraph(sweep: Sweep, table: torch.Tensor, runs: list[tuple[Batch, dict]]) -> str | None:
    """WholeGraph on each (batch, config) of one table, from one copy of it in WholeGraph's
    host-mapped memory (made outside timing, freed after). A table WholeGraph cannot hold (its
    copy doubles the host memory) is left out, not the whole part: returns why, or None."""
    try:
        copy = wholegraph.WholeGraphTable(table)
    except RuntimeError as err:
        return f"{table.numel() * table.element_size()} B table left out: {err}"
    with copy:
        for batch, config in runs:
            sweep.run("wholegraph", batch, config, wholegraph_table=copy)
    return None


def _table_config(table: torch.Tensor, dtype: str) -> dict:
    row_bytes = table.shape[1] * table.element_size()
    return {"dtype": dtype, "dim": table.shape[1], "row_bytes": row_bytes, "table_bytes": table.shape[0] * row_bytes}


def row_sizes(params, writer, *, shared, repeat, warmup, device, **_) -> dict:
    host = HostTable(mib(params["table_mib"]), device)
    sweep = Sweep(writer, host, repeat=repeat, warmup=warmup, device=device)
    batch = None  # a sweep with no cases still reaches the del below
    gpu_copy = host.buffer.to("cuda") if device == "cuda" else None
    cases = [(dtype, dim) for dtype in params["dtypes"] for dim in params["dims"]]
    names = (
        "pageable",
        *variants.CPU_BASELINES,
        *variants.STOCK_TORCH,
        "naive",
        "aligned",
        "vectorized",
        "vectorized_kernel",
        "sorted",
        "default",
        "all_in_gpu",
    )
    measure_wholegraph, wholegraph_note = wholegraph_state(device)
    for dtype, dim in progress(cases, desc="row_sizes"):
        table = host.view(mib(params["table_mib"]), dtype, dim)
        config = _table_config(table, dtype) | {"distribution": "uniform"}
        rows = uniform_rows(table.shape[0], min(shared["batch_rows"], table.shape[0]), sweep.generator)
        extra = {}
        if gpu_copy is not None:
            extra["gpu_table"] = gpu_copy[: table.numel() * table.element_size()].view(DTYPES[dtype]).view(table.shape)
        batch = sweep.batch(table, rows, **extra)
        for variant in names if device == "cuda" else ("cpu_gather",):
            sweep.run_with_threads(variant, batch, config)
        if measure_wholegraph and (skipped := _run_wholegraph(sweep, table, [(batch, config)])):
            wholegraph_note += f"; {skipped}"
    del batch  # it holds a CUDA view of the pinned table, which must go before the table is unpinned
    host.close()
    return {"dgl": dgl_skip_reason(device), "wholegraph": wholegraph_note, "cpu_threads": sweep.threads}


def cpu_threads(params, writer, *, shared, repeat, warmup, device, **_) -> dict:
    host = HostTable(mib(params["table_mib"]), device)
    sweep = Sweep(writer, host, repeat=repeat, warmup=warmup, device=device, seed=1)
    batch = None  # a sweep with no cases still reaches the del below
    cases = [(rb, t) for rb in params["row_bytes"] for t in params["threads"] if t <= sweep.threads]
    for row_bytes, threads in progress(cases, desc="cpu_threads"):
        table = host.view(mib(params["table_mib"]), "fp32", row_bytes // 4)
        rows = uniform_rows(table.shape[0], min(shared["batch_rows"], table.shape[0]), sweep.generator)
        config = _table_config(table, "fp32") | {"distribution": "uniform", "threads": threads}
        batch = sweep.batch(table, rows)
        for variant in variants.CPU_BASELINES if device == "cuda" else ("cpu_gather",):
            sweep.run(variant, batch, config, threads=threads)
    del batch
    host.close()
    return {"usable_cpus": sweep.threads}


def table_sizes(params, writer, *, shared, repeat, warmup, device, **_) -> dict:
    """The ablation: each zero-copy step and the translation-bound fixes, by row and table size,
    for uniform and Zipf-skewed rows; the split fraction comes from the same run's rates."""
    host = HostTable(mib(max(params["table_mib"])), device)
    sweep = Sweep(writer, host, repeat=repeat, warmup=warmup, device=device, seed=2)
    batch = None  # a sweep with no cases still reaches the del below
    exponent = shared["zipf_exponent"]
    cases = [(rb, t) for rb in params["row_bytes"] for t in params["table_mib"]]
    measure_wholegraph, wholegraph_note = wholegraph_state(device)
    for row_bytes, table_mib in progress(cases, desc="table_sizes"):
        table = host.view(mib(table_mib), "fp32", row_bytes // 4)
        n = min(shared["batch_rows"], table.shape[0])
        base = _table_config(table, "fp32")
        # Uniform rows.
        batch = sweep.batch(table, uniform_rows(table.shape[0], n, sweep.generator))
        config = base | {"distribution": "uniform"}
        rates = _ablation(sweep, batch, config)
        _split(sweep, batch, config, rates)
        wholegraph_runs = [(batch, config)]
        # Zipf-skewed rows, popular rows scattered (random ids) or stored first (relabelled ids).
        popularity = Popularity(table.shape[0], exponent, sweep.generator)
        ranks = popularity.sample_ranks(n)
        cached_rows = int(table.shape[0] * shared["cache_fraction"])
        for layout in ("scattered", "hot_first"):
            rows = popularity.rows(ranks, layout)
            batch = sweep.batch(table, rows)
            config = base | {"distribution": f"zipf{exponent:g}" + ("" if layout == "scattered" else "-hot_first")}
            rates = _ablation(sweep, batch, config)
            _split(sweep, batch, config, rates)
            wholegraph_runs.append((batch, config))
            hot = popularity.hottest_rows(cached_rows, layout)
            batch.slots = torch.full((table.shape[0],), -1, dtype=torch.int32, device="cuda")
            batch.slots[hot] = torch.arange(cached_rows, dtype=torch.int32, device="cuda")
            batch.cache = gather(table, hot)  # filled by a zero-copy gather: fast for GiB-sized caches
            misses = int((batch.slots[rows] < 0).sum())
            sweep.run(
                "hot_cache", batch, config | {"cache_bytes": cached_rows * row_bytes}, pcie_bytes=misses * row_bytes
            )
            batch.slots = batch.cache = None
        # One copy of the table serves the uniform and the skewed batches.
        if measure_wholegraph and (skipped := _run_wholegraph(sweep, table, wholegraph_runs)):
            wholegraph_note += f"; {skipped}"
        del popularity, wholegraph_runs
    del batch
    host.close()
    return {
        "zipf_exponent": exponent,
        "cache_fraction": shared["cache_fraction"],
        "cpu_threads": sweep.threads,
        "wholegraph": wholegraph_note,
    }


def _ablation(sweep: Sweep, batch: Batch, config: dict) -> dict[str, float]:
    """Each zero-copy step, stock torch on the alias and both CPU baselines on one batch: their rates."""
    names = ("naive", "vectorized", "sorted", "default", *variants.STOCK_TORCH, *variants.CPU_BASELINES)
    return {v: sweep.run_with_threads(v, batch, config) for v in names}


def _split(sweep: Sweep, batch: Batch, config: dict, rates: dict) -> None:
    """CPU and GPU gather one batch together, in proportion to their rates measured just before."""
    cpu, gpu = rates["cpu_gather"], rates["sorted"]
    fraction = round(cpu / (cpu + gpu), 3)
    sweep.run(
        "split",
        batch,
        config | {"threads": sweep.threads, "split_fraction": fraction},
        threads=sweep.threads,
        split_fraction=fraction,
    )


def batch_sizes(params, writer, *, shared, repeat, warmup, device, **_) -> dict:
    host = HostTable(mib(params["table_mib"]), device)
    sweep = Sweep(writer, host, repeat=repeat, warmup=warmup, device=device, seed=3)
    batch = None  # a sweep with no cases still reaches the del below
    gpu_copy = host.buffer.to("cuda")
    table = host.view(mib(params["table_mib"]), "fp32", params["row_bytes"] // 4)
    gpu_table = gpu_copy[: table.numel() * 4].view(torch.float32).view(table.shape)
    base = _table_config(table, "fp32") | {"distribution": "uniform"}
    for n in progress(params["batch_rows"], desc="batch_sizes"):
        batch = sweep.batch(
            table, uniform_rows(table.shape[0], min(n, table.shape[0]), sweep.generator), gpu_table=gpu_table
        )
        for variant in (
            "pageable",
            *variants.CPU_BASELINES,
            *variants.STOCK_TORCH,
            "vectorized",
            "sorted",
            "default",
            "all_in_gpu",
        ):
            sweep.run_with_threads(variant, batch, base)
    del gpu_copy, batch
    host.close()
    return {"cpu_threads": sweep.threads}


def thread_cap(params, writer, *, shared, repeat, warmup, device, **_) -> dict:
    host = HostTable(mib(params["table_mib"]), device)
    sweep = Sweep(writer, host, repeat=repeat, warmup=warmup, device=device, seed=4)
    batch = None  # a sweep with no cases still reaches the del below
    cases = [(rb, cap) for rb in params["row_bytes"] for cap in params["max_threads"]]
    for row_bytes, cap in progress(cases, desc="thread_cap"):
        table = host.view(mib(params["table_mib"]), "fp32", row_bytes // 4)
        batch = sweep.batch(
            table, uniform_rows(table.shape[0], min(shared["batch_rows"], table.shape[0]), sweep.generator)
        )
        config = _table_config(table, "fp32") | {"distribution": "uniform"}
        sweep.run("vectorized", batch, config | {"max_threads": cap}, max_threads=cap)
        if cap == params["max_threads"][0]:  # stock torch has no thread cap: once per row size
            sweep.run("torch_uva", batch, config)
    del batch
    host.close()
    return {}


def locality(params, writer, *, shared, repeat, warmup, device, **_) -> dict:
    """Random reads of the same number of bytes, from windows of growing size spread over a large
    table: if the rate depends on the window size, address translation (not PCIe) bounds it."""
    host = HostTable(mib(params["table_mib"]), device)
    sweep = Sweep(writer, host, repeat=repeat, warmup=warmup, device=device, seed=5)
    batch = None  # a sweep with no cases still reaches the del below
    union = mib(params["union_mib"])
    cases = [(rb, w) for rb in params["row_bytes"] for w in params["window_kib"]]
    for row_bytes, window_kib in progress(cases, desc="locality"):
        table = host.view(mib(params["table_mib"]), "fp32", row_bytes // 4)
        window = window_kib * 1024
        windows = union // window
        n = min(shared["batch_rows"], union // row_bytes)
        rows = window_rows(table.shape[0], row_bytes, window, windows, n, sweep.generator)
        config = _table_config(table, "fp32") | {"distribution": "windows", "window_bytes": window, "windows": windows}
        batch = sweep.batch(table, rows)
        for variant in ("vectorized", *variants.STOCK_TORCH):
            sweep.run(variant, batch, config)
    del batch
    host.close()
    return {"union_bytes": union}
