"""oxygen_ros.util: the host's CPU as /proc/cpuinfo reports it, and the percentiles the reports give."""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import pytest

from oxygen_ros.util.host import cpu_flags, cpu_name
from oxygen_ros.util.stats import nearest_rank, percentile, summary


def test_percentile_interpolates_and_scales() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 50) == 2.5 and percentile(values, 100, scale=1e3) == 4000.0
    assert percentile([], 50) is None and percentile(np.array([]), 99) is None


def test_nearest_rank_is_an_observed_value() -> None:
    values = list(range(1, 51))  # 50 samples: p99 is their maximum, p50 the 25th
    assert nearest_rank(values, 99) == 50 and nearest_rank(values, 50) == 25 and nearest_rank([7.5], 99) == 7.5
    with pytest.raises(ValueError, match="no values"):
        nearest_rank([], 99)


def test_summary_counts_and_empty() -> None:
    s = summary([1.0, 2.0, 3.0, 10.0])
    assert s == {"count": 4, "mean": 4.0, "p50": 2.5, "p90": pytest.approx(7.9), "p99": pytest.approx(9.79),
                 "max": 10.0}
    assert summary([]) == {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    assert set(summary([1.0], qs=(95,))) == {"count", "mean", "p95", "max"}


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="needs Linux /proc/cpuinfo")
def test_cpu_name_and_flags_from_cpuinfo() -> None:
    text = Path("/proc/cpuinfo").read_text()
    names = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")]
    assert cpu_name() == (names[0] if names else "")
    if platform.machine() == "x86_64":  # every x86-64 CPU has SSE2 (ARM lists "Features", not "flags")
        assert "sse2" in cpu_flags()
