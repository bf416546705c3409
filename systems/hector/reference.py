"""The reference backend: runs a program (before or after any pass) with stock PyTorch operators,
one operator at a time, so autograd gives its gradients. It is the oracle of the generated
kernels' tests and Hector's path on a machine without a GPU.

Rows are in their domain's natural order: nodes by id, edges in the graph's edge order, pairs in
the order of ``src * relations + etype``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from harness.errors import UserError
from systems.hector.ir import Program, Value
from systems.hector.lower import GraphIndex, graph_data
from systems.relgraph.graph import RelGraph, segment_offsets
from systems.relgraph.ops import edge_softmax, segment_products


class BindingError(UserError):
    """The tensors given do not fit the program (a missing name, a width, a type count)."""


class Pairs:
    """The distinct (source, relation) pairs of a graph: each pair's source and relation, and each
    edge's pair. A view of the arrays the lowering uses (lower.GraphIndex), made once per graph."""

    def __init__(self, graph: RelGraph):
        index = GraphIndex.of(graph)
        self.src, self.etype, self.of_edge = index["pair_src"], index["pair_etype"], index["pair_of_edge"]

    def __len__(self):
        return len(self.src)


def run(program: Program, graph: RelGraph, tensors: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """The program's outputs for ``graph``, with its inputs and weights from ``tensors`` by name."""
    widths: dict[str, tuple[int, str]] = {}  # each width symbol's size, and the tensor that set it
    pairs = Pairs(graph) if any(v.domain == "pair" for v in program.values) else None
    results = {id(v): _bind(v, tensors, graph, widths, pairs) for v in _leaves_weights_first(program)}
    _check_heads(program, widths)
    # The graph's data and constants in float64 where the tensors are: in float32 they would make
    # a float64 run only as exact as a float32 one.
    exact = torch.float64 if any(t.dtype == torch.float64 for t in tensors.values()) else torch.float32
    for value in program.values:
        if id(value) not in results:
            args = [results[id(a)] for a in value.args]
            results[id(value)] = _evaluate(value, args, graph, pairs, widths, exact)
    return [results[id(o)] for o in program.outputs]


def bind_widths(program: Program, graph: RelGraph, tensors: dict[str, torch.Tensor]) -> dict[str, int]:
    """Each width symbol's size for these tensors (checked as :func:`run` checks them)."""
    widths: dict[str, tuple[int, str]] = {}
    for value in _leaves_weights_first(program):
        _bind(value, tensors, graph, widths)
    _check_heads(program, widths)
    return {symbol: size for symbol, (size, _) in widths.items()}


def _check_heads(program: Program, widths: dict[str, tuple[int, str]]) -> None:
    """Every head count divides the width it is broadcast over or dotted in, for these widths."""

    def size(width):
        return width if isinstance(width, int) else widths.get(width, (None,))[0]

    for value in program.values:
        if value.op == "dot" and value.attr("heads", 1) > 1:
            width = value.args[0].width
            wide, heads = size(width), value.attr("heads")
            what = f"width {width} is" if isinstance(width, int) else f"width {width!r} is {wide} here,"
        elif value.op in ("add", "sub", "mul", "div", "equal"):
            # A literal width (a head count) broadcasts over the named one, whose binding must be a
            # multiple of it: the result takes the named width (lang.broadcast_width), never the
            # literal, even where the name is bound to less.
            literal = [arg.width for arg in value.args if isinstance(arg.width, int)]
            named = [arg.width for arg in value.args if not isinstance(arg.width, int)]
            if len(literal) != 1 or len(named) != 1:
                continue
            wide, heads = size(named[0]), literal[0]
            what = f"width {named[0]!r} is {wide} here,"
        else:
            continue
        if wide is not None and heads > 1 and wide % heads:
            raise BindingError(f"{value.op}: {what} not a multiple of {heads} (heads are blocks of equal width)")


def output_width(program: Program, graph: RelGraph, tensors: dict[str, torch.Tensor]) -> int:
    """The width of the program's (first) output for these tensors, without running it."""
    width = program.outputs[0].width
    return width if isinstance(width, int) else bind_widths(program, graph, tensors)[width]


def _evaluate(value: Value, args, graph: RelGraph, pairs: Pairs | None, widths, exact=torch.float32) -> torch.Tensor:
    op, domain = value.op, value.domain
    if op == "graph_data":
        return graph_data(graph, value.name, exact)
    if op == "const":
        # One row per row of its domain, as the templates read a scalar: a value made of constants
        # alone (m.rsqrt(width, like) + b, a gather or sum of it) has its domain's rows, not one.
        symbol = value.attr("rsqrt")
        number = value.attr("value") if symbol is None else _width(symbol, widths) ** -0.5
        rows = {"node": graph.num_nodes, "edge": graph.edges, "pair": None if pairs is None else len(pairs)}.get(domain)
        return torch.full((1 if rows is None else rows, 1), number, dtype=exact, device=graph.src.device)
    if op == "broadcast":
        return args[0].unsqueeze(0)
    if op == "gather":
        return args[0].index_select(0, _end_ids(value.attr("end"), domain, graph, pairs))
    if op == "unpair":
        return args[0].index_select(0, pairs.of_edge)
    if op == "take":
        return args[0].index_select(0, _type_ids(value.attr("by"), domain, graph, pairs))
    if op == "matmul":
        return args[0] @ (args[1].T if value.attr("transpose") else args[1])
    if op == "typed_matmul":
        weight = args[1].transpose(-1, -2) if value.attr("transpose") else args[1]
        return typed_products(args[0], weight, _type_ids(value.attr("by"), domain, graph, pairs))
    if op == "weight_product":  # per relation: W[r] @ v (linear-operator reordering)
        return args[0] @ args[1]
    if op == "add" and domain == "weight":  # gradient parts of one weight, of one shape (a vector's too)
        return args[0] + args[1]
    if op in ("add", "sub", "mul", "div", "equal"):
        a, b = _broadcast(args[0], args[1], op)
        if op == "equal":  # 1 where a row's entry is its target's maximum (max's gradient)
            return (a == b).to(a.dtype)
        return {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}[op](a, b)
    if op == "dot":
        heads = value.attr("heads", 1)
        product = args[0] * args[1]
        return product.reshape(len(product), heads, _block(product.shape[1], heads, "dot")).sum(2)
    if op == "leaky_relu":
        return F.leaky_relu(args[0], value.attr("slope"))
    if op in ("gelu", "sigmoid", "exp", "tanh"):
        return {"gelu": F.gelu, "sigmoid": torch.sigmoid, "exp": torch.exp, "tanh": torch.tanh}[op](args[0])
    if op == "edge_softmax":  # each column (head) on its own
        columns = [edge_softmax(c, graph.dst, graph.num_nodes) for c in args[0].unbind(1)]
        return torch.stack(columns, 1) if columns else args[0].clone()
    if op == "sum_into_dst":
        rows = args[0]
        return rows.new_zeros(graph.num_nodes, rows.shape[1]).index_add(0, graph.dst, rows)
    if op in ("max_into_dst", "max_into_src"):  # 0 where a node has no such edge
        rows, ends = args[0], graph.dst if op == "max_into_dst" else graph.src
        where = ends.unsqueeze(1).expand(-1, rows.shape[1])
        return rows.new_zeros(graph.num_nodes, rows.shape[1]).scatter_reduce(0, where, rows, "amax", include_self=False)
    return _evaluate_backward(value, args, graph, pairs)


def _block(width: int, heads: int, what: str) -> int:
    if width % heads:
        raise BindingError(f"{what}: width {width} is not a multiple of its {heads} heads")
    return width // heads


def _broadcast(a: torch.Tensor, b: torch.Tensor, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Two operands of an elementwise operator at one width: a width-1 operand as it is (torch
    broadcasts it), one of H heads repeated over each head's block of columns."""
    wa, wb = a.shape[1], b.shape[1]
    if wa == wb or 1 in (wa, wb):
        return a, b
    if wa < wb:
        return a.repeat_interleave(_block(wb, wa, what), 1), b
    return a, b.repeat_interleave(_block(wa, wb, what), 1)


def _evaluate_backward(value: Value, args, graph: RelGraph, pairs: Pairs | None) -> torch.Tensor:
    """The operators only backward programs use (systems/hector/autodiff.py)."""
    op, source = value.op, value.args[0].domain if value.args else None
    if op in ("sum_into_src", "sum_into_pair"):
        if op == "sum_into_pair":
            index, count = pairs.of_edge, len(pairs)
        else:
            index, count = (pairs.src if source == "pair" else graph.src), graph.num_nodes
        return args[0].new_zeros(count, args[0].shape[1]).index_add(0, index, args[0])
    if op == "typed_outer":  # per type t: the sum over its rows of rows_i^T g_i
        rows, g = args
        types = _type_ids(value.attr("by"), source, graph, pairs)
        order = torch.sort(types, stable=True).indices
        sizes = torch.bincount(types, minlength=_type_count(value.attr("by"), graph)).tolist()
        if not sizes:  # a graph of no relations (or node types): no products to stack
            return rows.new_zeros(0, rows.shape[1], g.shape[1])
        pieces = zip(rows.index_select(0, order).split(sizes), g.index_select(0, order).split(sizes), strict=True)
        return torch.stack([r.T @ d for r, d in pieces])
    if op == "outer":
        return args[0].T @ args[1]
    if op == "row_sum":
        return args[0].sum(1, keepdim=True)
    if op == "head_sum":  # per head: the sum of its block of columns (a broadcast head's gradient)
        rows, heads = args[0], value.width
        return rows.reshape(len(rows), heads, _block(rows.shape[1], heads, "head_sum")).sum(2)
    if op == "sum_rows":
        return args[0].sum(0)
    if op == "sum_by_type":
        by = value.attr("by")
        types = _type_ids(by, source, graph, pairs)
        return args[0].new_zeros(_type_count(by, graph), args[0].shape[1]).index_add(0, types, args[0])
    if op == "leaky_relu_grad":
        x, g = args
        return torch.where(x > 0, g, g * value.attr("slope"))
    if op == "gelu_grad":  # d/dx of x * Phi(x): Phi(x) + x * phi(x)
        x, g = args
        cdf = 0.5 * (1 + torch.erf(x * 0.5**0.5))
        pdf = torch.exp(-0.5 * x * x) * (2 * torch.pi) ** -0.5
        return g * (cdf + x * pdf)
    if op == "weight_product_grad_w":  # P[r] = W[r] @ v: dW[r] = dP[r] @ v^T
        return args[0] @ args[1].T
    if op == "weight_product_grad_v":  # dv = sum over r of W[r]^T dP[r]
        return (args[0].transpose(-1, -2) @ args[1]).sum(0)
    if op == "zeros_like":
        return torch.zeros_like(args[0])
    raise NotImplementedError(f"the reference backend has no operator {op!r}")


def _type_count(by: str, graph: RelGraph) -> int:
    return graph.num_node_types if by == "node_type" else graph.num_relations


def typed_products(rows: torch.Tensor, weight: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
    """``rows[i] @ weight[types[i]]`` for every row: rows sorted by type once, the baselines' one
    product per type's segment (systems/relgraph/ops.py), and back to row order."""
    if weight.shape[0] == 0:  # no types, so no rows: an empty product, still tied to both operands
        return rows @ weight.sum(0)
    order = torch.sort(types, stable=True).indices
    products = segment_products(rows.index_select(0, order), weight, segment_offsets(types, weight.shape[0]))
    return products.new_empty(products.shape).index_copy(0, order, products)


def _end_ids(end: str, domain: str, graph: RelGraph, pairs: Pairs | None) -> torch.Tensor:
    if domain == "pair":
        if end != "src":
            raise AssertionError("a pair has a source, not a target")
        return pairs.src
    return graph.src if end == "src" else graph.dst


def _type_ids(by: str, domain: str, graph: RelGraph, pairs: Pairs | None) -> torch.Tensor:
    if by == "node_type":
        return graph.node_type
    return pairs.etype if domain == "pair" else graph.etype


def _leaves_weights_first(program: Program) -> list[Value]:
    """The program's inputs and weights, the weights first: the weights are the layer, so they set
    its widths, and features of another width are then the tensor a mismatch names."""
    leaves = [v for v in program.values if v.op in ("input", "weight")]
    return sorted(leaves, key=lambda v: v.op == "input")


def _bind(value: Value, tensors, graph: RelGraph, widths, pairs: Pairs | None = None) -> torch.Tensor:
    if value.name not in tensors:
        raise BindingError(f"no tensor named {value.name!r} given (given: {', '.join(sorted(tensors))})")
    t = tensors[value.name]
    if value.op == "input":  # rows of a domain: features, an output's gradient, a saved forward value
        rows = {"node": graph.num_nodes, "edge": graph.edges}.get(value.domain)
        rows = len(pairs if pairs is not None else Pairs(graph)) if rows is None else rows
        if t.dim() != 2 or t.shape[0] != rows:
            raise BindingError(f"input {value.name}: [{rows} {value.domain}s, width] wanted, got {tuple(t.shape)}")
        wanted, where = widths.get(value.width, (t.shape[1], None))
        if where is not None and t.shape[1] != wanted and t.shape[1]:
            raise BindingError(
                f"input {value.name}: [{rows} {value.domain}s, {wanted}] wanted (width {value.width!r} is {wanted} "
                f"in {where}), got {tuple(t.shape)}"
            )
        _unify(value.width, t.shape[1], value.name, widths)
        return t
    leading = {"relation": graph.num_relations, "node_type": graph.num_node_types, None: None}[value.per]
    shape = tuple(t.shape[1:]) if value.per else tuple(t.shape)
    if len(shape) != len(value.shape) or (leading is not None and t.shape[0] != leading):
        per = f"{leading} {value.per}s x " if value.per else ""
        raise BindingError(f"weight {value.name}: {per}{list(value.shape)} wanted, got {tuple(t.shape)}")
    for symbol, size in zip(value.shape, shape, strict=True):
        _unify(symbol, size, value.name, widths)
    return t


def _unify(symbol, size: int, name: str, widths: dict[str, tuple[int, str]]) -> None:
    if size == 0:  # rows of no columns: a broadcast over them, or rsqrt of the width, has no meaning
        raise BindingError(f"{name}: width {symbol!r} is 0; every width must be at least 1")
    if isinstance(symbol, int):
        if symbol != size:
            raise BindingError(f"{name}: width {symbol} wanted, got {size}")
        return
    first, where = widths.setdefault(symbol, (size, name))
    if first != size:
        raise BindingError(f"{name}: width {symbol!r} is {size} here but {first} in {where}")


def _width(symbol, widths: dict[str, tuple[int, str]]) -> int:
    return symbol if isinstance(symbol, int) else widths[symbol][0]
