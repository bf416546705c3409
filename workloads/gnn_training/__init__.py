"""Minibatch GNN training with neighbour sampling: where each epoch's time goes, per pipeline.

Parts are datasets (``reddit``, ``products``, ``papers``: graphs with those statistics, see
workloads.graphs; ``papers_full``: papers-like at full size, its feature table generated in host
memory, on GPU machines only); each part trains GraphSAGE and GAT with every pipeline that applies here
(see workloads/gnn/pipelines.py). Without a GPU only the CPU pipeline runs, training on the CPU.
The CPU-budget sweeps (GPU machines), one part per graph and budget (``products_2_cores`` ...
``papers_full_4_cores``, :data:`BUDGET_SWEEPS`), train the same graphs with the pipelines and models
their config blocks list on that many cores: the CPU baselines against zero-copy when the data path
gets few cores (all of them: the dataset parts). Each is a part of its own so that each fits a run.
"""

from harness.topic import Part, Topic
from workloads.gnn_training.schema import SCHEMA
from workloads.graphs.spec import SHORT_NAMES

# part -> (the dataset part whose graph it trains, the cores it runs on): products- and papers-like
# at 2, 4 and 8 cores; papers100M-like at full size at 2 and 4 (where the CPU baselines starve).
BUDGET_SWEEPS = {
    f"{graph}_{cores}_cores": (graph, cores)
    for graph, budgets in (("products", (2, 4, 8)), ("papers", (2, 4, 8)), ("papers_full", (2, 4)))
    for cores in budgets
}

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
        *(Part(name, cpu=False, cores=cores) for name, (_, cores) in BUDGET_SWEEPS.items()),
    ),
    # PyG's NeighborLoader samples with whichever of these is built (pyg_neighbor_loader).
    packages=("pyg-lib", "torch-sparse", "torch-scatter", "scipy"),
)
