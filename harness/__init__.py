"""Shared machinery of the suite: timing, resource accounting, provenance, results and config.

Every workload measures through :mod:`harness.timing` and writes through
:mod:`harness.results`; nothing else in the repository reads a clock or writes a results file.
"""
