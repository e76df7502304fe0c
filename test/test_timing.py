"""Stage timing: nested stages are exclusive."""

import time

from oxygen_ros.engine.timing import Stopwatch, median_time


def test_nested_stages_are_exclusive() -> None:
    sw = Stopwatch()
    with sw("manager"):
        time.sleep(0.01)
        with sw("decode"):
            time.sleep(0.03)
    assert 0.03 <= sw.times["decode"] < 0.06
    assert 0.01 <= sw.times["manager"] < 0.03  # the inner 30 ms are not counted twice


def test_median_time() -> None:
    assert 0.004 <= median_time(lambda: time.sleep(0.005), repeats=3) < 0.05
