"""Scores against the recording, pure numpy: the action timing alignment (interpolation, chunks running past the
recording's end, replaced trajectories), the action metrics against a hand-computed case, annotations valid at a
time, and the edit distance."""

from __future__ import annotations

import numpy as np
import pytest

from oxygen_ros.evaluation.alignment import (
    Annotations,
    ReferenceSeries,
    Trajectory,
    action_times,
    merge_trajectories,
)
from oxygen_ros.evaluation.scoring import (
    ChunkRecord,
    edit_distance,
    normalized_edit_distance,
    score_chunks,
    score_language,
)

DT_NS = 10
DT_S = DT_NS / 1e9


@pytest.fixture
def reference() -> ReferenceSeries:
    """Joints a, b at t = 0, 10, 20, 30 ns; a rises by 1 per sample, b is constant 5."""
    return ReferenceSeries.from_samples(("a", "b"), [(t, [t / 10, 5.0]) for t in (30, 0, 20, 10)])


def test_interpolation_and_coverage(reference: ReferenceSeries) -> None:
    values, covered = reference.at(np.array([-1, 0, 5, 15, 30, 31]))
    assert covered.tolist() == [False, True, True, True, True, False]
    assert values[1:5].tolist() == [[0.0, 5.0], [0.5, 5.0], [1.5, 5.0], [3.0, 5.0]]
    assert np.isnan(values[[0, 5]]).all()
    assert action_times(5, 3, DT_NS).tolist() == [15, 25, 35]
    assert reference.select(["b"]).values[:, 0].tolist() == [5.0] * 4
    with pytest.raises(KeyError, match="c"):
        reference.select(["c"])


def test_metrics_hand_computed(reference: ReferenceSeries) -> None:
    # chunk 0, stamp 5: actions at 15, 25, 35 (past the end: uncovered); reference a = 1.5, 2.5, b = 5
    # chunk 1, stamp 0: actions at 10, 20, 30 (all covered); reference a = 1, 2, 3
    # chunk 2, stamp 30: actions at 40.. (nothing covered: not scored)
    chunks = [ChunkRecord(0, 5, np.array([[1.5, 5.0, 9.0], [3.5, 4.0, 9.0], [0.0, 0.0, 9.0]])),  # 3rd dim unscored
              ChunkRecord(1, 0, np.array([[1.2, 5.0, 0.0], [2.0, 5.0, 0.0], [3.0, 5.5, 0.0]])),
              ChunkRecord(2, 30, np.zeros((3, 3)))]
    s = score_chunks(chunks, ["a", "b", "c"], reference, ["a", "b"], DT_S, n_execute=1, tolerance=0.25)
    # errors (a, b): chunk 0: step 0 (0, 0), step 1 (1, -1); chunk 1: (0.2, 0), (0, 0), (0, 0.5)
    assert (s["chunks"], s["uncovered_chunks"], s["actions_scored"], s["horizon"]) == (2, 1, 5, 3)
    assert s["count_per_step"] == [2, 2, 1]
    assert s["mae"] == pytest.approx(2.7 / 10) and s["mse"] == pytest.approx((0.04 + 2 + 0.25) / 10)
    assert s["mae_per_joint"] == pytest.approx([1.2 / 5, 1.5 / 5])
    assert s["mse_per_joint"] == pytest.approx([1.04 / 5, 1.25 / 5])
    assert s["mae_per_step"] == pytest.approx([0.2 / 4, 2 / 4, 0.5 / 2])
    np.testing.assert_allclose(s["mae_per_step_joint"], [[0.1, 0.0], [0.5, 0.5], [0.0, 0.5]])
    assert s["first_action"]["chunks"] == 2 and s["first_action"]["mae"] == pytest.approx(0.2 / 4)
    assert s["first_action"]["mae_per_joint"] == pytest.approx([0.1, 0.0])
    assert s["executed"] == pytest.approx({"chunks": 2, "mae": 0.05, "mse": 0.01})  # the first action here
    assert s["chunk"]["mae"] == pytest.approx(s["mae"])
    # within 0.25: executed parts of both chunks (max 0 and 0.2); whole chunks: neither (1.0 and 0.5)
    assert s["within_tolerance"] == {"executed": 1.0, "chunk": 0.0}
    assert [c["covered_steps"] for c in s["per_chunk"]] == [2, 3]
    assert s["per_chunk"][0]["mae"] == pytest.approx(0.5) and s["per_chunk"][1]["first_mae"] == pytest.approx(0.1)
    assert np.asarray(s["sums"]["abs"]).sum() == pytest.approx(2.7)
    with pytest.raises(KeyError, match="z"):
        score_chunks(chunks, ["a", "b", "c"], reference, ["z"], DT_S, 1, 0.1)


def test_nothing_scored_gives_none(reference: ReferenceSeries) -> None:
    s = score_chunks([ChunkRecord(0, 100, np.zeros((2, 2)))], ["a", "b"], reference, ["a", "b"], DT_S, 1, 0.1)
    assert (s["chunks"], s["uncovered_chunks"], s["mae"], s["within_tolerance"]["chunk"]) == (0, 1, None, None)


def test_newer_trajectory_replaces_older_from_its_first_point() -> None:
    first = Trajectory(np.array([10, 20, 30, 40]), np.array([[1.0], [2.0], [3.0], [4.0]]))
    second = Trajectory(np.array([30, 40]), np.array([[7.0], [8.0]]))
    ref = merge_trajectories(["j"], [first, Trajectory(np.zeros(0, np.int64), np.zeros((0, 1))), second])
    assert ref.times_ns.tolist() == [10, 20, 30, 40] and ref.values[:, 0].tolist() == [1.0, 2.0, 7.0, 8.0]
    # one point per command, each one step ahead (the demo fleet's expert): all kept
    steps = [Trajectory(np.array([t + 10]), np.array([[float(t)]])) for t in (0, 10, 20)]
    assert merge_trajectories(["j"], steps).values[:, 0].tolist() == [0.0, 10.0, 20.0]


def test_annotations_and_language_scores() -> None:
    ann = Annotations("/ann", np.array([10, 20, 20]), ("pick", "carry (old)", "carry"))
    assert [ann.at(t) for t in (5, 10, 19, 20, 99)] == [None, "pick", "pick", "carry", "carry"]
    items = [{"stream": "s", "stamp_ns": 5, "text": "pick", "dropped": False},     # before any annotation
             {"stream": "s", "stamp_ns": 12, "text": " pick ", "dropped": False},  # exact after stripping
             {"stream": "s", "stamp_ns": 25, "text": "cary", "dropped": False},    # one deletion: 1/5
             {"stream": "s", "stamp_ns": 25, "text": "x", "dropped": True},
             {"stream": "other", "stamp_ns": 25, "text": "carry", "dropped": False}]
    s = score_language(items, {"s": ann})["s"]
    assert (s["outputs"], s["scored"], s["unannotated"], s["exact"]) == (3, 2, 1, 1)
    assert s["exact_match"] == 0.5 and s["edit_distance"] == pytest.approx((0 + 1 / 5) / 2)
    assert edit_distance("kitten", "sitting") == 3 and normalized_edit_distance("kitten", "sitting") == 3 / 7
    assert normalized_edit_distance("", "") == 0.0 and normalized_edit_distance("abc", "") == 1.0
