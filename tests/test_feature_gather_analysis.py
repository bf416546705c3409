"""The feature-gathering doc's tables computed from rows (analysis/doc_tables/feature_gather.py)."""

import pandas as pd
import pytest

from analysis.doc_tables.feature_gather import cpu_per_gb


def measurement(variant, dtype, row_bytes, repetition, cpu_time, bandwidth=1.0, time=1.0) -> list[dict]:
    """The rows one gather records: CPU time, bandwidth and wall time, one row each."""
    key = {"variant": variant, "dtype": dtype, "row_bytes": row_bytes, "repetition": repetition}
    values = {"cpu_time": cpu_time, "bandwidth": bandwidth, "time": time}
    return [{**key, "metric": metric, "value": value} for metric, value in values.items()]


def test_cpu_cost_takes_the_median_over_both_dtypes_measured_at_one_row_size():
    """64 B rows measured as fp32 and as bf16: both count, neither stands in for the other."""
    rows = measurement("cpu_gather", "fp32", 64, 0, cpu_time=1.0) + measurement("cpu_gather", "bf16", 64, 0, 3.0)
    rows += measurement("cpu_gather", "fp32", 128, 0, cpu_time=5.0, bandwidth=2.0)  # 5 / (2 x 1) = 2.5
    assert cpu_per_gb(pd.DataFrame(rows))["cpu_gather"] == pytest.approx(2.5)  # median of 1, 2.5 and 3


def test_cpu_cost_refuses_two_rows_of_one_measurement_rather_than_keep_one():
    rows = measurement("cpu_gather", "fp32", 64, 0, cpu_time=1.0) + measurement("cpu_gather", "fp32", 64, 0, 3.0)
    with pytest.raises(ValueError):
        cpu_per_gb(pd.DataFrame(rows))
