"""Graphs for sampled GNN training: dataset-shaped synthetic graphs, cached on disk.

``spec.DATASETS`` holds the published statistics; ``generate.generate`` makes a seeded graph with
those statistics (scaled down for the small scales); ``store`` keeps graphs on disk in a
memory-mappable format and refuses a cached graph whose parameters differ or whose files are
truncated.
"""
