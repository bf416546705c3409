"""RGCN, RGAT and HGT in the model language, each the same function as its baseline forms in
workloads/rgnn (one head), and the binding of those forms' weight sets to the programs' names."""

from __future__ import annotations

import torch

from systems.hector.lang import model
from workloads.rgnn import hgt, rgat, rgcn


@model
def rgcn_layer(m):
    """PyG's RGCNConv: root term, bias, and per relation the mean of the sources' transforms."""
    x = m.input("x", "in")
    W = m.weight("W", ("in", "out"), per="relation")
    message = m.src(x) @ W[m.relation] * m.graph_data("norm")
    return x @ m.weight("root", ("in", "out")) + m.weight("bias", ("out",)) + m.sum_into_dst(message)


@model
def rgat_layer(m):
    """PyG's RGATConv with its defaults: additive self-attention across relations, one head."""
    x = m.input("x", "in")
    W = m.weight("W", ("in", "out"), per="relation")
    source, target = m.src(x) @ W[m.relation], m.dst(x) @ W[m.relation]
    score = m.leaky_relu(target @ m.weight("q", ("out", 1)) + source @ m.weight("k", ("out", 1)), 0.2)
    return m.weight("bias", ("out",)) + m.sum_into_dst(m.edge_softmax(score) * source)


@model
def hgt_layer(m):
    """PyG's HGTConv with one head, in = out (so the gated skip applies)."""
    x = m.input("x", "out")

    def typed(rows, name, width_in):  # rows @ W[type] + b[type], per node type
        w, b = m.weight(f"W{name}", (width_in, "out"), per="node_type"), m.weight(f"b{name}", ("out",), per="node_type")
        return rows @ w[m.node_type] + b[m.node_type]

    k, q, v = typed(x, "k", "out"), typed(x, "q", "out"), typed(x, "v", "out")
    keys = m.src(k) @ m.weight("K", ("out", "out"), per="relation")[m.relation]
    values = m.src(v) @ m.weight("V", ("out", "out"), per="relation")[m.relation]
    score = m.dot(m.dst(q), keys) * m.weight("p", (1,), per="relation")[m.relation] * m.rsqrt("out", keys)
    h = typed(m.gelu(m.sum_into_dst(m.edge_softmax(score) * values)), "out", "out")
    gate = m.sigmoid(m.each_node(m.weight("skip", (1,), per="node_type")[m.node_type]))
    return gate * h + (1 - gate) * x


PROGRAMS = {"rgcn": rgcn_layer, "rgat": rgat_layer, "hgt": hgt_layer}


def bind(model_name: str, weights) -> dict[str, torch.Tensor]:
    """The programs' weights as views of workloads/rgnn's weight sets (gradients reach them)."""
    if model_name == "rgcn":
        assert isinstance(weights, rgcn.RGCNWeights)
        return {"W": weights.weight, "root": weights.root, "bias": weights.bias}
    if model_name == "rgat":
        assert isinstance(weights, rgat.RGATWeights)
        return {"W": weights.weight, "q": weights.q, "k": weights.k, "bias": weights.bias}
    assert isinstance(weights, hgt.HGTWeights) and weights.in_dim == weights.out_dim
    out = weights.out_dim
    kqv, kqv_bias = weights.stacked("kqv_weight"), weights.kqv_bias
    parts = {name: i * out for i, name in enumerate("kqv")}  # HGTConv's order: keys, queries, values
    bound = {f"W{n}": kqv[:, :, s : s + out] for n, s in parts.items()}
    bound |= {f"b{n}": kqv_bias[:, s : s + out] for n, s in parts.items()}
    return bound | {
        "K": weights.k_rel,
        "V": weights.v_rel,
        "p": weights.p_rel.unsqueeze(1),
        "Wout": weights.stacked("out_weight"),
        "bout": weights.out_bias,
        "skip": weights.skip.unsqueeze(1),
    }
