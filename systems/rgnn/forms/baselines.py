"""The forms Hector is measured against, each implemented by every model that has it
(``Model.layers``, systems/rgnn/models/):

* ``pyg``: PyTorch Geometric's own layer (``RGCNConv``, ``RGATConv``, ``HGTConv``) computing with
  the shared weights: what a user picks today, so a ``peer``;
* ``pyg_fast``: PyG's second implementation where it has one (``FastRGCNConv``: a weight matrix
  gathered per edge), a ``peer`` too;
* ``per_edge``: plain PyTorch, every edge's message computed with its own gathered weight (the
  "UDF" style of DGL's examples: memory grows with edges x in x out);
* ``segment_mm``: plain PyTorch, edges sorted by relation once, one matrix product per relation's
  contiguous segment (DGL's ``segment_mm`` style); the reference the others are checked against;
* ``grouped_mm``: the same segments in one call of ``torch.nn.functional.grouped_mm``;
* ``dense``: plain PyTorch as a user writes it today: every node under every relation in one GEMM
  ([nodes, relations x out]), then each edge's row gathered by its (node, relation) pair; a
  ``peer``, since it is what a user picks without Hector, not what the paper compared against.
"""

from systems.rgnn.forms import FORMS, LayerForm

PYG = ("torch_geometric",)

for form in (
    LayerForm("pyg", "peer", packages=PYG, notes="PyTorch Geometric's layer"),
    LayerForm("pyg_fast", "peer", packages=PYG, notes="PyG's FastRGCNConv"),
    LayerForm("per_edge", "baseline", notes="plain PyTorch, a weight gathered per edge"),
    LayerForm("segment_mm", "baseline", notes="plain PyTorch, a product per relation segment"),
    LayerForm("grouped_mm", "baseline", notes="plain PyTorch, one grouped_mm call"),
    LayerForm(
        "dense", "peer", notes="plain PyTorch, every node under every relation in one GEMM, rows gathered per edge"
    ),
):
    FORMS.register(form)
