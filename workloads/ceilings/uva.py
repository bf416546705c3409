"""uva_read: GPU threads read rows of pinned host memory (zero-copy over unified addressing).

For each way of allocating the pinned host memory (see workloads.buffers.PinnedHostBuffer), table
size (a prefix of one buffer), row size ("granularity") and access order:
``contiguous`` (consecutive rows from a random start), ``random`` (distinct rows in random order)
and ``sorted`` (the same rows in ascending order). Rows are distinct, so every byte counted
crosses PCIe once. Several index sets rotate between repetitions so that no repetition finds the
previous one's rows in the GPU's L2 cache.
"""

from __future__ import annotations

import itertools

import torch

from harness.progress import progress
from harness.timing import measure
from systems.zero_copy.ops import launch_read_rows
from workloads.buffers import MIB, PinnedHostBuffer, huge_pages_note

ORDERS = ("contiguous", "random", "sorted")
INDEX_SETS = 4
CHECKED_ROWS = 2048


def _index_sets(order: str, table_rows: int, rows: int, generator: torch.Generator) -> list[torch.Tensor]:
    sets = []
    for _ in range(INDEX_SETS):
        if order == "contiguous":
            start = int(torch.randint(0, table_rows - rows + 1, (1,), generator=generator, device="cuda"))
            idx = torch.arange(start, start + rows, device="cuda")
        else:
            idx = torch.randperm(table_rows, device="cuda", generator=generator)[:rows].clone()
            if order == "sorted":
                idx = idx.sort().values
        sets.append(idx)
    return sets


def _check(table: torch.Tensor, idx: torch.Tensor, out: torch.Tensor) -> None:
    sample = torch.linspace(0, idx.numel() - 1, min(CHECKED_ROWS, idx.numel())).long()
    expected = table[idx[sample.cuda()].cpu()]
    if not torch.equal(out[sample.cuda()].cpu(), expected):
        raise RuntimeError("uva_read: rows read by the kernel differ from the table")


def run(params: dict, writer, *, repeat: int, warmup: int, **_) -> dict:
    notes = {}
    for allocation in params.get("allocations", ["pinned"]):
        buffer = PinnedHostBuffer(max(params["table_sizes_mib"]) * MIB, allocation, seed=4)
        notes[allocation] = huge_pages_note()
        _measure(buffer.tensor, allocation, params, writer, repeat=repeat, warmup=warmup)
        buffer.close()
    return {"host_memory": notes}


def _measure(table: torch.Tensor, allocation: str, params: dict, writer, *, repeat: int, warmup: int) -> None:
    generator = torch.Generator(device="cuda").manual_seed(5)
    max_out = params["rows"] * max(params["granularities"])
    out_buffer = torch.empty(max_out, dtype=torch.uint8, device="cuda")
    cases = list(itertools.product(params["table_sizes_mib"], params["granularities"], ORDERS))
    for table_mib, granularity, order in progress(cases, desc=f"uva_read ({allocation})"):
        table_bytes = table_mib * MIB
        view = table[:table_bytes].view(-1, granularity)
        rows = min(params["rows"], view.shape[0])
        out = out_buffer[: rows * granularity].view(rows, granularity)
        sets = _index_sets(order, view.shape[0], rows, generator)
        out.fill_(0xA5)  # poison: a row the kernel skipped cannot match the table by chance
        launch_read_rows(view, sets[0], out)
        _check(view, sets[0], out)
        rotation = itertools.cycle(sets)
        m = measure(lambda: launch_read_rows(view, next(rotation), out), device="cuda", repeat=repeat, warmup=warmup)
        writer.add_measurement(
            m,
            role="probe",
            variant=order,
            bytes_moved=rows * granularity,
            config={
                "device": "cuda",
                "host_memory": allocation,
                "table_bytes": table_bytes,
                "granularity_bytes": granularity,
                "rows": rows,
            },
        )
