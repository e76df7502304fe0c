"""The node's side of ``rtc.remainder_source: executor``: the chunk executor's ``oxygen_ros/ExecutedPlan``
messages, checked and reordered into the node's action order, kept in a :class:`PlanHistory` that the frame runner
reads the real-time chunking remainder from (see :mod:`oxygen_ros.policy.executed_plan`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from oxygen_ros.policy.executed_plan import ExecutedPlanRecord, PlanHistory

from .stamps import stamp_to_ns

__all__ = ["ExecutedPlanInput", "plan_record"]


def plan_record(msg, action_names: Sequence[str]) -> ExecutedPlanRecord | str:
    """An ExecutedPlan message as a record in ``action_names`` order, or why it cannot be one."""
    dims = len(msg.setpoint) if msg.setpoint else (len(msg.plan) // msg.plan_length if msg.plan_length else 0)
    if msg.plan_length == 0 or dims == 0:
        return "empty plan"
    if len(msg.plan) != msg.plan_length * dims:
        return f"plan has {len(msg.plan)} values, not plan_length {msg.plan_length} x {dims}"
    rows = np.asarray(msg.plan, dtype=np.float64).reshape(msg.plan_length, dims)
    names = list(msg.joint_names)
    if names:
        index = {n: i for i, n in enumerate(names)}
        missing = [n for n in action_names if n not in index]
        if missing or len(names) != dims:
            return f"plan joints {names} do not cover the node's actions (missing {missing})"
        rows = rows[:, [index[n] for n in action_names]]
    elif dims != len(action_names):
        return f"unnamed plan of {dims} dims for {len(action_names)} actions"
    return ExecutedPlanRecord(stamp_to_ns(msg.header.stamp), stamp_to_ns(msg.plan_start), stamp_to_ns(msg.dt), rows)


class ExecutedPlanInput:
    """Keeps the executor's plans; refused ones are counted with ``reject(reason, detail)``.

    ``remainder(stamp_ns)`` is the frame runner's ``executed_remainder``: the robot-unit actions due at
    ``stamp_ns + (k + 1) * dt`` (``horizon`` at most), None when no fresh plan covers the first.
    """

    def __init__(self, action_names: Sequence[str], dt_s: float, max_age_s: float, horizon: int,
                 clock_ns: Callable[[], int], reject: Callable[[str, str], None]) -> None:
        self.action_names, self.horizon, self.clock_ns, self.reject = tuple(action_names), horizon, clock_ns, reject
        self.history = PlanHistory(dt_s, max_age_s)
        self.received = 0
        self.newest_used_ns: int | None = None  # the newest plan's stamp when the last remainder was built

    def on_plan(self, msg) -> None:
        """Subscription callback."""
        self.received += 1
        record = plan_record(msg, self.action_names)
        if isinstance(record, str):
            if record != "empty plan":  # the executor holds without a plan: nothing to guide toward, not an error
                self.reject("executed_plan", record)
            return
        why = self.history.add(record)
        if why is not None:
            self.reject("executed_plan", why)

    def remainder(self, stamp_ns: int) -> np.ndarray | None:
        self.newest_used_ns = self.history.newest_stamp_ns
        return self.history.remainder(stamp_ns, self.clock_ns(), self.horizon)
