"""The measured sweeps of the feature_gather topic, one function per part (see __init__).

Each part measures the gather variants its config names (``variants``: a list, or ``all``)
through :class:`~workloads.feature_gather.sweep.Sweep`; the variants themselves are entries of
systems/pytorch_direct/gather_variants.
"""

from __future__ import annotations

import torch

from harness.errors import UserError
from harness.progress import progress
from workloads.feature_gather.sweep import Sweep
from workloads.feature_gather.tables import HostTable, Popularity, mib, uniform_rows, window_rows


def dgl_skip_reason(device: str) -> str:
    """Why DGL's pinned gather (gather_pinned_tensor_rows) was not measured in this run."""
    try:
        import dgl  # noqa: F401
    except Exception as err:  # DGL's import fails in many ways on a torch it was not built for
        return f"dgl not importable ({type(err).__name__}: {str(err).splitlines()[0][:160]})"
    if device != "cuda":
        return "no GPU"
    return "dgl imports, but the suite has no DGL variant yet (DGL's PyPI wheels are CPU-only)"


def _table_config(table: torch.Tensor, dtype: str) -> dict:
    row_bytes = table.shape[1] * table.element_size()
    return {"dtype": dtype, "dim": table.shape[1], "row_bytes": row_bytes, "table_bytes": table.shape[0] * row_bytes}


def _sweep(part: str, params, writer, host: HostTable, *, repeat, warmup, device, seed, **kwargs) -> Sweep:
    return Sweep(
        part, params["variants"], writer, host, repeat=repeat, warmup=warmup, device=device, seed=seed, **kwargs
    )


def row_sizes(params, writer, *, shared, repeat, warmup, device, **_) -> dict:
    host = HostTable(mib(params["table_mib"]), device)
    sweep = _sweep("row_sizes", params, writer, host, repeat=repeat, warmup=warmup, device=device, seed=0)
    batch = None  # a sweep with no cases still reaches the del below
    cases = [(dtype, dim) for dtype in params["dtypes"] for dim in params["dims"]]
    for dtype, dim in progress(cases, desc="row_sizes"):
        table = host.view(mib(params["table_mib"]), dtype, dim)
        config = _table_config(table, dtype) | {"distribution": "uniform"}
        rows = uniform_rows(table.shape[0], min(shared["batch_rows"], table.shape[0]), sweep.generator)
        batch = sweep.batch(table, rows)
        sweep.run_batch(batch, config)
        sweep.run_table_copies(table, [(batch, config)])
    del batch  # it holds a CUDA view of the pinned table, which must go before the table is unpinned
    sweep.close()
    return {"dgl": dgl_skip_reason(device), **sweep.notes()}


def _gathers_on_cpu_threads(entry) -> str | None:
    return None if entry.cpu_threads else f"{entry.name} gathers on no CPU threads, which part cpu_threads sweeps"


def cpu_threads(params, writer, *, shared, repeat, warmup, device, **_) -> dict:
    host = HostTable(mib(params["table_mib"]), device)
    sweep = _sweep(
        "cpu_threads",
        params,
        writer,
        host,
        repeat=repeat,
        warmup=warmup,
        device=device,
        seed=1,
        accepts=_gathers_on_cpu_threads,
    )
    batch = None  # a sweep with no cases still reaches the del below
    # More threads than this process may run on would time the scheduler, not the gather: left out,
    # and said so (in the record, or in one line where nothing is left).
    beyond = [t for t in params["threads"] if t > sweep.threads]
    if beyond and len(beyond) == len(params["threads"]):
        sweep.close()
        raise UserError(f"cpu_threads: threads {beyond} are all more than the {sweep.threads} usable CPUs here")
    cases = [(rb, t) for rb in params["row_bytes"] for t in params["threads"] if t <= sweep.threads]
    for row_bytes, threads in progress(cases, desc="cpu_threads"):
        table = host.view(mib(params["table_mib"]), "fp32", row_bytes // 4)
        rows = uniform_rows(table.shape[0], min(shared["batch_rows"], table.shape[0]), sweep.generator)
        config = _table_config(table, "fp32") | {"distribution": "uniform"}
        batch = sweep.batch(table, rows)
        sweep.run_batch(batch, config, threads=threads)
        sweep.run_table_copies(table, [(batch, config)], threads=threads)
    del batch
    sweep.close()
    beyond_note = {"threads_left_out": {str(t): f"more than the {sweep.threads} usable CPUs" for t in beyond}}
    return {"usable_cpus": sweep.threads, **sweep.notes(), **(beyond_note if beyond else {})}


def table_sizes(params, writer, *, shared, repeat, warmup, device, **_) -> dict:
    """The ablation: each zero-copy step and the translation-bound fixes, by row and table size,
    for uniform and Zipf-skewed rows; a variant that splits a batch between CPU and GPU takes
    its shares from the rates measured just before on the same batch."""
    host = HostTable(mib(max(params["table_mib"])), device)
    sweep = _sweep(
        "table_sizes", params, writer, host, repeat=repeat, warmup=warmup, device=device, seed=2, hot_rows=True
    )
    batch = None  # a sweep with no cases still reaches the del below
    exponent = shared["zipf_exponent"]
    cases = [(rb, t) for rb in params["row_bytes"] for t in params["table_mib"]]
    for row_bytes, table_mib in progress(cases, desc="table_sizes"):
        table = host.view(mib(table_mib), "fp32", row_bytes // 4)
        n = min(shared["batch_rows"], table.shape[0])
        base = _table_config(table, "fp32")
        # Uniform rows.
        batch = sweep.batch(table, uniform_rows(table.shape[0], n, sweep.generator))
        config = base | {"distribution": "uniform"}
        sweep.run_batch(batch, config)
        runs = [(batch, config)]
        # Zipf-skewed rows, popular rows scattered (random ids) or stored first (relabelled ids).
        popularity = Popularity(table.shape[0], exponent, sweep.generator)
        ranks = popularity.sample_ranks(n)
        cached_rows = int(table.shape[0] * shared["cache_fraction"])
        for layout in ("scattered", "hot_first"):
            batch = sweep.batch(table, popularity.rows(ranks, layout))
            config = base | {"distribution": f"zipf{exponent:g}" + ("" if layout == "scattered" else "-hot_first")}
            sweep.run_batch(batch, config)
            runs.append((batch, config))
            sweep.run_hot(batch, config, popularity.hottest_rows(cached_rows, layout))
        # One copy of the table serves the uniform and the skewed batches.
        sweep.run_table_copies(table, runs)
        del popularity, runs
    del batch
    sweep.close()
    return {"zipf_exponent": exponent, "cache_fraction": shared["cache_fraction"], **sweep.notes()}


def batch_sizes(params, writer, *, shared, repeat, warmup, device, **_) -> dict:
    host = HostTable(mib(params["table_mib"]), device)
    sweep = _sweep("batch_sizes", params, writer, host, repeat=repeat, warmup=warmup, device=device, seed=3)
    batch = None  # a sweep with no cases still reaches the del below
    table = host.view(mib(params["table_mib"]), "fp32", params["row_bytes"] // 4)
    base = _table_config(table, "fp32") | {"distribution": "uniform"}
    runs = []
    for n in progress(params["batch_rows"], desc="batch_sizes"):
        batch = sweep.batch(table, uniform_rows(table.shape[0], min(n, table.shape[0]), sweep.generator))
        sweep.run_batch(batch, base)
        runs.append((batch, base))
    sweep.run_table_copies(table, runs)  # one copy of the table serves every batch size
    del batch, runs
    sweep.close()
    return sweep.notes()


def _capped_or_peer(entry) -> str | None:
    """Part thread_cap compares the variants that take a thread cap with the peers (no cap)."""
    if entry.shares_from:
        return f"{entry.name} splits a batch by rates measured before it, which part thread_cap does not measure"
    if not (entry.thread_cap or entry.role == "peer"):
        return f"{entry.name} takes no thread cap and is no peer, which part thread_cap compares"
    return None


def thread_cap(params, writer, *, shared, repeat, warmup, device, **_) -> dict:
    """The variants that take a cap on their GPU threads, at each cap; the peers (stock torch has
    no cap) once per row size, as the line to compare with."""
    host = HostTable(mib(params["table_mib"]), device)
    sweep = _sweep(
        "thread_cap",
        params,
        writer,
        host,
        repeat=repeat,
        warmup=warmup,
        device=device,
        seed=4,
        accepts=_capped_or_peer,
    )
    batch = None  # a sweep with no cases still reaches the del below
    cases = [(rb, cap) for rb in params["row_bytes"] for cap in params["max_threads"]]
    for row_bytes, cap in progress(cases, desc="thread_cap"):
        table = host.view(mib(params["table_mib"]), "fp32", row_bytes // 4)
        batch = sweep.batch(
            table, uniform_rows(table.shape[0], min(shared["batch_rows"], table.shape[0]), sweep.generator)
        )
        config = _table_config(table, "fp32") | {"distribution": "uniform"}
        for entry in sweep.plain():
            if entry.thread_cap:
                sweep.run(entry, batch, config | {"max_threads": cap}, max_threads=cap)
            elif cap == params["max_threads"][0]:
                sweep.run(entry, batch, config)
        if cap == params["max_threads"][0]:
            sweep.run_table_copies(table, [(batch, config)])
    del batch
    sweep.close()
    return sweep.notes()


def locality(params, writer, *, shared, repeat, warmup, device, **_) -> dict:
    """Random reads of the same number of bytes, from windows of growing size spread over a large
    table: if the rate depends on the window size, address translation (not PCIe) bounds it."""
    host = HostTable(mib(params["table_mib"]), device)
    sweep = _sweep("locality", params, writer, host, repeat=repeat, warmup=warmup, device=device, seed=5)
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
        sweep.run_batch(batch, config)
        sweep.run_table_copies(table, [(batch, config)])
    del batch
    sweep.close()
    return {"union_bytes": union, **sweep.notes()}
