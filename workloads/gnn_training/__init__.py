"""Minibatch GNN training with neighbour sampling: where each epoch's time goes, per pipeline.

Parts are datasets (``reddit``, ``products``, ``papers``: graphs with those statistics, see
workloads.graphs); each part trains GraphSAGE and GAT with every pipeline that applies here
(see pipelines.py). Without a GPU only the CPU pipeline runs, training on the CPU.
"""

PARTS = ("reddit", "products", "papers")
DATASET_OF = {"reddit": "reddit", "products": "ogbn-products", "papers": "ogbn-papers100M"}


def parts_for(has_gpu: bool) -> tuple[str, ...]:
    return PARTS
