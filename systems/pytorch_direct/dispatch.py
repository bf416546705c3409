"""Which path ``UnifiedTensor[idx]`` takes: the fastest one measured on this GPU, never a guess.

Paths (each also a variant of the feature_gather benchmark, named in ``VARIANT_OF_PATH``):

* ``kernel``: the suite's gather op (``ops.gather``, vectorized kernel);
* ``kernel_sorted``: the same, rows read in ascending index order;
* ``torch``: stock torch's ``index_select`` on the CUDA alias of the table, with the suite's
  bounds check (``ops.index_select_alias``);
* ``torch_sorted``: the same, ids sorted first and rows put back in request order.

A GPU's table holds, for each (row size, table size) measured by the feature_gather topic's
``table_sizes`` and ``row_sizes`` parts (uniform rows, every process found), the path with the
highest median bandwidth. It is a JSON file under ``dispatch_tables/``, built from the results by
``python -m workloads.feature_gather.dispatch_table`` (a test checks that the committed tables are
what the committed results give). A lookup takes, among the measured cells whose rows have the
same alignment (the largest power of two up to 16 dividing the row size: it decides which loads
each path can use, and a 2408 B row reads unlike a 2048 B one), the one nearest in log2(row
bytes), then in log2(table bytes). On a GPU with no table the suite's kernel is used, and
:func:`choose` says so.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from harness.errors import NeedsGpuError
from systems.current_gpu import refuse_other_gpus
from systems.pytorch_direct.ops import (
    INDEX_DTYPES,
    KERNELS,
    BoundsCheck,
    gather,
    index_select_alias,
    launch_gather,
    launch_index_select_alias,
    launch_sorted_gather,
)

TABLES = Path(__file__).parent / "dispatch_tables"
PATHS = ("kernel", "kernel_sorted", "torch", "torch_sorted")
VARIANT_OF_PATH = {
    "kernel": "vectorized",
    "kernel_sorted": "sorted",
    "torch": "torch_uva",
    "torch_sorted": "torch_uva_sorted",
}
FALLBACK = "kernel"


@dataclass(frozen=True)
class Choice:
    path: str  # one of PATHS
    reason: str  # where the choice came from, for provenance and for users asking why


def table_file(gpu_name: str) -> Path:
    """The dispatch table of a GPU model ("NVIDIA H200" -> dispatch_tables/nvidia-h200.json)."""
    return TABLES / (re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-") + ".json")


@functools.cache
def load_table(gpu_name: str) -> dict | None:
    path = table_file(gpu_name)
    if not path.exists():
        return None
    table = json.loads(path.read_text())
    for cell in table["cells"]:
        if cell["path"] not in PATHS:
            raise ValueError(f"{path}: unknown path {cell['path']!r} (known: {PATHS})")
    return table


def choose(row_bytes: int, table_bytes: int, gpu_name: str) -> Choice:
    """The path for a table of ``table_bytes`` with rows of ``row_bytes`` on ``gpu_name``."""
    if row_bytes <= 0 or table_bytes <= 0:
        raise ValueError(f"row and table sizes must be positive, got {row_bytes} and {table_bytes}")
    table = load_table(gpu_name)
    if table is None or not table["cells"]:
        return Choice(FALLBACK, f"no dispatch table for {gpu_name!r}: the suite's kernel")
    cells = [c for c in table["cells"] if alignment(c["row_bytes"]) == alignment(row_bytes)] or table["cells"]
    row = min({c["row_bytes"] for c in cells}, key=lambda r: abs(math.log2(r / row_bytes)))
    cell = min(
        (c for c in cells if c["row_bytes"] == row), key=lambda c: abs(math.log2(c["table_bytes"] / table_bytes))
    )
    return Choice(
        cell["path"],
        f"{table_file(gpu_name).name}: measured cell {cell['row_bytes']} B rows, "
        f"{cell['table_bytes'] / 2**30:g} GiB table",
    )


def alignment(row_bytes: int) -> int:
    """The largest power of two, up to 16, that divides ``row_bytes``."""
    word = row_bytes | 16
    return word & -word


def choose_for(table: torch.Tensor, device: torch.device | int | None = None) -> Choice:
    """:func:`choose` for a 2-D host table read from ``device`` (default: the current GPU)."""
    if not torch.cuda.is_available():  # the choice is by the GPU's name; torch's own refusal is an AssertionError
        raise NeedsGpuError("choose_for picks the gather path of a CUDA GPU, and none is available")
    row_bytes = table.shape[1] * table.element_size()
    return choose(row_bytes, table.shape[0] * row_bytes, torch.cuda.get_device_name(device))


def gather_rows(path: str, table: torch.Tensor, alias: torch.Tensor | None, idx: torch.Tensor, **kernel_options):
    """``table[idx]`` along ``path``: ``table`` is the pinned 2-D host table, ``alias`` the same
    memory as a CUDA tensor (needed by the torch paths), ``idx`` a 1-D CUDA index tensor."""
    if path in ("kernel", "kernel_sorted"):
        return gather(table, idx, sort=path == "kernel_sorted", **kernel_options)
    if path in ("torch", "torch_sorted"):
        if kernel_options:
            raise ValueError(f"path {path!r} is stock torch: kernel options {sorted(kernel_options)} do not apply")
        if alias is None:
            raise ValueError(f"path {path!r} reads the table through its CUDA alias; none was given")
        return index_select_alias(alias, idx, sort=path == "torch_sorted")
    raise ValueError(f"unknown gather path {path!r} (known: {PATHS})")


def launch_rows(
    path: str,
    table: torch.Tensor,
    alias: torch.Tensor | None,
    idx: torch.Tensor,
    out: torch.Tensor,
    *,
    max_threads: int = 0,
    loads: str = "vectorized",
) -> BoundsCheck:
    """Queue ``table[idx]`` along ``path`` into ``out`` without any host wait, for a pipeline that
    overlaps the gather with other work; returns the range check, which waits for the gather when
    called (until then ``out`` may hold garbage or row 0 where an index is out of range).

    ``table`` is the pinned 2-D host table, ``alias`` the same memory as a CUDA tensor (for the
    torch paths), ``idx`` a 1-D int32/int64 tensor on the current GPU, ``out`` a dense
    ``(len(idx), row)`` tensor of the table's dtype there; each is checked here, the same for
    every path, before anything is queued. ``loads`` and ``max_threads`` are the suite's kernel's
    options. A thread cap (to leave the GPU to training) is the kernel's alone: stock torch
    launches a full grid, so with ``max_threads`` the torch paths give way to the kernel reading
    rows in the same order."""
    if path not in PATHS:
        raise ValueError(f"unknown gather path {path!r} (known: {PATHS})")
    if not table.is_pinned() or table.dim() != 2:
        raise ValueError("table must be a 2-D page-locked host tensor (UnifiedTensor or pin_memory())")
    if not isinstance(idx, torch.Tensor) or idx.dim() != 1 or idx.dtype not in INDEX_DTYPES or not idx.is_cuda:
        what = f"{idx.dtype} of shape {tuple(idx.shape)} on {idx.device}" if isinstance(idx, torch.Tensor) else idx
        raise ValueError(f"idx must be a 1-D int32 or int64 CUDA tensor, got {what}")
    refuse_other_gpus(idx=idx)
    rows = (idx.shape[0], table.shape[1])
    if tuple(out.shape) != rows or out.dtype != table.dtype or out.device != idx.device or not out.is_contiguous():
        raise ValueError(
            f"out must be a dense {table.dtype} tensor of shape {rows} on {idx.device}, got "
            f"{'a strided ' if not out.is_contiguous() else ''}{out.dtype} {tuple(out.shape)} on {out.device}"
        )
    if loads not in KERNELS:
        raise ValueError(f"loads must be one of {KERNELS}, got {loads!r}")
    sort = path.endswith("_sorted")
    if path.startswith("torch") and not max_threads:
        if alias is None:
            raise ValueError(f"path {path!r} reads the table through its CUDA alias; none was given")
        return launch_index_select_alias(alias, idx, out, sort=sort, check=False)
    launch = launch_sorted_gather if sort else launch_gather
    return launch(table, idx, out, kernel=loads, max_threads=max_threads, check=False)
