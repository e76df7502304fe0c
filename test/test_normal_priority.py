"""oxygen_ros/util/sched.py: threads a native library raises to a real-time policy go back to SCHED_OTHER, and the
video encoder (SVT-AV1 raises itself and its caller to SCHED_FIFO 99 when run as root) leaves no thread real-time."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from oxygen_ros.robot.realtime import fifo_refusal
from oxygen_ros.util.sched import NormalPriority, realtime_threads

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").exists() or not hasattr(os, "sched_setscheduler"),
                                reason="needs Linux /proc and sched_setscheduler")


class RaisedThread:
    """A thread that puts itself on SCHED_FIFO ``priority`` and waits until stopped (a library's worker)."""

    def __init__(self, priority: int) -> None:
        self.started, self.stop = threading.Event(), threading.Event()
        self.priority = priority
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.started.wait(10)

    def _run(self) -> None:
        self.tid = threading.get_native_id()
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(self.priority))
        self.started.set()
        self.stop.wait(30)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


def policy(tid: int) -> tuple[int, int]:
    return os.sched_getscheduler(tid), os.sched_getparam(tid).sched_priority


@pytest.fixture
def fifo() -> None:
    if fifo_refusal():
        pytest.skip("this machine refuses SCHED_FIFO: nothing can raise a thread, nothing to put back")


@pytest.mark.usefixtures("fifo")
def test_threads_raised_in_the_block_go_back_and_the_owners_stay() -> None:
    me = threading.get_native_id()
    owner = RaisedThread(3)  # real-time before the block: its owner's choice, left alone
    try:
        with NormalPriority() as guard:
            os.sched_setscheduler(me, os.SCHED_FIFO, os.sched_param(99))  # as SVT-AV1 does to its caller
            worker = RaisedThread(99)
            assert {me, worker.tid} <= set(realtime_threads())
            assert guard.restore() == 2
            assert policy(me) == (os.SCHED_OTHER, 0) and policy(worker.tid) == (os.SCHED_OTHER, 0)
            assert policy(owner.tid) == (os.SCHED_FIFO, 3)
            assert guard.restore() == 0  # nothing raised since
            worker.close()
            os.sched_setscheduler(me, os.SCHED_RR, os.sched_param(5))
        assert guard.restored == 3  # the exit put the caller back too
        assert policy(me) == (os.SCHED_OTHER, 0) and policy(owner.tid) == (os.SCHED_FIFO, 3)
    finally:
        owner.close()
        os.sched_setscheduler(me, os.SCHED_OTHER, os.sched_param(0))


@pytest.mark.usefixtures("fifo")
def test_a_real_time_caller_gets_its_own_policy_back() -> None:
    me = threading.get_native_id()
    os.sched_setscheduler(me, os.SCHED_FIFO, os.sched_param(7))  # a loop thread that exports (say)
    try:
        with NormalPriority():
            os.sched_setscheduler(me, os.SCHED_FIFO, os.sched_param(99))
        assert policy(me) == (os.SCHED_FIFO, 7)
    finally:
        os.sched_setscheduler(me, os.SCHED_OTHER, os.sched_param(0))


def test_the_video_encoder_leaves_no_thread_real_time(tmp_path: Path) -> None:
    """On this host (root) SVT-AV1 raises the caller and ~40 encoder threads to SCHED_FIFO 99; where it does not
    (not root, another FFmpeg build), the check holds all the same."""
    pytest.importorskip("av")
    from oxygen_ros.export.contract import VideoSettings
    from oxygen_ros.export.writer import encode_video, pick_codec

    settings = VideoSettings()
    codec = pick_codec(settings)
    before = set(realtime_threads())
    frames = np.random.default_rng(0).integers(0, 255, (12, 48, 64, 3), dtype=np.uint8)
    encode_video(frames, tmp_path / "v.mp4", 10, codec, settings)
    assert (tmp_path / "v.mp4").stat().st_size > 100
    assert {tid: rt for tid, rt in realtime_threads().items() if tid not in before} == {}, codec
    assert os.sched_getscheduler(0) == os.SCHED_OTHER
    # a thread started afterwards inherits the caller's policy: normal
    got: list[int] = []
    t = threading.Thread(target=lambda: got.append(os.sched_getscheduler(0)))
    t.start()
    t.join()
    assert got == [os.SCHED_OTHER]
