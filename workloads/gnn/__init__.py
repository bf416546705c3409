"""GNN training machinery shared by the GNN topics (gnn_training, gnn_multi_gpu); not a topic.

``models`` (GraphSAGE, GAT), ``pipelines`` (the ways of feeding sampled minibatches to the
training device) and ``epoch`` (the one epoch loop, for one process and for every rank of a
data-parallel run). The graphs themselves are in workloads.graphs. The topics import from here
and from workloads.graphs, never from each other.
"""
