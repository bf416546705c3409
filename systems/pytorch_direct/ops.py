"""``pytorch_direct::gather``: rows of a table in page-locked host memory, read by GPU threads.

``gather(table, idx)`` returns ``table[idx]`` on the GPU that holds ``idx``. ``table`` is a 2-D
CPU tensor of any dtype, pinned (in place through :class:`UnifiedTensor`, or ``pin_memory()``);
``idx`` is a 1-D int32 or int64 tensor of any strides (a strided or expanded view is made
contiguous before the kernel reads it), on the GPU (CPU ``idx`` with a CPU table runs the
reference). Options (each one an ablation step of the benchmark):

* ``loads``: ``"naive"`` (each lane loads one element, wherever the row starts), ``"aligned"``
  (the warp's reads start on the 128-byte line holding the row, lanes outside it masked), or
  ``"vectorized"`` (aligned, and 16-byte loads wherever row size and addresses allow).
* ``sort``: gather the rows in ascending index order (neighbouring rows share address
  translations), then put them back in the order asked for. Waits for the GPU once, as every
  path does: for the bounds check's flag.
* ``dedup``: sort and de-duplicate the indices, gather each distinct row once, scatter back
  (waits for the GPU twice: to learn how many distinct rows there are, and for the bounds check).
* ``slots`` / ``cache``: a GPU-resident copy of some rows (``slots[row]`` is the row's position
  in ``cache``, or -1); those rows are read from GPU memory instead of over PCIe. A slot outside
  the cache is read from the table (checking the slots per call would wait for the GPU).
* ``max_threads``: cap on the threads the gather uses (0: enough to fill the GPU), so that it
  can run beside training kernels; in whole blocks of 256 threads (1 to 511: one block).

An index outside the table raises ``IndexError`` naming the value; the kernel never reads it. A
table that requires grad gets the gradient of ``table[idx]``: the rows' gradients summed into its
rows, on the table's device. Forward-mode differentiation (``torch.func.jvp``) is refused: torch
gives a custom op no forward rule. ``torch.func.grad`` and ``vjp`` do not run through it either
(torch's own error, about ``setup_context``): take gradients with ``torch.autograd``. (The
option is ``loads``, not ``kernel``: inductor's fallback for a custom op takes ``kernel`` as its
own argument, and an op with one cannot be compiled.)
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.autograd import forward_ad

from systems import nvrtc
from systems.current_gpu import refuse_other_gpus

KERNEL_SOURCE = Path(__file__).parent / "kernels" / "gather.cu"
THREADS_PER_BLOCK = 256
KERNELS = ("naive", "aligned", "vectorized")
INDEX_DTYPES = (torch.int32, torch.int64)
NAIVE_HAS_NO_CACHE = "the naive kernel has no hot-row cache form: with slots and cache, use 'aligned' or 'vectorized'"


def _check(table: torch.Tensor, idx: torch.Tensor, loads: str, slots, cache, max_threads: int = 0) -> None:
    if getattr(forward_ad, "_current_level", -1) >= 0:
        # torch gives a custom op no forward-mode rule: under jvp its tangent would come out zero
        # (or missing) without an error. The kernel cannot tell a dual input from a plain one under
        # torch.func.jvp, so it refuses to run while any forward-mode level is open.
        raise NotImplementedError(
            "pytorch_direct::gather has no forward-mode derivative: it does not run under torch.func.jvp "
            "or inside forward_ad.dual_level(); gather outside them, or use table[idx]"
        )
    if loads not in KERNELS:
        raise ValueError(f"loads must be one of {KERNELS}, got {loads!r}")
    if max_threads < 0:  # the op's schema makes it an int; a negative cap would be taken as none
        raise ValueError(f"max_threads must be >= 0 (0: as many as fill the GPU), got {max_threads}")
    _check_table_and_idx(table, idx)
    if (slots is None) != (cache is None):
        raise ValueError("slots and cache go together: give both or neither")
    if slots is not None and loads == "naive":  # the cached kernel reads rows as the aligned one does
        raise ValueError(NAIVE_HAS_NO_CACHE)
    if slots is not None:
        if slots.dtype != torch.int32 or slots.shape != (table.shape[0],):
            raise ValueError(
                f"slots must be int32 of shape ({table.shape[0]},), got {slots.dtype} {tuple(slots.shape)}"
            )
        if cache.dtype != table.dtype or cache.dim() != 2 or cache.shape[1] != table.shape[1]:
            raise ValueError("cache must have the table's dtype and row length")
        if slots.device != idx.device or cache.device != idx.device:
            raise ValueError("slots and cache must be on the device of idx")
        if not (slots.is_contiguous() and cache.is_contiguous()):
            # The kernel reads slots[row] and cache rows by plain offsets; a contiguous copy per
            # call could cost as much as the gather, so the caller makes it once.
            raise ValueError("slots and cache must be contiguous (make them so once with .contiguous())")


def _check_table_and_idx(table: torch.Tensor, idx: torch.Tensor) -> None:
    """What every path reads by plain offsets: row r at ``table + r * row bytes``, index i at
    ``idx + i * its size``, each element at an address its size divides (the GPU's loads fault
    on a misaligned one, and the CUDA context with them)."""
    if table.dim() != 2:
        raise ValueError(f"table must be 2-D [rows, features], got shape {tuple(table.shape)}")
    if table.device.type != "cpu":
        raise ValueError(f"table must be in host memory, got a tensor on {table.device}")
    # A stride of a dimension of size 1 is never stepped over (torch calls such a tensor contiguous).
    dense = (table.shape[1] <= 1 or table.stride(1) == 1) and (table.shape[0] <= 1 or table.stride(0) == table.shape[1])
    if table.shape[1] and not dense:  # rows of no features have no layout to get wrong
        raise ValueError("table rows must be contiguous and densely packed")
    refuse_misaligned(table, "table")
    if idx.dim() != 1 or idx.dtype not in INDEX_DTYPES:
        raise ValueError(f"idx must be a 1-D int32 or int64 tensor, got {idx.dtype} of shape {tuple(idx.shape)}")


def refuse_misaligned(tensor: torch.Tensor, name: str) -> None:
    """A one-line ValueError where the element size does not divide ``tensor``'s address: the
    GPU's loads of its elements would fault (and the CUDA context with them)."""
    if tensor.data_ptr() % tensor.element_size():
        raise ValueError(
            f"the {name}'s address is not a multiple of its element size ({tensor.element_size()} B; a view of a "
            f"byte buffer at an odd offset?): the GPU cannot load its elements; pass {name}.clone()"
        )


def _out_of_range(idx: torch.Tensor, rows: int) -> torch.Tensor:
    """The indices outside ``rows`` rows, in order (``idx >= rows`` would wrap ``rows`` past the
    index dtype's range: no int32 index reaches a table of 2**31 rows or more)."""
    too_high = idx >= rows if rows <= torch.iinfo(idx.dtype).max else torch.zeros_like(idx, dtype=torch.bool)
    return idx[(idx < 0) | too_high]


def _raise_out_of_range(value: int, rows: int) -> None:
    raise IndexError(f"index {value} is out of range for a table of {rows} rows")


@torch.library.custom_op("pytorch_direct::gather", mutates_args=())
def gather_op(
    table: torch.Tensor,
    idx: torch.Tensor,
    loads: str = "vectorized",
    sort: bool = False,
    dedup: bool = False,
    max_threads: int = 0,
    slots: torch.Tensor | None = None,
    cache: torch.Tensor | None = None,
) -> torch.Tensor:
    """CPU reference: ``table[idx]`` with the same checks; with ``slots`` and ``cache``, a row whose
    slot is in the cache is read from the cache, as the kernel reads it (a cache filled before the
    table was written holds the old rows: a snapshot). Other options do not change the result."""
    _check(table, idx, loads, slots, cache, max_threads)
    bad = _out_of_range(idx, table.shape[0])
    if bad.numel():
        _raise_out_of_range(int(bad[0]), table.shape[0])
    rows = table.index_select(0, idx.long())
    if slots is not None:
        slot = slots.index_select(0, idx.long()).long()
        cached = (slot >= 0) & (slot < cache.shape[0])
        rows[cached] = cache.index_select(0, slot[cached])
    return rows


@gather_op.register_fake
def _(table, idx, loads="vectorized", sort=False, dedup=False, max_threads=0, slots=None, cache=None):
    # Tracing (fake tensors): the rows land on the device of idx. Real meta tensors run this too
    # (the Meta key wins): their result is meta, never uninitialised memory on a real device.
    meta = table.device.type == "meta" or idx.device.type == "meta"
    return table.new_empty((idx.shape[0], table.shape[1]), device="meta" if meta else idx.device)


def gather(
    table: torch.Tensor,
    idx: torch.Tensor,
    loads: str = "vectorized",
    sort: bool = False,
    dedup: bool = False,
    max_threads: int = 0,
    slots: torch.Tensor | None = None,
    cache: torch.Tensor | None = None,
) -> torch.Tensor:
    """``gather_op`` (the module's docstring), each argument's type checked first: the dispatcher's
    schema error is several lines, prints the value, and names no argument."""
    tensors = {"table": table, "idx": idx} | {k: v for k, v in (("slots", slots), ("cache", cache)) if v is not None}
    for name, value in tensors.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"{name} must be a torch tensor (torch.from_numpy for an array), got {type(value).__name__}"
            )
    if not isinstance(loads, str):
        raise TypeError(f"loads must be one of {', '.join(KERNELS)}, got {loads!r}")
    for name, value in (("sort", sort), ("dedup", dedup)):
        if not isinstance(value, bool | np.bool_):
            raise TypeError(f"{name} must be True or False, got {value!r}")
    if isinstance(max_threads, bool) or not isinstance(max_threads, int | np.integer):
        raise TypeError(f"max_threads must be an integer (0: enough to fill the GPU), got {max_threads!r}")
    return gather_op(table, idx, loads, bool(sort), bool(dedup), int(max_threads), slots, cache)


def _setup_context(ctx, inputs, output) -> None:
    table, idx = inputs[0], inputs[1]
    ctx.save_for_backward(idx)
    ctx.table = (table.shape, table.dtype, table.device)


def _backward(ctx, grad):
    """A table that requires grad gets the rows' gradients summed into its rows (on the table's
    device, as ``table[idx]`` would give them); the index and the options get none."""
    (idx,) = ctx.saved_tensors
    shape, dtype, device = ctx.table
    grad_table = torch.zeros(shape, dtype=dtype, device=device)
    grad_table.index_add_(0, idx.to(device=device, dtype=torch.int64), grad.to(device=device, dtype=dtype))
    return grad_table, None, None, None, None, None, None, None


gather_op.register_autograd(_backward, setup_context=_setup_context)


@gather_op.register_kernel("cuda")
def _(table, idx, loads="vectorized", sort=False, dedup=False, max_threads=0, slots=None, cache=None):
    _check(table, idx, loads, slots, cache, max_threads)
    refuse_other_gpus(idx=idx)
    if not table.is_pinned():
        raise ValueError(
            "table must be page-locked (UnifiedTensor or pin_memory()) for zero-copy gathers (a .conj() view of "
            "a pinned table arrives here as torch's unpinned copy: pin the resolved table)"
        )
    options = dict(kernel=loads, max_threads=max_threads, slots=slots, cache=cache)
    out = torch.empty((idx.shape[0], table.shape[1]), dtype=table.dtype, device=idx.device)
    if table.shape[1] == 0:  # no bytes to read: only the bounds are checked
        bad = _out_of_range(idx, table.shape[0])
        if bad.numel():
            _raise_out_of_range(int(bad[0]), table.shape[0])
        return out
    if dedup:
        unique, inverse = torch.unique(idx, sorted=True, return_inverse=True)
        rows = torch.empty((unique.shape[0], table.shape[1]), dtype=table.dtype, device=idx.device)
        bounds_check = launch_gather(table, unique, rows, check=False, **options)
        bounds_check.asked = idx  # an error names the first bad index in idx's order, as on the CPU
        torch.index_select(rows, 0, inverse, out=out)  # queued before the check waits
        bounds_check()
        return out
    if sort:
        launch_sorted_gather(table, idx, out, **options)
        return out
    launch_gather(table, idx, out, **options)
    return out


def launch_sorted_gather(table, idx, out, *, check: bool = True, **options) -> BoundsCheck | None:
    """Gather in ascending index order into a buffer, then scatter the rows to their positions
    in ``out``; no host synchronisation except the bounds check (see :func:`launch_gather`)."""
    order, positions = torch.sort(idx)
    rows = torch.empty_like(out)
    # The scatter is queued before the bounds check waits, so the GPU runs gather and scatter
    # back to back. Rows of out-of-range indices are never read (their slots hold garbage),
    # and the check raises before ``out`` reaches anyone.
    bounds_check = launch_gather(table, order, rows, check=False, **options)
    bounds_check.asked = idx  # an error names the first bad index in idx's order, not the smallest
    out.index_copy_(0, positions, rows)
    if check:
        bounds_check()
        return None
    return bounds_check


def word_bytes(kernel: str, element_size: int, row_bytes: int, *addresses: int) -> int:
    """Bytes each lane loads at a time: the element size, or for ``vectorized`` the widest power
    of two up to 16 that divides the row size and every base address the kernel reads or writes
    rows at (the table, the output and, with hot rows, the cache)."""
    if kernel != "vectorized":
        return element_size
    alignment = row_bytes | 16
    for address in addresses:
        alignment |= address
    return alignment & -alignment  # lowest set bit


def launch_gather(
    table: torch.Tensor,
    idx: torch.Tensor,
    out: torch.Tensor,
    *,
    kernel: str = "vectorized",
    max_threads: int = 0,
    slots: torch.Tensor | None = None,
    cache: torch.Tensor | None = None,
    check: bool = True,
) -> BoundsCheck | None:
    """Launch the gather into ``out``. With ``check`` (default), raise on an out-of-range index,
    which waits for the kernel (the flag it sets is read back); with ``check=False`` return a
    :class:`BoundsCheck` to call later, so the caller can overlap other work first."""
    # The kernel reads idx[i] at idx.data_ptr() + i * element size: a strided or expanded view
    # (ids[::3], ids[:1].expand(n)) must become a dense copy first, or other memory is read as
    # indices. A contiguous index (offset views included) is passed through as it is.
    idx = idx.contiguous()
    _check_table_and_idx(table, idx)  # (a few attribute reads: negligible beside a launch)
    if slots is not None and kernel == "naive":
        raise ValueError(NAIVE_HAS_NO_CACHE)
    n = idx.shape[0]
    _check_out(out, table, idx)
    if n == 0:
        return None if check else BoundsCheck(None, idx, table.shape[0])
    row_bytes = table.shape[1] * table.element_size()
    mode = "cached" if slots is not None else ("plain" if kernel == "naive" else "aligned")
    table_address = nvrtc.device_pointer_of_pinned(table)
    addresses = (table_address, out.data_ptr()) + ((cache.data_ptr(),) if cache is not None else ())
    word = word_bytes(kernel, table.element_size(), row_bytes, *addresses)
    name = f"gather_{mode}_w{word}_{'i32' if idx.dtype == torch.int32 else 'i64'}"
    bad_pos = torch.full((1,), n, dtype=torch.int64, device=idx.device)
    # A warp per row and, uncapped, a block for every eight rows: blocks start in index order and
    # each reads its rows once, so the rows in flight are always neighbours in the index list.
    # With sorted indices that keeps the addresses being read within a narrow window (few
    # translations); a grid-stride loop over a full-occupancy grid lets warps drift apart and
    # widens it (512 B sorted rows of a 16 GiB table on an H200: 25.8 GB/s strided, 34.5 in one
    # pass). A thread cap (to leave the GPU to training) needs the grid-stride loop.
    warps_per_block = THREADS_PER_BLOCK // 32
    blocks = -(-n // warps_per_block)
    if max_threads > 0:
        blocks = min(blocks, max(1, max_threads // THREADS_PER_BLOCK))
    null = np.uint64(0)
    nvrtc.launch(
        nvrtc.load_module(KERNEL_SOURCE),
        name,
        grid=(blocks,),
        block=(THREADS_PER_BLOCK,),
        args=(
            np.uint64(table_address),
            np.int64(table.shape[0]),
            np.uint64(idx.data_ptr()),
            np.int64(n),
            np.int64(row_bytes),
            np.uint64(slots.data_ptr()) if slots is not None else null,
            np.uint64(cache.data_ptr()) if cache is not None else null,
            np.int64(cache.shape[0] if cache is not None else 0),
            np.uint64(out.data_ptr()),
            np.uint64(bad_pos.data_ptr()),
        ),
    )
    bounds = BoundsCheck(bad_pos, idx, table.shape[0], torch.cuda.current_stream(idx.device))
    if not check:
        return bounds
    bounds()
    return None


def index_select_alias(alias: torch.Tensor, idx: torch.Tensor, *, sort: bool = False) -> torch.Tensor:
    """Stock torch's ``index_select`` on the CUDA alias of a pinned table (``UnifiedTensor.cuda_alias``),
    with the suite's bounds check: ``alias[idx]`` as a new CUDA tensor, or ``IndexError`` naming
    the first out-of-range value. With ``sort``, the rows are read in ascending index order and
    put back in the order asked for (``index_copy_``).

    torch itself asserts on the device for an out-of-range index, which leaves the CUDA context
    unusable; here one kernel copies the indices with out-of-range ones replaced by row 0 (and
    notes the first one's position) before torch reads any row."""
    _check_alias(alias, idx)
    out = torch.empty((idx.shape[0], alias.shape[1]), dtype=alias.dtype, device=alias.device)
    launch_index_select_alias(alias, idx, out, sort=sort)
    return out


def launch_index_select_alias(
    alias: torch.Tensor, idx: torch.Tensor, out: torch.Tensor, *, sort: bool = False, check: bool = True
) -> BoundsCheck | None:
    """:func:`index_select_alias` into ``out`` (dense, ``idx.numel()`` rows of the alias's). With
    ``check=False`` nothing waits for the GPU: the returned :class:`BoundsCheck` raises later, and
    ``out`` holds row 0 where an index was out of range until then (as :func:`launch_gather`)."""
    _check_alias(alias, idx)
    if tuple(out.shape) != (idx.shape[0], alias.shape[1]) or out.dtype != alias.dtype or out.device != alias.device:
        raise ValueError(
            f"out must be a {alias.dtype} tensor of shape {(idx.shape[0], alias.shape[1])} on {alias.device}, "
            f"got {out.dtype} {tuple(out.shape)} on {out.device}"
        )
    if not out.is_contiguous():
        raise ValueError("out must be contiguous (index_select writes its rows densely)")
    idx = idx.contiguous()  # the kernel reads idx[i] by plain offsets (see launch_gather)
    n = idx.shape[0]
    safe = torch.empty_like(idx)
    bad_pos = torch.full((1,), n, dtype=torch.int64, device=idx.device)
    if n:
        threads = THREADS_PER_BLOCK
        nvrtc.launch(
            nvrtc.load_module(KERNEL_SOURCE),
            f"sanitize_indices_{'i32' if idx.dtype == torch.int32 else 'i64'}",
            grid=(min(-(-n // threads), 4096),),
            block=(threads,),
            args=(
                np.uint64(idx.data_ptr()),
                np.int64(n),
                np.int64(alias.shape[0]),
                np.uint64(safe.data_ptr()),
                np.uint64(bad_pos.data_ptr()),
            ),
        )
    if sort:
        ids, order = torch.sort(safe)
        out.index_copy_(0, order, torch.index_select(alias, 0, ids))
    else:
        torch.index_select(alias, 0, safe, out=out)
    bounds = BoundsCheck(bad_pos, idx, alias.shape[0], torch.cuda.current_stream(idx.device))
    if not check:
        return bounds
    bounds()
    return None


def _check_alias(alias: torch.Tensor, idx: torch.Tensor) -> None:
    if alias.dim() != 2 or not alias.is_cuda:
        raise ValueError(f"alias must be a 2-D CUDA tensor, got shape {tuple(alias.shape)} on {alias.device}")
    if idx.dim() != 1 or idx.dtype not in INDEX_DTYPES or idx.device != alias.device:
        raise ValueError(
            f"idx must be a 1-D int32 or int64 tensor on {alias.device}, "
            f"got {idx.dtype} of shape {tuple(idx.shape)} on {idx.device}"
        )
    refuse_other_gpus(idx=idx)


def _check_out(out: torch.Tensor, table: torch.Tensor, idx: torch.Tensor) -> None:
    """The kernel writes row i at out.data_ptr() + i * row bytes: ``out`` must be dense."""
    expected = (idx.shape[0], table.shape[1])
    if tuple(out.shape) != expected or out.dtype != table.dtype or out.device != idx.device:
        raise ValueError(
            f"out must be {table.dtype} of shape {expected} on {idx.device}, "
            f"got {out.dtype} of shape {tuple(out.shape)} on {out.device}"
        )
    if not out.is_contiguous():
        raise ValueError("out must be contiguous: the kernel writes whole rows back to back")


@dataclass
class BoundsCheck:
    """The out-of-range flag of one launched gather; calling it waits for the gather and raises
    ``IndexError`` naming the first out-of-range index it met, or, where the kernel read the
    indices in another order than the caller's (sorted, or each value once), the first in
    ``asked``, the caller's index (so every path names the index the CPU reference names).

    The wait polls (``cudaEventSynchronize`` on a default event, which spins or yields): a blocking
    event sleeps until an interrupt wakes the thread, which cost about 250 us per call on an H200
    (tools/gather_call_overhead.py: a one-row gather took 494 us through the op, 30 us through
    stock torch), a fifth of a 128 B-row batch. The flag comes back through a pinned word kept per
    device and thread (:func:`_flag_word`)."""

    bad_pos: torch.Tensor | None
    idx: torch.Tensor
    table_rows: int
    stream: torch.cuda.Stream | None = None  # where the gather was launched
    asked: torch.Tensor | None = None  # the caller's index, where the kernel read another order

    def __call__(self) -> None:
        if self.bad_pos is None:
            return
        host = _flag_word(self.bad_pos.device)
        with torch.cuda.stream(self.stream or torch.cuda.current_stream(self.bad_pos.device)):
            host.copy_(self.bad_pos, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        done.synchronize()
        position = int(host[0])
        if position < self.idx.shape[0]:
            # The error path only: one pass over the caller's index (unless the caller has refilled
            # it since the launch: then the value the kernel met).
            bad = _out_of_range(self.asked, self.table_rows) if self.asked is not None else self.idx[:0]
            _raise_out_of_range(int(bad[0] if bad.numel() else self.idx[position]), self.table_rows)


_flag_words: dict[tuple[torch.device, int], torch.Tensor] = {}


def _flag_word(device: torch.device) -> torch.Tensor:
    """A pinned int64 for reading a flag back from ``device``, one per thread: a call waits for
    its copy and reads the word before returning, so calls of one thread never overlap, while
    calls of two threads could."""
    key = (device, threading.get_ident())
    word = _flag_words.get(key)
    if word is None:
        word = _flag_words[key] = torch.empty(1, dtype=torch.int64, pin_memory=True)
    return word
