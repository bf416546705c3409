"""Minibatch GNN training with neighbour sampling: where each epoch's time goes, per pipeline.

Parts are datasets (``reddit``, ``products``, ``papers``: graphs with those statistics, see
workloads.graphs); each part trains GraphSAGE and GAT with every pipeline that applies here
(see workloads/gnn/pipelines.py). Without a GPU only the CPU pipeline runs, training on the CPU.
"""

from harness.topic import Part, Topic
from workloads.gnn_training.schema import SCHEMA
from workloads.graphs.spec import SHORT_NAMES

TOPIC = Topic(
    name="gnn_training",
    title="GNN minibatch training",
    technique="pytorch_direct",
    schema=SCHEMA,
    parts=tuple(Part(name) for name in SHORT_NAMES),
)
