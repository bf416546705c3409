"""One entry per dataset, for harness.entry (each trains every model and pipeline on it)."""

from functools import partial

from workloads.gnn_training.train import run_dataset

reddit = partial(run_dataset, "reddit")
products = partial(run_dataset, "products")
papers = partial(run_dataset, "papers")
papers_full = partial(run_dataset, "papers_full")
products_budgets = partial(run_dataset, "products_budgets")
papers_budgets = partial(run_dataset, "papers_budgets")
