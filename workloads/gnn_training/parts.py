"""One entry per dataset, for harness.entry (each trains every model and pipeline on it)."""

from functools import partial

from workloads.gnn_training import BUDGET_SWEEPS
from workloads.gnn_training.train import run_dataset

reddit = partial(run_dataset, "reddit")
products = partial(run_dataset, "products")
papers = partial(run_dataset, "papers")
papers_full = partial(run_dataset, "papers_full")
# The budget sweeps, one function per part as harness.topic looks them up by name.
globals().update({name: partial(run_dataset, name) for name in BUDGET_SWEEPS})
