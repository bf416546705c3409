"""Zero-copy reads: GPU threads load rows of page-locked host memory directly over PCIe.

The smallest real kernel of the suite. The ceilings workload uses it to measure what SM-issued
reads of pinned host memory can reach; PyTorch-Direct's gather kernels build on the same idea.
"""
