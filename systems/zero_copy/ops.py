"""``zero_copy::read_rows``: rows of a pinned host table, read by GPU threads into GPU memory.

``read_rows(table, rows)`` returns ``table[rows]`` on the device of ``rows``. ``table`` is a 2-D
uint8 CPU tensor (one row per record, row size in bytes = ``table.shape[1]``); on the GPU path it
must be page-locked (``pin_memory()``) and ``rows`` is an int64 CUDA tensor. With CPU ``rows`` the
CPU reference runs. Out-of-range indices raise ``IndexError`` naming the first offending value:
the kernel never reads outside the table.

The ceilings workload times :func:`launch_read_rows` (the bare kernel, indices trusted) after
checking its output against the reference once.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from systems import nvrtc
from systems.current_gpu import refuse_other_gpus

KERNEL_SOURCE = Path(__file__).parent / "kernels" / "read_rows.cu"
THREADS_PER_BLOCK = 256


def _check_arguments(table: torch.Tensor, rows: torch.Tensor) -> None:
    if table.dim() != 2 or table.dtype != torch.uint8:
        raise ValueError(
            f"table must be a 2-D uint8 tensor [num_rows, row_bytes], got {table.dtype} of shape {tuple(table.shape)}"
        )
    if table.device.type != "cpu":
        raise ValueError(f"table must live in host memory, got a tensor on {table.device}")
    if not table.is_contiguous():
        raise ValueError("table must be contiguous")
    if rows.dim() != 1 or rows.dtype != torch.int64:
        raise ValueError(f"rows must be a 1-D int64 tensor, got {rows.dtype} of shape {tuple(rows.shape)}")
    if rows.numel() == 0:
        return
    bad = rows[(rows < 0) | (rows >= table.shape[0])]
    if bad.numel():
        raise IndexError(f"row index {int(bad[0])} is out of range for a table of {table.shape[0]} rows")


@torch.library.custom_op("zero_copy::read_rows", mutates_args=())
def read_rows(table: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """CPU reference: a plain index on the host."""
    _check_arguments(table, rows)
    return table[rows]


@read_rows.register_fake
def _(table, rows):
    return rows.new_empty((rows.shape[0], table.shape[1]), dtype=torch.uint8)


@read_rows.register_kernel("cuda")
def _(table, rows):
    _check_arguments(table, rows)
    refuse_other_gpus(rows=rows)
    if not table.is_pinned():
        raise ValueError("table must be page-locked (pin_memory()) for GPU zero-copy reads")
    out = torch.empty((rows.shape[0], table.shape[1]), dtype=torch.uint8, device=rows.device)
    launch_read_rows(table, rows, out)
    return out


def launch_read_rows(table: torch.Tensor, rows: torch.Tensor, out: torch.Tensor, max_blocks: int | None = None) -> None:
    """Launch the kernel without checks (the caller guarantees valid pinned table and indices)."""
    # The kernel reads rows[i] at rows.data_ptr() + 8 * i: a strided or expanded view (ids[::2])
    # must become a dense copy first, or other memory is read as row ids (past the checked ones).
    rows = rows.contiguous()
    num_rows, row_bytes = rows.shape[0], table.shape[1]
    if num_rows == 0:
        return
    table_ptr = nvrtc.device_pointer_of_pinned(table)
    vectorized = row_bytes % 16 == 0 and table_ptr % 16 == 0 and out.data_ptr() % 16 == 0
    warps_per_block = THREADS_PER_BLOCK // 32
    blocks = -(-num_rows // warps_per_block)
    if max_blocks is None:
        # Enough resident warps to keep many PCIe reads in flight; more only adds scheduling.
        max_blocks = torch.cuda.get_device_properties(rows.device).multi_processor_count * 8
    module = nvrtc.load_module(KERNEL_SOURCE)
    nvrtc.launch(
        module,
        "read_rows_vec16" if vectorized else "read_rows_bytes",
        grid=(min(blocks, max_blocks),),
        block=(THREADS_PER_BLOCK,),
        args=(
            np.uint64(table_ptr),
            np.uint64(rows.data_ptr()),
            np.int64(num_rows),
            np.int64(row_bytes),
            np.uint64(out.data_ptr()),
        ),
    )
