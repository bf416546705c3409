"""One entry per world size, for harness.entry."""

from functools import partial

from workloads.gnn_multi_gpu.launch import run_world

world1 = partial(run_world, 1)
world2 = partial(run_world, 2)
world4 = partial(run_world, 4)
world8 = partial(run_world, 8)
