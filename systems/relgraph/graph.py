"""A relational graph as the layers take it: edge lists, relation ids, and what every form
precomputes once from them (outside any timed loop)."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np
import torch

from harness import machine
from harness.arguments import cpu_or_cuda, integer, whole_number
from harness.errors import UserError

# Set while RelGraph.build constructs a graph: every other construction (``RelGraph(...)``,
# ``dataclasses.replace``) would keep derived fields (norm, the orders, the offsets) that no longer
# match its edges, and every form would read them.
_BUILDING: ContextVar[bool] = ContextVar("_BUILDING", default=False)


@dataclass(frozen=True, eq=False)  # a graph is itself: == on its tensors would raise, or compare sizes
class RelGraph:
    """Edges ``src -> dst`` of relation ``etype`` (int64 tensors on one device), over
    ``num_nodes`` nodes and ``num_relations`` relations. Construct with :meth:`build`, which copies
    the ids it is given. The tensors are the graph's own: editing them in place leaves what was
    derived from them (``norm``, the orders and offsets, the layers' cached indices) describing the
    old edges; for other edges, build another graph."""

    num_nodes: int
    num_relations: int
    src: torch.Tensor
    dst: torch.Tensor
    etype: torch.Tensor
    # Mean aggregation per (target, relation): 1 / the number of the target's edges of that relation.
    norm: torch.Tensor
    # The edges ordered by relation (stable), and each relation's segment [offsets[r], offsets[r + 1]).
    by_relation: torch.Tensor
    offsets: torch.Tensor
    # Node types (HGT's per-type weights): each node's type, the nodes ordered by type (stable) and
    # each type's segment of that order. One type (all 0) unless given.
    num_node_types: int
    node_type: torch.Tensor
    by_type: torch.Tensor
    type_offsets: torch.Tensor

    def __post_init__(self):
        if not _BUILDING.get():
            raise UserError(
                "a RelGraph is made by RelGraph.build(src, dst, etype, num_nodes, num_relations, ...), which "
                "computes its derived fields from the edges; for other edges, build another (not "
                "dataclasses.replace or the constructor)"
            )
        object.__setattr__(self, "_versions", self._edge_versions())

    EDGES = ("src", "dst", "etype", "node_type")

    def _edge_versions(self) -> tuple[int | None, ...]:
        # An inference tensor has no version (and cannot be edited in place outside inference mode).
        tensors = [getattr(self, name) for name in self.EDGES]
        return tuple(None if t.is_inference() else t._version for t in tensors)

    def __getstate__(self) -> dict:
        # A copy's versions are counted afresh (below): an edited graph copied would pass as built.
        self.check_unchanged()
        return dict(self.__dict__)

    def __setstate__(self, state: dict) -> None:
        # A copy (copy.deepcopy, pickle) has tensors of its own, versions counted afresh.
        self.__dict__.update(state)
        object.__setattr__(self, "_versions", self._edge_versions())

    def check_unchanged(self) -> None:
        """Refuse, in one line, a graph whose ids were edited in place since it was built: what was
        derived from them (norm, the orders, the offsets, the layers' cached indices) describes the
        old edges, and a layer would mix the two without a word. Not seen: writes torch does not
        count (through ``.data`` or ``.numpy()``), and a check inside code Dynamo traces, which reads
        no versions (a compiled layer checks at its entry, outside the traced code)."""
        if torch.compiler.is_compiling():  # Dynamo traces neither versions nor inference flags
            return
        changed = [name for name, was, now in zip(self.EDGES, self._versions, self._edge_versions()) if was != now]
        if changed:
            raise UserError(
                f"the graph's {', '.join(changed)} changed in place after RelGraph.build: what was derived from "
                "them describes the old edges; build another graph for the new ones"
            )

    @classmethod
    @torch.inference_mode(False)  # built under inference mode too: its tensors are saved for backward and versioned
    def build(
        cls, src, dst, etype, num_nodes: int, num_relations: int, device="cpu", node_type=None, num_node_types=1
    ) -> RelGraph:
        """Checks the ids (integers, every node id below ``num_nodes``, every relation id below
        ``num_relations``, every node type below ``num_node_types``: a clear error names the first
        offender) and precomputes the rest on ``device``. The ids may be sequences, numpy arrays or
        tensors on any device, of any integer dtype."""
        num_nodes, num_relations, num_node_types = (
            _count(name, count)
            for name, count in (
                ("num_nodes", num_nodes),
                ("num_relations", num_relations),
                ("num_node_types", num_node_types),
            )
        )
        device = _device(device)
        src, dst, etype = (_ids(name, a, device) for name, a in (("src", src), ("dst", dst), ("etype", etype)))
        node_type = None if node_type is None else _ids("node_type", node_type, device)
        _refuse_tables_past_memory(
            device,
            num_nodes=(num_nodes, (src, dst)),
            num_relations=(num_relations, (etype,)),
            num_node_types=(num_node_types, () if node_type is None else (node_type,)),
        )
        if node_type is None:  # one type, allocated once the count is known to fit
            if num_node_types == 0 and num_nodes:  # else "node_type[0] = 0", of ids nobody gave
                raise UserError(
                    f"num_node_types is 0 for a graph of {num_nodes} nodes: without node_type every node is of "
                    "type 0, so num_node_types must be at least 1"
                )
            node_type = torch.zeros(num_nodes, dtype=torch.int64, device=device)
        if node_type.shape != (num_nodes,):
            raise UserError(f"node_type must hold one type per node ({num_nodes}), got {tuple(node_type.shape)}")
        if not src.shape == dst.shape == etype.shape or src.dim() != 1:
            raise UserError(
                f"src, dst and etype must be 1-d and of one length, got {tuple(src.shape)}, "
                f"{tuple(dst.shape)} and {tuple(etype.shape)}"
            )
        checks = (
            ("src", src, num_nodes, "node"),
            ("dst", dst, num_nodes, "node"),
            ("etype", etype, num_relations, "relation"),
            ("node_type", node_type, num_node_types, "node type"),
        )
        for name, ids, bound, kind in checks:
            # Types given with the count left at its default: the count, not the types, is what is missing.
            forgot = name == "node_type" and num_node_types == 1
            hint = ": num_node_types is 1 (its default); give the number of node types" if forgot else ""
            _refuse_out_of_range(name, ids, bound, kind, hint)
        norm = 1.0 / _norm_counts(dst, etype, num_relations).to(torch.float32)
        by_relation = torch.sort(etype, stable=True).indices
        offsets = segment_offsets(etype, num_relations)
        by_type = torch.sort(node_type, stable=True).indices
        type_offsets = segment_offsets(node_type, num_node_types)
        building = _BUILDING.set(True)
        try:
            return cls(
                int(num_nodes),
                int(num_relations),
                src,
                dst,
                etype,
                norm,
                by_relation,
                offsets,
                int(num_node_types),
                node_type,
                by_type,
                type_offsets,
            )
        finally:
            _BUILDING.reset(building)

    @classmethod
    def from_store(cls, arrays: dict, num_relations: int, device="cpu", num_node_types: int = 1) -> RelGraph:
        """From a graph in the store's layout: a CSR by target (``indptr``, nodes + 1 offsets from 0
        to the edge count; ``indices``, each target's sources), ``edge_type`` (one per edge) and,
        if typed, ``node_type``. A malformed CSR is refused in one line naming the array: read as
        it is, it fails deep in numpy or builds another graph without a word (offsets from 1 to
        edges + 1 still count the right number of edges)."""
        missing = [name for name in ("indptr", "indices", "edge_type") if name not in arrays]
        if missing:
            raise UserError(f"arrays must hold indptr, indices and edge_type (a CSR by target); missing {missing}")
        num_relations, device = _count("num_relations", num_relations), _device(device)
        indptr = _ids("indptr", arrays["indptr"], torch.device("cpu"), what="offsets")  # read on the host
        indices, edge_type = (_ids(name, arrays[name], device) for name in ("indices", "edge_type"))
        if indptr.dim() != 1 or len(indptr) == 0:
            raise UserError(f"indptr must be 1-d, one offset per node and one more, got shape {tuple(indptr.shape)}")
        if indices.dim() != 1:
            raise UserError(f"indices must be 1-d, one source per edge, got shape {tuple(indices.shape)}")
        if edge_type.shape != indices.shape:
            raise UserError(
                f"edge_type must hold one relation per edge ({len(indices)}, as indices), got shape "
                f"{tuple(edge_type.shape)}"
            )
        if int(indptr[0]) != 0:
            raise UserError(f"indptr[0] must be 0 (where the first node's edges start), got {int(indptr[0])}")
        falls = torch.nonzero(indptr.diff() < 0).flatten()
        if falls.numel():
            i = int(falls[0]) + 1
            raise UserError(
                f"indptr must be non-decreasing (each node's edges start where the last's end), but "
                f"indptr[{i}] = {int(indptr[i])} < indptr[{i - 1}] = {int(indptr[i - 1])}"
            )
        if int(indptr[-1]) != len(indices):
            raise UserError(
                f"indptr's last offset must be the edge count, len(indices) = {len(indices)}, got {int(indptr[-1])}"
            )
        num_nodes = len(indptr) - 1
        # Named as given here, not as build's src and etype.
        _refuse_out_of_range("indices", indices, num_nodes, "node")
        _refuse_out_of_range("edge_type", edge_type, num_relations, "relation")
        dst = torch.repeat_interleave(torch.arange(num_nodes), indptr.diff())
        return cls.build(
            indices,
            dst,
            edge_type,
            num_nodes,
            num_relations,
            device,
            node_type=arrays.get("node_type"),
            num_node_types=num_node_types,
        )

    def norm_as(self, dtype: torch.dtype) -> torch.Tensor:
        """``norm`` in ``dtype``. A type wider than float32 computes it from the edge counts: the
        float32 reciprocals widened would leave a float64 layer only as exact as a float32 one."""
        if torch.finfo(dtype).bits <= 32:
            return self.norm.to(dtype)
        return 1.0 / _norm_counts(self.dst, self.etype, self.num_relations).to(dtype)

    @property
    def edges(self) -> int:
        return len(self.src)

    def unique_source_relation_pairs(self) -> int:
        """Distinct (source, relation) pairs: what a compact form materializes instead of edges."""
        return int(torch.unique(self.src * self.num_relations + self.etype).numel())


def _count(name: str, count) -> int:
    """A count of the graph's nodes, relations or node types as a Python int, refused in one line
    unless it is a whole number."""
    number = whole_number(count)
    if number is None:
        raise UserError(f"{name} must be a non-negative integer, got {count!r}")
    return number


def _device(device) -> torch.device:
    """``device`` as a torch device the graph can live on (the CPU, or a CUDA GPU this machine has)."""
    chosen = cpu_or_cuda(device)  # the graph's kernels and the forms run on these two
    if chosen is None:
        raise UserError(f"device must be 'cpu' or 'cuda' (or 'cuda:N'), got {device!r}")
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device {chosen} asked for, but this machine has no CUDA GPU (torch sees none)")
    return chosen


# What the graph allocates per node, relation and node type, in bytes: per node, its int64 type
# (when not given), and torch.sort's sorted copy and order of the types (by_type); per relation and
# per node type, the int64 bincount and the offsets summed from it.
TABLE_BYTES = {"num_nodes": 24, "num_relations": 16, "num_node_types": 16}
KIND = {"num_nodes": "node", "num_relations": "relation", "num_node_types": "node type"}


def _refuse_tables_past_memory(device: torch.device, **counts: tuple[int, tuple]) -> None:
    """Refuse, with the sizes, counts whose tables the device cannot hold (``counts``: each count's
    value and the ids that count bounds). A count is the user's word (isolated nodes have no ids to
    show them), so the refusal is by memory, not by the ids: a num_nodes of 2**40 would otherwise
    reach the allocator and fail there with a message about memory that names no argument."""
    sizes = {name: count * TABLE_BYTES[name] for name, (count, _) in counts.items()}
    if sum(sizes.values()) < 2**30:  # a graph of tables this small is no reason to ask the machine
        return
    available = _available_bytes(device)
    if available is None or sum(sizes.values()) <= available:
        return
    name = max(sizes, key=sizes.get)  # the count that asks for the most
    count, ids = counts[name]
    kind = KIND[name]
    largest = max((int(t.max()) for t in ids if t.numel()), default=None)
    reached = f"the ids given reach {kind} {largest}" if largest is not None else f"no {kind} ids given"
    raise UserError(
        f"{name} = {count} is more than {device} can hold: the graph's tables per {kind} would take "
        f"{_size(sizes[name])} ({TABLE_BYTES[name]} bytes a {kind}), {_size(available)} is available; {reached}"
    )


def _available_bytes(device: torch.device) -> int | None:
    """Memory ``device`` could hand out now (on a GPU, with what torch's allocator holds unused);
    None where it is not known."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return machine.available_memory_bytes()


def _size(nbytes: int) -> str:
    """A size in the largest binary unit under it (bytes below 1 KiB)."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):.1f} {unit}"
    return f"{nbytes} bytes"


def _norm_counts(dst: torch.Tensor, etype: torch.Tensor, num_relations: int) -> torch.Tensor:
    """Each edge's (target, relation)'s edge count (int64). Counted over the pairs that occur, not
    a nodes x relations table (wikikg2's would be 2.5 M x 535 floats: 5.4 GB)."""
    _, pair, counts = torch.unique(dst * num_relations + etype, return_inverse=True, return_counts=True)
    return counts[pair]


def _ids(name: str, ids, device: torch.device, what: str = "ids") -> torch.Tensor:
    """A copy of ``ids`` as int64 on ``device``, refused in one line unless they are integers: a
    float id truncated or a bool read as 0/1 would build another graph without a word. A copy, as
    the graph's segments and norms are derived once: a caller's later edit of its own buffer (the
    next batch's edges) must not reach the graph's ids and leave the rest stale."""
    if not isinstance(ids, torch.Tensor):
        if np.ma.isMaskedArray(ids) and np.ma.getmask(ids) is not np.ma.nomask and np.ma.getmask(ids).any():
            # np.asarray reads the values under the mask as ids, silently
            raise UserError(f"{name} is a masked array with masked {what}: drop or fill them first")
        try:
            array = np.asarray(ids)
        except ValueError:  # numpy's refusal of nested lists of unequal lengths
            raise UserError(f"{name} must be a flat sequence of integer {what}, got ragged nested ones") from None
        if (
            array.dtype.kind in "iu"
            and isinstance(ids, list | tuple)
            and any(isinstance(v, bool | np.bool_) for v in ids)
        ):
            # numpy reads [0, True] as int64 [0, 1]: a bool among ints is refused as bools alone are
            raise UserError(f"{name} must hold integer {what}, got a bool among them")
        if array.size == 0:  # [] is float64 to numpy: an empty list has no wrong dtype
            array = array.astype(np.int64)
        if array.dtype.kind in "fO":  # numpy's type for integers int64 cannot hold, or for floats
            _refuse_past_int64(name, ids)
        if array.dtype.kind == "O" and all(integer(v) is not None for v in array.flat):
            array = array.astype(np.int64)  # integers held as objects (a pandas object column)
        if array.dtype.kind not in "iu":
            raise UserError(f"{name} must hold integer {what}, got {array.dtype}")
        if array.dtype == np.uint64 and array.size and array.max() > np.iinfo(np.int64).max:
            raise UserError(f"{name} holds ids past int64's range (largest {array.max()})")
        return torch.from_numpy(np.array(array, dtype=np.int64, order="C", copy=True)).to(device)
    if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
        raise UserError(f"{name} must hold integer {what}, got {ids.dtype}")
    if ids.layout != torch.strided or ids.is_nested or ids.is_meta:  # no values to read
        kind = "a meta" if ids.is_meta else "a nested" if ids.is_nested else f"a {ids.layout}"
        raise UserError(f"{name} must be a dense tensor of ids, got {kind} tensor")
    if ids.dtype in (torch.uint64, torch.uint32) and ids.numel():  # int64 would wrap uint64's largest ids
        # torch has no max of its unsigned types: numpy reads them (a copy on the host)
        largest = int(ids.detach().cpu().numpy().max())
        if largest > np.iinfo(np.int64).max:
            raise UserError(f"{name} holds ids past int64's range (largest {largest})")
    return ids.to(device=device, dtype=torch.int64, copy=True)


def _refuse_out_of_range(name: str, ids: torch.Tensor, bound: int, kind: str, hint: str = "") -> None:
    """Refuse ids outside ``[0, bound)``, naming the first and counting them (the same words on
    every device); ``hint`` ends the message where the ids are too high."""
    bad = torch.nonzero((ids < 0) | (ids >= bound)).flatten()
    if bad.numel():
        i = int(bad[0])
        valid = f"0 to {bound - 1}" if bound else f"it has no {kind}s"
        raise UserError(
            f"{name}[{i}] = {int(ids[i])} is not a {kind} id of this graph ({valid}; {bad.numel()} such ids)"
            + (hint if int(ids[i]) >= bound else "")
        )


def _refuse_past_int64(name: str, ids) -> None:
    """Refuse, naming the first, integer ids that int64 cannot hold. Python ints past it (``2**63``,
    or below ``-2**63``) make numpy read the whole sequence as float64 (beside a negative id) or as
    objects, so without this the error would name that type, not the id."""
    values = np.asarray(ids, dtype=object).ravel()
    as_ints = [integer(v) for v in values]
    if any(v is None for v in as_ints):  # a float or another non-integer among them: the type is the error
        return
    low, high = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    outside = [i for i, v in enumerate(as_ints) if not low <= v <= high]
    if outside:
        i = outside[0]
        side = "below" if as_ints[i] < 0 else "past"
        raise UserError(
            f"{name}[{i}] = {as_ints[i]} is {side} int64's range, so no id of any graph ({len(outside)} such ids)"
        )


def segment_offsets(ids: torch.Tensor, count: int) -> torch.Tensor:
    """Where each id's run starts in ``ids`` sorted: [0, n_0, n_0 + n_1, ..., len(ids)] (int64,
    on ``ids``' device)."""
    offsets = torch.zeros(count + 1, dtype=torch.int64, device=ids.device)
    offsets[1:] = torch.cumsum(torch.bincount(ids, minlength=count), 0)
    return offsets
