"""Relational GNN layers as the relational_gnn topic compares them: the models, declared once
each (``models``: RGCN, RGAT, HGT), and the forms that compute them (``forms``: PyG's layers,
plain-PyTorch per-edge, segment and grouped-GEMM forms, and Hector's variants), two registries
that every module of their package adds to. Every form of a model computes the same function from
one shared weight set, so any two can be checked against each other.

Beside them: ``layer``, the base of the layers a model implements itself (weights and graph
checked against each other and the features), and ``breakdown``, which splits a call's time and
memory by kind of work. The graph and its segment operations are systems/relgraph.
"""
