"""The executor's core, without ROS: chunks in (:meth:`SetpointStreamer.offer`), one limited setpoint per command
tick out (:meth:`SetpointStreamer.tick`), with the hold / halt / stale rules. The node (:mod:`.node`) feeds it
node-clock times and measured joint positions and publishes what it returns.

Per tick at node time ``now``:

- **inactive** (:meth:`SetpointStreamer.suspend`, the lifecycle's deactivate): held exactly, as halted; chunks are
  not used; :meth:`SetpointStreamer.resume` (activate) starts afresh from the measured position with the chunks
  observed from then on.
- **halted** (``halt``): the setpoint stays exactly where it was (a halt stops at once); the plan is dropped, and
  chunks observed before the release are never used. No jump back when released: the next chunk starts from the
  measured position.
- **no chunk yet**, or **waiting** after a halt / stale stop: nothing to command (before the first setpoint), or the
  last setpoint held.
- **stale** (no chunk arrived for ``stale_timeout_s``): ``on_stale: hold`` keeps commanding the last setpoint
  (brought to rest within the limits), ``stop`` commands nothing; counted once per stale period.
- **following**: the interpolated plan at ``now`` (:mod:`.interpolation`), limited from the previous setpoint
  (:mod:`.setpoint_limits`). Past the plan's last action it holds that action (``on_exhausted: hold``, counted as an
  underrun once per plan, and per tick); it never extrapolates.
- The **first setpoint** after start, and after a halt or a stale period, starts from the measured joint position
  at rest: rate-limited, never a jump (without a measured position for every joint it waits before the first
  setpoint; later it starts from the held setpoint). Its step spans the real time since the previous tick when
  that tick commanded a setpoint (a held one), else one command period. After an underrun the path continues from
  the held setpoint, which the executor commanded all along.
- The **velocity** of every setpoint is the one commanded: its step over the real time since the previous setpoint,
  so it always agrees with successive positions (never the path's own slope, which a limited setpoint does not
  follow).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .interpolation import Curve
from .setpoint_limits import SetpointLimiter
from .timeline import Chunk, Timeline

__all__ = ["ON_STALE", "Setpoint", "SetpointStreamer"]

ON_STALE = ("hold", "stop")


@dataclass
class Setpoint:
    """One tick's outcome. ``position`` None: command nothing this tick. ``plan`` [N, D]: the actions ahead,
    row i due at ``plan_start_ns + i * dt_ns``."""

    stamp_ns: int
    position: np.ndarray | None
    velocity: np.ndarray | None
    holding: bool
    # following | exhausted | halted | inactive | stale | not_started | waiting_for_chunk | waiting_joint_states
    state: str
    chunk: Chunk | None = None
    step: int = -1
    plan_start_ns: int = 0
    dt_ns: int = 0
    plan: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))


class SetpointStreamer:
    """See the module docstring.

    Args:
        timeline: chunk switching (replace / aggregate).
        interpolation: hold | linear | cubic.
        period_ns: the command period (the first setpoint's step from the measured position).
        stale_timeout_ns: no chunk for this long is stale (0 = never).
        on_stale: hold | stop.
        names: the action names when chunks carry none.
    """

    def __init__(self, timeline: Timeline, interpolation: str, period_ns: int, stale_timeout_ns: int = 0,
                 on_stale: str = "hold", names: tuple[str, ...] = ()) -> None:
        if on_stale not in ON_STALE:
            raise ValueError(f"on_stale must be one of {ON_STALE}, got {on_stale!r}")
        self.timeline, self.interpolation = timeline, interpolation
        self.period_ns, self.stale_timeout_ns, self.on_stale = int(period_ns), int(stale_timeout_ns), on_stale
        self.default_names = tuple(names)
        self.names: tuple[str, ...] | None = None  # fixed by the first chunk used
        self.limiter: SetpointLimiter | None = None
        self._limits: dict = {}
        self.halted = False
        self.suspended = False
        self._last: tuple[int, np.ndarray, np.ndarray] | None = None  # (time, setpoint, velocity) commanded
        self._prev_tick: tuple[int, bool] | None = None  # the previous tick: (time, whether it commanded a setpoint)
        self._curve: Curve | None = None
        self._plan_id: int | None = None
        self._restart = True  # the next setpoint starts from the measured position
        self._last_arrival_ns: int | None = None
        self._stale = False
        self._exhausted_plan: int | None = None
        self._reported: Chunk | None = None
        self.counts = {"underruns": 0, "underrun_ticks": 0, "stale": 0, "halts": 0, "setpoints": 0,
                       "waiting_joint_states": 0}
        self.rejected: dict[str, int] = {}

    # ------------------------------------------------------------------------------------------ inputs
    def set_limits(self, limits: dict) -> None:
        """Per joint :class:`~oxygen_ros.robot.limits.JointLimit` (URDF merged with the parameters)."""
        self._limits = dict(limits)
        if self.limiter is not None:
            self.limiter.set_limits(self._limits)

    def offer(self, chunk: Chunk, now_ns: int) -> str | None:
        """A chunk arrived at ``now_ns``: None when used, else the reason (counted)."""
        names = chunk.names or self.default_names
        if self.names is not None and (names != self.names or chunk.actions.shape[1] != len(self.names)):
            self.rejected["names_changed"] = self.rejected.get("names_changed", 0) + 1
            return "names_changed"
        if names and len(names) != np.asarray(chunk.actions).shape[-1]:
            self.rejected["malformed"] = self.rejected.get("malformed", 0) + 1
            return "malformed"
        if self.halted or self.suspended:
            why = "halted" if self.halted else "inactive"
            self.rejected[why] = self.rejected.get(why, 0) + 1
            return why
        why = self.timeline.offer(chunk if chunk.names else _named(chunk, names), now_ns)
        if why is None:
            self._last_arrival_ns = now_ns
            if self.names is None:
                self.names = tuple(names) if names else tuple(f"action_{j}" for j in range(chunk.actions.shape[1]))
                self.limiter = SetpointLimiter(self.names, self._limits)
            if self._stale:
                self._stale, self._restart = False, True
        return why

    def set_halted(self, halted: bool, now_ns: int) -> bool:
        """Halt or release at ``now_ns``; returns whether this changed anything."""
        if bool(halted) == self.halted:
            return False
        self.halted = bool(halted)
        if halted:
            self.counts["halts"] += 1
            self.timeline.clear()
        else:  # chunks observed before the release are never used; the next setpoint starts from the robot
            self.timeline.clear(released_ns=now_ns)
            self._restart = True
        return True

    def suspend(self) -> None:
        """Inactive (lifecycle deactivate): hold the last setpoint exactly; no chunk is used."""
        self.suspended = True
        self.timeline.clear()

    def resume(self, now_ns: int) -> None:
        """Active again at ``now_ns``: the next setpoint starts from the measured position, with chunks observed
        from now on."""
        if self.suspended:
            self.suspended = False
            self.timeline.clear(released_ns=now_ns)
        self._restart = True

    # ------------------------------------------------------------------------------------------ the tick
    def tick(self, now_ns: int, measured: np.ndarray | None = None) -> Setpoint:
        """The setpoint for node time ``now_ns``; ``measured``: each action joint's measured position (NaN =
        unknown), in :attr:`names` order."""
        plan = self.timeline.plan
        if plan is not None:
            self._reported = plan.chunk
        if self.halted or self.suspended:
            return self._hold(now_ns, "halted" if self.halted else "inactive", exact=True)
        if plan is None:
            return self._hold(now_ns, "not_started" if self._last is None else "waiting_for_chunk", exact=True)
        if self.stale_timeout_ns and self._last_arrival_ns is not None \
                and now_ns - self._last_arrival_ns > self.stale_timeout_ns:
            if not self._stale:
                self._stale = True
                self.counts["stale"] += 1
            if self.on_stale == "stop":
                self._restart = True
                return self._report(Setpoint(now_ns, None, None, True, "stale"))
            return self._hold(now_ns, "stale", exact=False)
        if self._restart or self._last is None:
            q = None if measured is None else np.asarray(measured, dtype=np.float64)
            if q is None or q.shape != (len(self.names),) or not np.isfinite(q).all():
                if self._last is None:
                    self.counts["waiting_joint_states"] += 1
                    return self._report(Setpoint(now_ns, None, None, True, "waiting_joint_states"))
                q = self._last[1]  # no measurement: restart from the last command
            # from rest, over the real time since the previous setpoint (else one period: nothing was commanded)
            prev = self._prev_tick
            t0 = prev[0] if prev is not None and prev[1] and prev[0] < now_ns else now_ns - self.period_ns
            self._last = (t0, q.copy(), np.zeros_like(q))
            self._restart, self._plan_id = False, None
        plan_id = self.timeline.accepted  # each used chunk makes a new plan
        if self._plan_id != plan_id:  # a new plan: the path starts at the last command (position and velocity)
            t0, p0, v0 = self._last
            self._curve = Curve.through(self.interpolation, t0, p0, v0, plan.times_ns, plan.values)
            self._plan_id = plan_id
        target, _ = self._curve.at(now_ns)
        exhausted = now_ns >= plan.end_ns
        if exhausted:
            self.counts["underrun_ticks"] += 1
            if self._exhausted_plan != plan_id:
                self._exhausted_plan = plan_id
                self.counts["underruns"] += 1
        out = self._command(now_ns, target)
        return self._report(Setpoint(now_ns, out[0], out[1], exhausted, "exhausted" if exhausted else "following"))

    def _command(self, now_ns: int, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The limited step toward ``target``: (setpoint, its velocity: the step over the real time since the
        previous setpoint)."""
        t0, p0, v0 = self._last
        p, v = self.limiter.step(p0, v0, target, (now_ns - t0) / 1e9) if now_ns > t0 else (p0.copy(), v0 * 0)
        self._last = (now_ns, p, v)  # the limiter continues from its own (finite-difference) velocity
        self.counts["setpoints"] += 1
        return p, v

    def _hold(self, now_ns: int, state: str, exact: bool) -> Setpoint:
        """Hold the last setpoint: exactly (halt: at once), or brought to rest within the limits."""
        if self._last is None:
            return self._report(Setpoint(now_ns, None, None, True, state))
        self._restart = True
        if exact or self.limiter is None:
            self._last = (now_ns, self._last[1], np.zeros_like(self._last[1]))
            self.counts["setpoints"] += 1
            p, v = self._last[1].copy(), self._last[2].copy()
        else:
            p, v = self._command(now_ns, self._last[1])
        return self._report(Setpoint(now_ns, p, v, True, state))

    def _report(self, sp: Setpoint) -> Setpoint:
        """Remember the tick; fill in the chunk in force, its step and the plan ahead (empty while holding other
        than exhausted)."""
        self._prev_tick = (sp.stamp_ns, sp.position is not None)
        chunk = self._reported
        if chunk is not None:
            sp.chunk, sp.step, sp.dt_ns = chunk, chunk.step_at(sp.stamp_ns), chunk.dt_ns
        plan = self.timeline.plan
        d = len(self.names) if self.names else 0
        sp.plan = np.zeros((0, d))
        if plan is not None and sp.state in ("following", "exhausted"):
            first, values = plan.ahead(sp.stamp_ns)
            sp.plan, sp.plan_start_ns = values, int(plan.chunk.due_ns(first))
        return sp

    # ------------------------------------------------------------------------------------------ diagnostics
    def diagnostics(self) -> dict[str, object]:
        values: dict[str, object] = {**self.counts, "chunks.used": self.timeline.accepted}
        for reason, n in sorted({**self.timeline.rejected, **self.rejected}.items()):
            values[f"chunks.not_used.{reason}"] = n
        if self.limiter is not None:
            for name, n in zip(self.limiter.names, self.limiter.limited, strict=True):
                lim = self.limiter.limits[name]
                if not lim.empty:
                    values[f"limits.{name}"] = lim.describe()
                    values[f"limits.{name}.limited_setpoints"] = int(n)
            values["limits.missing"] = ", ".join(self.limiter.missing) or "none"
        return values


def _named(chunk: Chunk, names: tuple[str, ...]) -> Chunk:
    return Chunk(chunk.stamp_ns, chunk.frame_index, chunk.dt_ns, chunk.actions, chunk.first_step, tuple(names))
