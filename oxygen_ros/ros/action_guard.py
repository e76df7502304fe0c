"""The node's output guard (docs/safety.md): everything a chunk passes between the runner and ``~/action_chunk`` /
``~/trajectory``, and the ROS interfaces that steer it.

:class:`ActionGuard` lives from configure to cleanup. It owns the joint limiter
(:mod:`oxygen_ros.robot.limiter`, fed by the URDF on ``limits.robot_description``), the enable gate and halt input
(:class:`~oxygen_ros.robot.gate.ActionGate`: ``~/enable``, ``~/halt``) and the frame watchdog
(:class:`~oxygen_ros.robot.watchdog.FrameWatchdog`); :meth:`ActionGuard.admit` is the one check every chunk passes.
Faults and the lifecycle stay with the node (they outlive a configuration).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from diagnostic_msgs.msg import DiagnosticStatus
from rcl_interfaces.msg import ParameterDescriptor
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node
from std_msgs.msg import Bool
from std_srvs.srv import SetBool

from oxygen_ros.policy.runner import ChunkOutput
from oxygen_ros.robot.gate import ActionGate
from oxygen_ros.robot.limiter import ActionLimiter
from oxygen_ros.robot.limits import JointLimit
from oxygen_ros.robot.newest import NewestPerPublisher
from oxygen_ros.robot.watchdog import FrameWatchdog
from oxygen_ros.runtime.params import NodeParams, joint_limit_names

from . import qos
from .diagnostics import NodeStats
from .input_store import InputStore
from .robot_description import subscribe_robot_description

__all__ = ["ENABLE_SERVICE", "HALT_TOPIC", "ActionGuard", "limit_parameters"]

ENABLE_SERVICE = "~/enable"
HALT_TOPIC = "~/halt"
_GATE_CLOSED = {"halted": "halted (~/halt is true)", "disabled": "disabled (~/enable)",
                "held": "held (a ~/run goal ended; a new goal or ~/enable releases it)"}


def limit_parameters(node: Node) -> dict[str, Any]:
    """Declare (once) and read the ``limits.<joint>.<field>`` parameters given as overrides (which joints have them
    is the user's choice, as with the language streams); names and values are checked by ``validate``."""
    values: dict[str, Any] = {}
    for name in joint_limit_names(getattr(node, "_parameter_overrides", {})):
        if not node.has_parameter(name):
            node.declare_parameter(name, None, ParameterDescriptor(
                description="joint limit override (limits.<joint>.min / .max / .max_velocity / .max_acceleration)",
                additional_constraints="type: float", dynamic_typing=True))
        values[name] = node.get_parameter(name).value
    return values


class ActionGuard:
    """Limits, gate and watchdog of a configured node, with ``~/enable``, ``~/halt`` and the robot description
    subscription (created here, at configure, so that a latched halt or URDF is known before the first chunk).

    Raises:
        ValueError: a ``limits.<joint>.*`` parameter names no action.
    """

    def __init__(self, node: Node, p: NodeParams, action_names: tuple[str, ...], stats: NodeStats) -> None:
        unknown = sorted(set(p.joint_limits) - set(action_names))
        if unknown:
            raise ValueError(f"limits.{unknown[0]}.*: {unknown} not among the action names {list(action_names)} "
                             "(action_names, else joint_names)")
        self._node, self._stats, self._log = node, stats, node.get_logger()
        self.chunk_age_limit_s = p.chunk_age_limit_s
        self.limiter = ActionLimiter(action_names, p.limits_policy, p.joint_limits, p.limits_required)
        self.gate = ActionGate(p.start_enabled, self._now_ns())
        self.watchdog = FrameWatchdog(p.watchdog_limit_s)
        group = MutuallyExclusiveCallbackGroup()
        self._newest_halt = NewestPerPublisher()  # a latched halt arrives on both subscriptions
        self._service = node.create_service(SetBool, ENABLE_SERVICE, self._on_enable, callback_group=group)
        # halt: a latched publisher's last message, and volatile publishers
        self._subscriptions = qos.subscribe_latched_and_volatile(node, Bool, HALT_TOPIC, self._on_halt, group)
        if p.limits_robot_description:
            self._subscriptions.append(subscribe_robot_description(
                node, p.limits_robot_description, self._apply_urdf,
                lambda error: self._stats.rejected_inputs.add("robot_description_invalid", error), group))
        if not p.start_enabled:
            self._log.info(f"start_enabled is false: no action chunk is published until "
                           f"{node.resolve_service_name(ENABLE_SERVICE)} is called with true")

    def _now_ns(self) -> int:
        return self._node.get_clock().now().nanoseconds

    def destroy(self) -> None:
        self._node.destroy_service(self._service)
        for sub in self._subscriptions:
            self._node.destroy_subscription(sub)

    # ------------------------------------------------------------------------------------------ inputs
    def _on_enable(self, request: SetBool.Request, response: SetBool.Response) -> SetBool.Response:
        changed = self.gate.set_enabled(request.data, self._now_ns())
        why = self.gate.why_closed()
        response.success = True
        response.message = ("enabled" if request.data else "disabled") + ("" if changed else " (already)") + \
            ("" if why is None or not request.data else f"; still no chunk: {why}")
        if changed:
            self._log.info(f"~/enable: {response.message}")
        return response

    def _on_halt(self, msg: Bool, info: dict) -> None:  # two arguments: rclpy passes the message info
        try:
            changed = self._newest_halt.is_new(info) and self.gate.set_halted(bool(msg.data), self._now_ns())
        except Exception as e:  # never kill the executor
            self._stats.errors.add("halt_callback", f"{type(e).__name__}: {e}")
            return
        if changed and msg.data:
            self._log.warning("halt: no action chunk is published until ~/halt is false")
        elif changed:
            self._log.info("halt released: chunks observed from now on are published")

    def _apply_urdf(self, robot: str, limits: dict[str, JointLimit]) -> str:
        uncovered = self.limiter.set_urdf(limits, robot)
        covered = len(self.limiter.names) - len(uncovered)
        return f"limits for {covered} of {len(self.limiter.names)} action joints" + \
            (f"; none for {uncovered}" if uncovered else "")

    # ------------------------------------------------------------------------------------------ frames
    def frame_began(self) -> None:
        self.watchdog.begin()

    def frame_ended(self) -> None:
        took = self.watchdog.end()
        if took is not None:
            self._log.warning(f"watchdog: the frame that exceeded watchdog_s ended after {took:.2f} s")

    def check_watchdog(self) -> None:
        """Report a frame that has just exceeded watchdog_s (call it often: the node's supervisor timer)."""
        running = self.watchdog.check()
        if running is not None:
            self._stats.warnings.add("watchdog", f"the frame has run {running:.2f} s > watchdog_s="
                                     f"{self.watchdog.limit_s:g}; its chunk is not published once older than "
                                     f"max_chunk_age_s={self.chunk_age_limit_s:g} s")
            self._log.error(f"watchdog: a frame has run {running:.2f} s (watchdog_s={self.watchdog.limit_s:g})")

    def admit(self, chunk: ChunkOutput, actions: np.ndarray, dt: float, now_ns: int,
              store: InputStore | None) -> np.ndarray | None:
        """What of ``actions`` (``chunk``'s rows from its action ``chunk.start`` on) may be published: as they are,
        clamped under limits.policy clamp, or None: non-finite, beyond the limits under reject, too old, or withheld
        by the gate (each counted with its reason)."""
        present = present_ns = None
        if store is not None:  # the newest measured position of each action joint that is also a state joint
            positions, arrivals = store.present_joints()
            index = {n: i for i, n in enumerate(store.joint_names)}
            cols = [index.get(n, -1) for n in self.limiter.names]
            present = np.array([positions[c] if c >= 0 else np.nan for c in cols])
            present_ns = np.array([arrivals[c] if c >= 0 else 0 for c in cols])
        checked = self.limiter.check(actions, dt, chunk.stamp_ns, now_ns, present, present_ns, chunk.start)
        for note in checked.notes:
            self._log.warning(note)
        if checked.actions is None:
            self._stats.dropped_outputs.add(checked.reason, checked.detail)
            return None
        age_s = (now_ns - chunk.stamp_ns) / 1e9
        if age_s > self.chunk_age_limit_s:
            self._stats.dropped_outputs.add("chunk_too_old", f"frame {chunk.frame_index}: observation {age_s:.2f} s "
                                            f"old > max_chunk_age_s={self.chunk_age_limit_s:g}")
            return None
        if self.gate.why_closed(chunk.stamp_ns) is not None:
            return None  # disabled or halted (counted by the gate, reported in /diagnostics)
        return checked.actions

    # ------------------------------------------------------------------------------------------ diagnostics
    def diagnostics(self) -> dict[str, object]:
        return {**self.gate.diagnostics(), **self.limiter.diagnostics(), **self.watchdog.diagnostics()}

    def annotate(self, status: DiagnosticStatus, active: bool) -> None:
        """ERROR while a frame is past the watchdog; while the gate is closed (and the node active), why no chunk is
        published (WARN when halted)."""
        watchdog = self.watchdog
        if watchdog.tripped:
            status.level = DiagnosticStatus.ERROR
            status.message = (f"watchdog: a frame has run {watchdog.running_s():.1f} s (watchdog_s="
                              f"{watchdog.limit_s:g}); no chunk is published")
        elif active and (why := self.gate.why_closed()) is not None:
            if why == "halted":
                status.level = max(status.level, DiagnosticStatus.WARN)
            status.message = f"{status.message}; no chunk published: {_GATE_CLOSED[why]}"
