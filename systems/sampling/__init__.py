"""Uniform neighbor sampling for minibatch GNN training (PyG's NeighborLoader needs pyg-lib or
torch-sparse, which cannot be installed here), on the CPU, on the GPU, and on the GPU over a CSR
kept in pinned host memory (as DGL's UVA sampling does). All three draw the same neighbours for
the same seed: the random numbers come from a counter-based hash, not a stateful generator.
"""
