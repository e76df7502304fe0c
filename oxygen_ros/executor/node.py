"""The chunk executor node (``oxygen_executor``): action chunks in, one timed, limited setpoint per command period
out, and what it executed on ``~/executed``. Its own process (``oxygen-executor``), so inference never delays a
setpoint.

    python -m oxygen_ros.executor --ros-args -p output:=float64_array -p output_joints:="[j1, j2]" \\
        -p output_topic:=/forward_position_controller/commands

Topics (node name ``oxygen_executor``; relative names follow the namespace):

  in   chunk_topic (oxygen/action_chunk)   oxygen_ros/ActionChunk, reliable
  in   joint_states_topic (joint_states)   sensor_msgs/JointState, best effort (matches any publisher)
  in   halt_topic (oxygen/halt)            std_msgs/Bool (transient-local and volatile subscriptions): true holds
  in   limits.robot_description            std_msgs/String, transient local: the URDF's joint limits
  out  output_topic (~/command)            Float64MultiArray | JointState | JointTrajectory (``output``)
  out  ~/executed                          oxygen_ros/ExecutedPlan, every command period
  out  /diagnostics                        diagnostic_msgs/DiagnosticArray, 1 Hz (status ``<node>: executor``)

A lifecycle node, as ros2_control's controllers: configure (parameters, limits, the process's real-time settings),
activate (the command loop starts, the first setpoint from the measured position), deactivate (the setpoint held
for ``deactivate_hold_s``, then publishing stops); ``autostart`` (default) does configure and activate at startup.

Setpoints come from a command loop of its own (:mod:`.loop`, ``loop: thread``): a thread that sleeps to absolute
monotonic deadlines (``use_sim_time``: it follows /clock), with the ``rt.*`` settings applied to that thread only
(:mod:`.rt`). Inputs arrive on the rclpy executor and only hand data to the streamer under a short lock
(:mod:`.streamer`). ``loop: timer`` keeps the former rclpy timer (for the timing benchmark's comparison).
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rcl_interfaces.msg import ParameterDescriptor
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.clock import Clock, ClockType
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from sensor_msgs.msg import JointState
from std_msgs.msg import Bool, Float64MultiArray
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.msg import ActionChunk, ExecutedPlan
from oxygen_ros.robot.limits import JointLimit, joint_limit_names, merge_limits
from oxygen_ros.robot.newest import NewestPerPublisher
from oxygen_ros.ros import qos
from oxygen_ros.ros.param_io import declare_specs, read_specs_of
from oxygen_ros.ros.robot_description import subscribe_robot_description

from .aggregation import parse_aggregate
from .loop import CommandLoop
from .outputs import JointOrder, OutputWriter, chunk_from_msg, executed_msg
from .params import EXECUTOR_PARAMS, ExecutorParams, validate
from .rt import RtReport, apply_process
from .streamer import Setpoint, SetpointStreamer
from .timeline import Timeline

__all__ = ["EXECUTED_TOPIC", "NODE_NAME", "ExecutorNode"]

NODE_NAME = "oxygen_executor"
EXECUTED_TOPIC = "~/executed"
_OUTPUT_TYPES = {"float64_array": Float64MultiArray, "joint_state": JointState, "trajectory": JointTrajectory}
_WARN_STATES = ("stale", "halted", "exhausted", "waiting_joint_states")
SUCCESS = TransitionCallbackReturn.SUCCESS


class ExecutorNode(LifecycleNode):
    """See the module docstring. Parameters are checked at construction.

    Raises:
        oxygen_ros.executor.params.ParamError: invalid parameters (every problem listed).
    """

    def __init__(self, node_name: str = NODE_NAME, **kwargs: Any) -> None:
        super().__init__(node_name, **kwargs)
        declare_specs(self, EXECUTOR_PARAMS)
        values = read_specs_of(self, EXECUTOR_PARAMS)
        for name in joint_limit_names(getattr(self, "_parameter_overrides", {})):
            self.declare_parameter(name, None, ParameterDescriptor(
                description="joint limit (limits.<joint>.min / .max / .max_velocity / .max_acceleration)",
                dynamic_typing=True))
            values[name] = self.get_parameter(name).value
        self.params: ExecutorParams = validate(values)
        p = self.params
        self._lock = threading.Lock()
        self._renames = p.joint_renames
        timeline = Timeline(p.switch, parse_aggregate(p.aggregate) if p.switch == "aggregate" else None)
        default_names = tuple(self._renames.get(n, n) for n in p.action_names)
        rate = p.command_rate_hz or p.action_rate_hz
        self.streamer = SetpointStreamer(timeline, p.interpolation, round(1e9 / rate) if rate else 0,
                                         round(p.stale_timeout_s * 1e9), p.on_stale, default_names)
        self._urdf: dict[str, JointLimit] = {}
        self._robot = ""
        self.streamer.set_limits(merge_limits({}, p.joint_limits))
        self._joints: dict[str, tuple[float, int]] = {}  # name -> (position, arrival ns, node clock)
        self._action_names: tuple[str, ...] = ()  # the chunks' own names (ExecutedPlan)
        self._order: JointOrder | None = None
        self._writer: OutputWriter | None = None
        self._order_error = ""
        self._last: Setpoint | None = None
        self.counts = {"output_withheld.limits_missing": 0, "output_withheld.output_joints": 0,
                       "chunks.malformed": 0}
        self._newest_halt = NewestPerPublisher()

        inputs, tick_group = MutuallyExclusiveCallbackGroup(), MutuallyExclusiveCallbackGroup()
        self.create_subscription(ActionChunk, p.chunk_topic, self._on_chunk, qos.reliable(), callback_group=inputs)
        self.create_subscription(JointState, p.joint_states_topic, self._on_joints, qos.best_effort(),
                                 callback_group=inputs)
        qos.subscribe_latched_and_volatile(self, Bool, p.halt_topic, self._on_halt, inputs)
        if p.limits_robot_description:
            subscribe_robot_description(
                self, p.limits_robot_description, self._apply_urdf,
                lambda error: self.get_logger().error(f"robot_description not used: {error}"), inputs)
        self._out_pub = self.create_publisher(_OUTPUT_TYPES[p.output], p.output_topic, 10)
        self._executed_pub = self.create_publisher(ExecutedPlan, EXECUTED_TOPIC, 10)
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._tick_group = tick_group
        self._timer = None
        self.loop: CommandLoop | None = None
        self.rate_hz = 0.0
        self._sim_time = bool(self.get_parameter("use_sim_time").value)
        self.rt = RtReport()
        self._gc_frozen = 0
        self._active = False
        self._rate = rate
        steady = Clock(clock_type=ClockType.STEADY_TIME)
        self.create_timer(1.0, self._publish_diagnostics, MutuallyExclusiveCallbackGroup(), clock=steady)
        self._autostart_timer = self.create_timer(0.01, self._autostart, clock=steady) if p.autostart else None

    # ------------------------------------------------------------------------------------------ lifecycle
    @property
    def active(self) -> bool:
        return self._active

    def _autostart(self) -> None:
        if self._autostart_timer is not None:
            self.destroy_timer(self._autostart_timer)
            self._autostart_timer = None
        if self.trigger_configure() != SUCCESS or self.trigger_activate() != SUCCESS:
            self.get_logger().error("autostart: configure / activate failed")

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Parameters (checked at construction), limits, the process's real-time settings."""
        p, rate = self.params, self._rate
        self.rt = apply_process(p.rt_switch_interval_s, p.rt_mlockall)
        self.get_logger().info(
            f"executor: {p.chunk_topic} -> {p.output} on {self.resolve_topic_name(p.output_topic)}, switch "
            f"{p.switch}{f' ({p.aggregate})' if p.switch == 'aggregate' else ''}, interpolation {p.interpolation}, "
            + (f"{rate:g} Hz" if rate else "rate from the first chunk (1 / ActionChunk.dt)")
            + f", loop {p.loop}{' on /clock' if self._sim_time else ''}")
        if p.rt_gc_freeze:  # what configure made lives on outside the collector; collections run at 1 Hz, off the loop
            gc.collect()
            gc.freeze()
            gc.disable()
            self._gc_frozen = gc.get_freeze_count()
            self.rt.values["rt.gc"] = f"frozen {self._gc_frozen} objects, collected at 1 Hz off the loop"
        else:
            self.rt.values["rt.gc"] = "automatic"
        return SUCCESS

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Start the command loop; the first setpoint starts from the measured position."""
        with self._lock:
            self.streamer.resume(self._now_ns())
        self._active = True
        if self.rate_hz or self._rate:
            self._start_loop(self.rate_hz or self._rate)
        self._log_rt()
        return SUCCESS

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Hold the setpoint (published unchanged for ``deactivate_hold_s``), then stop publishing."""
        with self._lock:
            self.streamer.suspend()
        self._active = False
        time.sleep(self.params.deactivate_hold_s)  # the loop keeps publishing the held setpoint meanwhile
        self.stop_loop()
        self.get_logger().info("deactivated: setpoint held, publishing stopped")
        return SUCCESS

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.stop_loop()
        return SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.stop_loop()
        return SUCCESS

    def _now_ns(self) -> int:
        return self.get_clock().now().nanoseconds

    def _start_loop(self, rate_hz: float) -> None:
        self.rate_hz = float(rate_hz)
        period_ns = round(1e9 / rate_hz)
        self.streamer.period_ns = period_ns
        p = self.params
        if p.loop == "timer":
            if self._timer is not None:
                return
            self._timer = self.create_timer(1.0 / rate_hz, self._tick, self._tick_group)  # node clock
            self.rt.values["rt.policy"] = "rclpy timer (rt.priority / rt.cpus not applied)"
            return
        if self.loop is not None and self.loop.alive:
            return
        self.loop = CommandLoop(period_ns, self._tick_at, self.get_clock() if self._sim_time else None,
                                p.rt_priority, p.rt_cpus)
        self.loop.start()
        self.rt = RtReport({**self.rt.values, **self.loop.rt.values}, self.rt.warnings + self.loop.rt.warnings)

    def _log_rt(self) -> None:
        log = self.get_logger()
        log.info("real-time: " + ", ".join(f"{k[3:]} {v}" for k, v in self.rt.values.items()))
        for w in self.rt.warnings:
            log.warning(w)

    def stop_loop(self, timeout: float = 5.0) -> bool:
        """Stop the command loop (before the node is destroyed); True when it has ended."""
        if getattr(self, "_timer", None) is not None:  # (also on a node whose construction failed)
            self.destroy_timer(self._timer)
            self._timer = None
        loop = getattr(self, "loop", None)
        return loop.stop(timeout) if loop is not None else True  # a stopped loop is not started again: a new one

    def destroy_node(self) -> None:
        self.stop_loop()
        super().destroy_node()

    # ------------------------------------------------------------------------------------------ inputs
    def _on_chunk(self, msg: ActionChunk) -> None:
        now = self._now_ns()
        if not self._active:
            with self._lock:
                self.streamer.rejected["inactive"] = self.streamer.rejected.get("inactive", 0) + 1
            return
        try:
            chunk = chunk_from_msg(msg, self._renames, self.params.action_names)
        except ValueError as e:
            self.counts["chunks.malformed"] += 1
            self.get_logger().warning(f"chunk {msg.frame_index} not used: {e}", throttle_duration_sec=5.0)
            return
        with self._lock:
            why = self.streamer.offer(chunk, now)
            if why is None and not self._action_names:
                self._action_names = tuple(msg.joint_names) or tuple(self.params.action_names) \
                    or self.streamer.names
                try:
                    self._order = JointOrder(self.streamer.names, self.params.output_joints)
                except ValueError as e:
                    self._order_error = str(e)
                    self.get_logger().error(f"no setpoint can be published: {e}")
        if why is None and not self.rate_hz:  # the command rate follows the chunks' dt
            self._start_loop(1e9 / chunk.dt_ns)
            self.get_logger().info(f"command rate {self.rate_hz:g} Hz (1 / ActionChunk.dt)")
            self._log_rt()

    def _on_joints(self, msg: JointState) -> None:
        now = self._now_ns()
        with self._lock:
            for name, pos in zip(msg.name, msg.position, strict=False):
                self._joints[name] = (float(pos), now)

    def _on_halt(self, msg: Bool, info: dict) -> None:
        if not self._newest_halt.is_new(info):
            return
        with self._lock:
            changed = self.streamer.set_halted(bool(msg.data), self._now_ns())
        if changed:
            log = self.get_logger()
            log.warning("halt: holding the current setpoint") if msg.data else \
                log.info("halt released: the next chunk observed from now on starts from the measured position")

    def _apply_urdf(self, robot: str, limits: dict[str, JointLimit]) -> str:
        with self._lock:
            self._urdf, self._robot = limits, robot
            self.streamer.set_limits(merge_limits(limits, self.params.joint_limits))
        return f"limits for {len(limits)} joints"

    def _measured(self, now_ns: int) -> np.ndarray | None:
        names = self.streamer.names
        if not names:
            return None
        max_age = self.params.max_joint_age_s * 1e9
        out = np.full(len(names), np.nan)
        for i, n in enumerate(names):
            got = self._joints.get(n)
            if got is not None and (not max_age or now_ns - got[1] <= max_age):
                out[i] = got[0]
        return out

    # ------------------------------------------------------------------------------------------ the tick
    def _tick(self) -> None:
        """The rclpy timer's tick (``loop: timer``)."""
        self._tick_at(self._now_ns())

    def _tick_at(self, now: int) -> None:
        """One setpoint at node time ``now`` (the command loop's thread, or the timer's). No logging here."""
        with self._lock:
            sp = self.streamer.tick(now, self._measured(now))
            self._last = sp
            publish = sp.position is not None and self._order is not None
            if publish and self.params.limits_required and self.streamer.limiter.missing:
                self.counts["output_withheld.limits_missing"] += 1
                publish = False
            if sp.position is not None and self._order is None and self._order_error:
                self.counts["output_withheld.output_joints"] += 1
            if publish and (self._writer is None or self._writer.order is not self._order):
                self._writer = OutputWriter(self.params.output, self._order, 1.0 / self.rate_hz,
                                            self.params.interpolation != "hold")  # once: the message is reused
            out = self._writer(sp) if publish else None
            executed = executed_msg(sp, self._action_names)
        if out is not None:
            self._out_pub.publish(out)
        self._executed_pub.publish(executed)

    # ------------------------------------------------------------------------------------------ diagnostics
    def _publish_diagnostics(self) -> None:
        if self.params.rt_gc_freeze:  # the collector's pass, here rather than in the command loop
            t0 = time.perf_counter()
            self._gc_passes = getattr(self, "_gc_passes", 0) + 1
            gc.collect(2 if self._gc_passes % 60 == 0 else 1)  # the oldest generation once a minute
            self.rt.values["rt.gc_pass_ms"] = f"{(time.perf_counter() - t0) * 1e3:.2f}"
        loop = self.loop
        with self._lock:
            sp = self._last
            values = {"state": sp.state if sp else "no_tick", "lifecycle": "active" if self._active else "inactive",
                      "command_rate_hz": f"{self.rate_hz:g}",
                      "output": self.params.output, "switch": self.params.switch,
                      "interpolation": self.params.interpolation, "limits.robot": self._robot or "none",
                      "joint_states.joints": len(self._joints),
                      "loop": self.params.loop, **self.rt.values, **(loop.stats() if loop else {}),
                      **self.streamer.diagnostics(), **self.counts}
        failure = loop.failure if loop is not None else None
        status = DiagnosticStatus(name=f"{self.get_name()}: executor", hardware_id=self.get_fully_qualified_name())
        state = values["state"]
        status.level = DiagnosticStatus.WARN if state in _WARN_STATES or self._order_error else DiagnosticStatus.OK
        if failure is not None:
            status.level = DiagnosticStatus.ERROR
        status.message = (f"command loop failed: {failure!r}" if failure is not None else "") or self._order_error or {
            "stale": f"stale: no chunk for stale_timeout_s={self.params.stale_timeout_s:g} s "
                     f"({'holding' if self.params.on_stale == 'hold' else 'stopped'})",
            "halted": "halted: holding the setpoint", "exhausted": "underrun: the chunk ran out, holding",
            "waiting_joint_states": "waiting for joint_states to start from"}.get(state, state)
        status.values = [KeyValue(key=k, value=str(v)) for k, v in values.items()]
        msg = DiagnosticArray(status=[status])
        msg.header.stamp = self.get_clock().now().to_msg()
        self._diag_pub.publish(msg)
