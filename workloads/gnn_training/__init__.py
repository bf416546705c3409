"""Minibatch GNN training with neighbour sampling: where each epoch's time goes, per pipeline.

Parts are datasets (``reddit``, ``products``, ``papers``: graphs with those statistics, see
workloads.graphs; ``papers_full``: papers-like at full size, its feature table generated in host
memory, on GPU machines only); each part trains GraphSAGE and GAT with every pipeline that applies here
(see workloads/gnn/pipelines.py). Without a GPU only the CPU pipeline runs, training on the CPU.
``products_budgets`` and ``papers_budgets`` (GPU machines) train the same graphs with the pipelines
and models their config names at each of their CPU budgets: the CPU baselines against zero-copy
when the data path gets 2, 4, 8 or all cores, a part of its own so that each part fits a run.
"""

from harness.topic import Part, Topic
from workloads.gnn_training.schema import SCHEMA
from workloads.graphs.spec import SHORT_NAMES

TOPIC = Topic(
    name="gnn_training",
    title="GNN minibatch training",
    technique="pytorch_direct",
    schema=SCHEMA,
    # papers_full: papers100M-like with its feature table generated in host memory (GPU machines:
    # on a CPU it would be the papers part again, a few rows larger).
    parts=(
        *(Part(name) for name in SHORT_NAMES),
        Part("papers_full", cpu=False),
        Part("products_budgets", cpu=False),
        Part("papers_budgets", cpu=False),
    ),
    # PyG's NeighborLoader samples with whichever of these is built (pyg_neighbor_loader).
    packages=("pyg-lib", "torch-sparse", "torch-scatter", "scipy"),
)
