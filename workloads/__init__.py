"""Workloads: what is measured (data, models, sweeps), one subpackage per topic."""
