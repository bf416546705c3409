"""Graphs for sampled GNN training: dataset-shaped synthetic graphs, cached on disk.

``spec.DATASETS`` holds the published statistics (``spec.GraphSpec`` also declares a
heterograph's node types and relations); ``generate.generate`` makes a seeded graph with those
statistics (scaled down for the small scales); ``store`` keeps graphs on disk in a
memory-mappable format and refuses a cached graph whose parameters differ or whose files are
truncated; ``published`` imports the real datasets; ``datasets.cached_graph`` gives a dataset's
graph by name, generated or imported once; ``shared`` puts a feature table in shared memory for
the processes of a data-parallel run.
"""
