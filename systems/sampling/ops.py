"""``sampling::sample_neighbors``: one hop of uniform neighbour sampling from a CSR.

``sample_neighbors(indptr, indices, seeds, fanout, replace, rng_seed)`` returns ``(counts,
neighbors)``: ``counts[i]`` neighbours of ``seeds[i]``, listed one seed after another in
``neighbors``. Without replacement a seed with at most ``fanout`` neighbours keeps all of them
(in CSR order), else ``fanout`` of its CSR entries, no entry twice (a neighbour the CSR lists twice,
a repeated edge, may come twice, as in training on all edges), a uniformly drawn set whose order
is not itself random (order-sensitive aggregators should not rely on it); with replacement
``fanout`` draws (none for a node without neighbours). The draws are a function of (rng_seed,
node, counter) only, so the CPU reference here and the CUDA kernel return identical samples.
With CUDA ``seeds`` the kernel runs; the CSR may then be on the GPU or in pinned host memory (read
over PCIe). With CPU ``seeds`` the C++ kernel (kernels/sample_cpu.cpp) runs; ``reference`` is the
numpy specification both kernels are tested against.

``sample_into_slots(indptr, indices, seeds, num_valid, fanout, replace, rng_seed)`` draws the same
neighbours into fixed slots (seed i's at ``i * fanout``, unused slots -1) for the first
``num_valid`` seeds only, a count held in a tensor: its output sizes never depend on the data, so
on a GPU the multi-hop sampler chains hops without reading anything back. Its checks of the seeds,
``num_valid`` and the CSR wait for the GPU once after the draws; ``check=False`` skips that wait
for a caller that checked its seeds and CSR itself (``NeighborSampler``): the kernel then still
reads and writes nothing out of bounds (a seed or CSR row out of range samples nothing there).
Neither op checks that the CSR's offsets never decrease (rows that overlap sample from the
overlap): a whole-graph check per hop would cost what the hop does, so ``NeighborSampler`` checks
a graph once, when it is given one.

Both are plain functions that check their integer arguments and call the ``torch.library`` ops
``sample_neighbors_op`` and ``sample_into_slots_op``: a fanout or seed beyond int64 would
otherwise meet the dispatcher's schema check first, whose error does not say which range is valid.
"""

from __future__ import annotations

import ctypes
import operator
from pathlib import Path

import numpy as np
import torch

from systems import native, nvrtc
from systems.current_gpu import refuse_other_gpus

KERNEL_SOURCE = Path(__file__).parent / "kernels" / "sample.cu"
CPU_KERNEL_SOURCE = Path(__file__).parent / "kernels" / "sample_cpu.cpp"
MAX_FANOUT = 64  # the kernels keep the chosen positions in a local array of this size
BAD_CSR = -1  # what the C++ kernels return for a CSR that points out of range
BAD_CSR_MESSAGE = "the CSR is inconsistent: a row or a neighbour id points outside the graph (corrupt graph file?)"
# The bits the CUDA kernels set in their error word (kernels/sample.cu) instead of reading out of bounds.
SEED_OUT_OF_RANGE, BAD_CSR_BIT = 1, 2
THREADS_PER_BLOCK = 128


def _mix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def draw(rng_seed: int, nodes: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """The kernel's random numbers: uint64 hashes of (rng_seed, node, counter)."""
    with np.errstate(over="ignore"):
        base = _mix64(np.uint64(rng_seed) ^ _mix64(nodes.astype(np.uint64)))
        return _mix64(base + counters.astype(np.uint64))


def check_int64_vectors(**tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.dtype != torch.int64 or t.dim() != 1:
            raise ValueError(f"{name} must be a 1-D int64 tensor, got {t.dtype} of shape {tuple(t.shape)}")


def _check_shapes(indptr, indices, seeds, fanout) -> None:
    """What both ops check without reading any tensor's values."""
    check_int64_vectors(indptr=indptr, indices=indices, seeds=seeds)
    if not 1 <= fanout <= MAX_FANOUT:
        raise ValueError(f"fanout must be between 1 and {MAX_FANOUT}, got {fanout}")
    if indptr.numel() == 0:
        raise ValueError("indptr must hold at least one entry (a graph of n nodes has n + 1)")


def check_arguments(indptr, indices, seeds, fanout, rng_seed) -> None:
    _check_shapes(indptr, indices, seeds, fanout)
    if not 0 <= rng_seed < 2**63:
        raise ValueError(f"rng_seed must be in [0, 2^63), got {rng_seed}")
    if seeds.numel() and (int(seeds.min()) < 0 or int(seeds.max()) >= indptr.numel() - 1):
        _raise_seed_out_of_range(seeds, indptr.numel() - 1)


def _raise_seed_out_of_range(seeds: torch.Tensor, num_nodes: int) -> None:
    bad = seeds[(seeds < 0) | (seeds >= num_nodes)][0]
    raise IndexError(f"seed node {int(bad)} is out of range for a graph of {num_nodes} nodes")


def reference(
    indptr: np.ndarray, indices: np.ndarray, seeds: np.ndarray, fanout: int, replace: bool, rng_seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """The specification in numpy (vectorized over seeds; Floyd's algorithm step by step)."""
    start, degree = indptr[seeds], indptr[seeds + 1] - indptr[seeds]
    if replace:
        counts = np.where(degree > 0, fanout, 0)
        has = degree > 0
        steps = np.arange(fanout)
        positions = draw(rng_seed, np.repeat(seeds[has], fanout), np.tile(steps, int(has.sum())))
        positions = (positions % np.repeat(degree[has], fanout).astype(np.uint64)).astype(np.int64)
        return counts, indices[np.repeat(start[has], fanout) + positions]
    counts = np.minimum(degree, fanout)
    chosen = np.empty((seeds.size, fanout), dtype=np.int64)
    big = degree > fanout
    # Small neighbourhoods: every neighbour, in order.
    small_rows = np.flatnonzero(~big)
    # Large ones: Floyd's algorithm, all seeds at once, one step at a time.
    b_seeds, b_degree = seeds[big], degree[big]
    picked = np.empty((b_seeds.size, fanout), dtype=np.int64)
    for step in range(fanout):
        j = b_degree - fanout + step
        t = (draw(rng_seed, b_seeds, j) % (j + 1).astype(np.uint64)).astype(np.int64)
        seen = (picked[:, :step] == t[:, None]).any(axis=1)
        picked[:, step] = np.where(seen, j, t)
    chosen[big] = picked
    offsets = np.concatenate([[0], np.cumsum(counts)])
    out = np.empty(offsets[-1], dtype=np.int64)
    big_rows = np.flatnonzero(big)
    out_big = (offsets[big_rows][:, None] + np.arange(fanout)).ravel()
    out[out_big] = indices[(start[big_rows][:, None] + chosen[big_rows]).ravel()]
    if small_rows.size:
        lengths = degree[small_rows]
        within = np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        out[np.repeat(offsets[small_rows], lengths) + within] = indices[np.repeat(start[small_rows], lengths) + within]
    return counts, out


def check_scalars(fanout, replace, rng_seed) -> None:
    """One-line refusals of a fanout or seed that is not an integer in range (a bool is not one, nor
    a tensor: one on a GPU would make the caller wait), and of a ``replace`` that is not a bool."""
    if not isinstance(replace, bool | np.bool_):
        raise ValueError(f"replace must be a bool, got {replace!r} ({type(replace).__name__})")
    for name, value, low, high, shown in (
        ("fanout", fanout, 1, MAX_FANOUT + 1, f"between 1 and {MAX_FANOUT}"),
        ("rng_seed", rng_seed, 0, 2**63, "in [0, 2^63)"),
    ):
        try:
            number = operator.index(value)
        except TypeError:
            number = None
        if number is None or isinstance(value, bool | torch.Tensor) or not low <= number < high:
            raise ValueError(f"{name} must be an integer {shown}, got {value!r} ({type(value).__name__})")


def check_tensors(**tensors) -> None:
    """Refuse, by name, an argument that is no tensor (the dispatcher's schema error names none)."""
    for name, value in tensors.items():
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"{name} must be a torch tensor, got {type(value).__name__}")


def sample_neighbors(indptr, indices, seeds, fanout, replace, rng_seed) -> tuple[torch.Tensor, torch.Tensor]:
    """One hop (the module docstring says what it returns)."""
    check_tensors(indptr=indptr, indices=indices, seeds=seeds)
    check_scalars(fanout, replace, rng_seed)
    return sample_neighbors_op(indptr, indices, seeds, int(fanout), bool(replace), int(rng_seed))


def sample_into_slots(
    indptr, indices, seeds, num_valid, fanout, replace, rng_seed, *, check: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """One hop into fixed slots (the module docstring says how they are laid out, and what
    ``check=False`` leaves out). ``num_valid`` may be given as a Python integer too: it is then
    put in a tensor on the seeds' device (a copy to the GPU, where the seeds are there)."""
    check_tensors(indptr=indptr, indices=indices, seeds=seeds)
    if not isinstance(num_valid, torch.Tensor):
        if isinstance(num_valid, bool) or not isinstance(num_valid, int | np.integer):
            raise ValueError(f"num_valid must be an int64 tensor of one element or an integer, got {num_valid!r}")
        num_valid = torch.tensor([int(num_valid)], device=seeds.device)
    check_scalars(fanout, replace, rng_seed)
    counts, out, error = sample_into_slots_op(
        indptr, indices, seeds, num_valid, int(fanout), bool(replace), int(rng_seed)
    )
    if check and seeds.is_cuda:  # the CPU op raised already
        word, valid = torch.stack([error.to(torch.int64)[0], num_valid.reshape(())]).tolist()  # one wait
        if not 0 <= valid <= seeds.numel():
            raise ValueError(f"num_valid must be in [0, {seeds.numel()}], got {valid}")
        if word & SEED_OUT_OF_RANGE:
            _raise_seed_out_of_range(seeds[:valid], indptr.numel() - 1)
        if word & BAD_CSR_BIT:
            raise ValueError(BAD_CSR_MESSAGE)
    return counts, out


@torch.library.custom_op("sampling::sample_neighbors", mutates_args=())
def sample_neighbors_op(
    indptr: torch.Tensor, indices: torch.Tensor, seeds: torch.Tensor, fanout: int, replace: bool, rng_seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    check_arguments(indptr, indices, seeds, fanout, rng_seed)
    indptr, indices, seeds = indptr.contiguous(), indices.contiguous(), seeds.contiguous()
    counts = torch.empty_like(seeds)
    out = torch.empty(seeds.numel() * fanout, dtype=torch.int64)
    p = native.pointer
    total = cpu_kernels().sample_neighbors(
        p(indptr),
        p(indices),
        indptr.numel() - 1,
        indices.numel(),
        p(seeds),
        seeds.numel(),
        fanout,
        int(replace),
        ctypes.c_uint64(rng_seed),
        p(counts),
        p(out),
    )
    if total == BAD_CSR:
        raise ValueError(BAD_CSR_MESSAGE)
    return counts, out[:total].clone()


def cpu_kernels():
    """The C++ kernels, with their argument types declared for ctypes."""
    library = native.load_library(CPU_KERNEL_SOURCE)
    if not getattr(library, "typed", False):
        ptr, i64, i32, u64 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_uint64
        library.sample_neighbors.argtypes = [ptr, ptr, i64, i64, ptr, i64, i32, i32, u64, ptr, ptr]
        library.sample_neighbors.restype = i64
        library.sample_hop.argtypes = [
            ptr,
            ptr,
            i64,
            i64,
            ptr,
            i64,
            i32,
            i32,
            u64,
            ptr,
            i64,
            ptr,
            ptr,
            ptr,
            ptr,
            ptr,
            ptr,
        ]
        library.sample_hop.restype = i64
        library.reset_positions.argtypes = [ptr, ptr, i64]
        library.reset_positions.restype = None
        library.typed = True
    return library


@sample_neighbors_op.register_fake
def _(indptr, indices, seeds, fanout, replace, rng_seed):
    ctx = torch.library.get_ctx()
    return seeds.new_empty(seeds.shape), seeds.new_empty((ctx.new_dynamic_size(),))


def _address(t: torch.Tensor) -> int:
    """Device-visible address: GPU memory as is, pinned host memory through unified addressing."""
    if not t.is_contiguous():
        # The kernels read t[i] at the address plus i elements; a copy of a pinned CSR would not
        # be pinned, so the caller makes it dense once.
        raise ValueError("a CSR for GPU sampling must be contiguous (make it so once with .contiguous())")
    if t.is_cuda:
        return t.data_ptr()
    if not t.is_pinned():
        raise ValueError("a CSR on the host must be pinned (pin_memory() or UnifiedTensor) for GPU sampling")
    return nvrtc.device_pointer_of_pinned(t)


@sample_neighbors_op.register_kernel("cuda")
def _(indptr, indices, seeds, fanout, replace, rng_seed):
    check_arguments(indptr, indices, seeds, fanout, rng_seed)
    refuse_other_gpus(seeds=seeds, indptr=indptr, indices=indices)
    seeds = seeds.contiguous()  # the kernels read seeds[i] by plain offsets (ids[::2] is a view)
    n = seeds.numel()
    counts = torch.empty(n, dtype=torch.int64, device=seeds.device)
    if n == 0:
        return counts, torch.empty(0, dtype=torch.int64, device=seeds.device)
    module = nvrtc.load_module(KERNEL_SOURCE)
    grid = (-(-n // THREADS_PER_BLOCK),)
    graph = (np.int64(indptr.numel() - 1), np.int64(indices.numel()))
    indptr_at, indices_at = np.uint64(_address(indptr)), np.uint64(_address(indices))
    error = torch.zeros(1, dtype=torch.int32, device=seeds.device)
    nvrtc.launch(
        module,
        "count_samples",
        grid,
        (THREADS_PER_BLOCK,),
        (
            indptr_at,
            *graph,
            np.uint64(seeds.data_ptr()),
            np.int64(n),
            np.int32(fanout),
            np.int32(replace),
            np.uint64(counts.data_ptr()),
            np.uint64(error.data_ptr()),
        ),
    )
    offsets = torch.cumsum(counts, 0) - counts
    total, word = torch.stack([counts.sum(), error.to(torch.int64)[0]]).tolist()  # the output size: one wait
    if word:  # check_arguments checked the seeds: a row of the CSR is out of range
        raise ValueError(BAD_CSR_MESSAGE)
    neighbors = torch.empty(total, dtype=torch.int64, device=seeds.device)
    nvrtc.launch(
        module,
        "sample_neighbors",
        grid,
        (THREADS_PER_BLOCK,),
        (
            indptr_at,
            indices_at,
            *graph,
            np.uint64(seeds.data_ptr()),
            np.int64(n),
            np.int32(fanout),
            np.int32(replace),
            np.uint64(rng_seed),
            np.uint64(offsets.data_ptr()),
            np.uint64(neighbors.data_ptr()),
            np.uint64(error.data_ptr()),
        ),
    )
    if int(error):  # a neighbour id that is not a node (the CPU kernel checks each one too)
        raise ValueError(BAD_CSR_MESSAGE)
    return counts, neighbors


@torch.library.custom_op("sampling::sample_into_slots", mutates_args=())
def sample_into_slots_op(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    seeds: torch.Tensor,
    num_valid: torch.Tensor,
    fanout: int,
    replace: bool,
    rng_seed: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(counts, slots, error): error is one int32, the CUDA kernel's error bits (SEED_OUT_OF_RANGE,
    BAD_CSR_BIT); on the CPU bad input raises instead, and it is 0."""
    _check_slot_arguments(indptr, indices, seeds, num_valid, fanout)
    valid = int(num_valid)  # on the host, reading it costs nothing
    if not 0 <= valid <= seeds.numel():
        raise ValueError(f"num_valid must be in [0, {seeds.numel()}], got {valid}")
    counts_of_valid, neighbors = sample_neighbors_op(indptr, indices, seeds[:valid], fanout, replace, rng_seed)
    counts = torch.zeros(seeds.numel(), dtype=torch.int64)
    counts[:valid] = counts_of_valid
    out = torch.full((seeds.numel() * fanout,), -1, dtype=torch.int64)
    first_of_seed = torch.cumsum(counts_of_valid, 0) - counts_of_valid
    within = torch.arange(neighbors.numel()) - torch.repeat_interleave(first_of_seed, counts_of_valid)
    out[torch.repeat_interleave(torch.arange(valid) * fanout, counts_of_valid) + within] = neighbors
    return counts, out, torch.zeros(1, dtype=torch.int32)


def _check_slot_arguments(indptr, indices, seeds: torch.Tensor, num_valid: torch.Tensor, fanout: int) -> None:
    """What can be checked without reading device memory (the seed ids and the CSR's contents are
    checked by the kernel, which sets its error word instead of reading out of bounds)."""
    _check_shapes(indptr, indices, seeds, fanout)
    if num_valid.dtype != torch.int64 or num_valid.numel() != 1 or num_valid.device != seeds.device:
        raise ValueError("num_valid must be one int64 on the seeds' device")


@sample_into_slots_op.register_fake
def _(indptr, indices, seeds, num_valid, fanout, replace, rng_seed):
    error = seeds.new_empty((1,), dtype=torch.int32)
    return seeds.new_empty(seeds.shape), seeds.new_empty((seeds.numel() * fanout,)), error


@sample_into_slots_op.register_kernel("cuda")
def _(indptr, indices, seeds, num_valid, fanout, replace, rng_seed):
    _check_slot_arguments(indptr, indices, seeds, num_valid, fanout)
    refuse_other_gpus(seeds=seeds, indptr=indptr, indices=indices)
    if not 0 <= rng_seed < 2**63:
        raise ValueError(f"rng_seed must be in [0, 2^63), got {rng_seed}")
    n = seeds.numel()
    counts = torch.empty(n, dtype=torch.int64, device=seeds.device)
    out = torch.empty(n * fanout, dtype=torch.int64, device=seeds.device)
    error = torch.zeros(1, dtype=torch.int32, device=seeds.device)
    if n == 0:
        return counts, out, error
    seeds, num_valid = seeds.contiguous(), num_valid.contiguous()
    nvrtc.launch(
        nvrtc.load_module(KERNEL_SOURCE),
        "sample_into_slots",
        (-(-n // THREADS_PER_BLOCK),),
        (THREADS_PER_BLOCK,),
        (
            np.uint64(_address(indptr)),
            np.uint64(_address(indices)),
            np.int64(indptr.numel() - 1),
            np.int64(indices.numel()),
            np.uint64(seeds.data_ptr()),
            np.int64(n),
            np.uint64(num_valid.data_ptr()),
            np.int32(fanout),
            np.int32(replace),
            np.uint64(rng_seed),
            np.uint64(counts.data_ptr()),
            np.uint64(out.data_ptr()),
            np.uint64(error.data_ptr()),
        ),
    )
    return counts, out, error
