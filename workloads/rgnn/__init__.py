"""Relational GNN layers (RGCN in ``rgcn``, RGAT in ``rgat``, HGT in ``hgt``) in the baseline
forms Hector is measured against, all computing the same function from one shared set of weights:

* ``pyg``: PyTorch Geometric's own layer (``RGCNConv``, ``RGATConv``, ``HGTConv``), the shared
  weights assigned to it;
* ``pyg_fast``: PyG's second implementation where it has one (``FastRGCNConv``: a weight matrix
  gathered per edge);
* ``per_edge``: plain PyTorch, every edge's message computed with its own gathered weight (the
  "UDF" style of DGL's examples: memory grows with edges x in x out);
* ``segment_mm``: plain PyTorch, edges sorted by relation once, one matrix product per
  relation's contiguous segment (DGL's ``segment_mm`` style);
* ``grouped_mm``: the same segments in one call of ``torch.nn.functional.grouped_mm``.

``graph.RelGraph`` holds a graph's edges and everything a form precomputes from them once
(relation order, segment offsets, mean normalization), checked on construction; ``form.Form``
checks weights, graph and features against each other; ``ops`` holds the per-relation products
and the edge softmax the plain-PyTorch forms share; ``breakdown`` splits a call's time by kind of
work.
"""
