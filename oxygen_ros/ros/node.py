"""The oxygen_ros lifecycle node: cameras, joint states and an instruction in; action chunks (published the moment
they are denoised) and language outputs out, one engine frame per control tick.

    python -m oxygen_ros.ros --ros-args --params-file config/tabletop.yaml
    ros2 run oxygen_ros oxygen_node --ros-args --params-file <config.yaml> -p checkpoint_path:=/path/to/ckpt

Topics (node name ``oxygen``; all names are relative, so a namespace or remapping moves them):

  in   <camera_topics>      sensor_msgs/Image or CompressedImage, QoS reliability = camera_reliability, depth 1
  in   instruction          std_msgs/String, reliable; subscribed both transient-local (a latched instruction
                            sent before the node started arrives) and volatile (volatile publishers match too)
  in   joint_states         sensor_msgs/JointState (joint_names picked by name; each joint's newest position is
                            used while it is younger than max_joint_age_s)
  out  ~/action_chunk       oxygen_ros/ActionChunk (stamp = observation time = newest camera stamp used)
  out  ~/language_output    oxygen_ros/LanguageOutput (stamp = the originating frame's observation time)
  out  ~/trajectory         trajectory_msgs/JointTrajectory (publish_trajectory; remap to a controller), stamped
                            with the observation time, points already in the past dropped
  out  /diagnostics         diagnostic_msgs/DiagnosticArray, 1 Hz
  srv  ~/enable             std_srvs/SetBool: publish chunks or not (start_enabled); see action_guard.py
  in   ~/halt               std_msgs/Bool: no chunk while true (transient-local and volatile subscriptions)
  in   robot_description    std_msgs/String, transient local: the URDF whose joint limits bound the actions
  in   rtc.executor_topic   oxygen_ros/ExecutedPlan (rtc.remainder_source: executor): the chunk executor's plan,
                            which real-time chunking guides the next chunk toward (executed_plan.py)
  act  ~/ask                oxygen_ros/action/Ask (ask.enabled): a question answered from the current observation,
                            decoded with the language streams (feedback every frame; the answer also on
                            ~/language_output, stream ask); see ask_server.py
  act  ~/run                oxygen_ros/action/RunTask (run.enabled): a task (instruction, success rule, time-out,
                            end behaviour), feedback every frame, cancel holds, preemption; see run_server.py

Action timing, everywhere: action i of a chunk is the target for ``stamp + (i + 1) * dt`` (ActionChunk.dt, the
trajectory's time_from_start, the simulator's execution).

Threads: the control timer (node clock) wakes a dedicated inference thread that runs the frame; subscriptions run on
the executor's thread, so images keep arriving while a frame is inferred. Stamps and image staleness use the node
clock (``use_sim_time`` follows /clock during bag replay).

Cameras: a callback only checks a message (sizes, encoding, data length, a JPEG / PNG header) and keeps it in its
camera's buffer (the last 4 images); images are decoded when a frame uses them, once. At each tick the observation
takes one image per camera, fresh (``max_image_age_s``) and synchronised: the set with the smallest spread of
stamps, the newest among equal spreads (message_filters' ApproximateTime rule,
:mod:`oxygen_ros.robot.camera_sync`), skipped as ``camera_skew`` when that spread exceeds ``max_camera_skew_s``.
**Observation stamp = the newest stamp of the chosen set** (ActionChunk and LanguageOutput stamps, the latency's
start: that image's arrival). Images stamped more than 0.1 s ahead of the node clock are rejected
(``image_from_future``). ``/diagnostics`` reports per camera its receive rate, newest-image age, received / lost
counts and incompatible-QoS events, and warns (also in the log, throttled) when a camera has publishers but no image
arrives, or when the middleware loses many of its images.
"""

from __future__ import annotations

import gc
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.clock import Clock, ClockType
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from sensor_msgs.msg import JointState
from trajectory_msgs.msg import JointTrajectory

from oxygen_ros.engine.threads import run_in_scratch_thread
from oxygen_ros.msg import ActionChunk, LanguageOutput
from oxygen_ros.policy.coverage import CoverageWatch, coverage_warning
from oxygen_ros.policy.hooks import install_runner_hook
from oxygen_ros.policy.runner import FrameRunner
from oxygen_ros.robot.faults import FaultCounter
from oxygen_ros.runtime.model_loader import (
    LoadedPolicy,
    action_period_s,
    build_runner,
    instruction_char_cap,
    load_node_policy,
    warm_up,
)
from oxygen_ros.runtime.params import PARAMS, RESERVED_STREAM_NAMES, STREAM_NAME_RE, STREAM_PARAMS, NodeParams, validate

from . import qos
from .action_guard import ActionGuard, limit_parameters
from .ask_server import AskServer
from .diagnostics import CameraWatch, NodeStats
from .executed_plan import ExecutedPlanInput
from .input_store import InputStore
from .node_diagnostics import NodeDiagnostics
from .node_frame import ControlFrame
from .node_inputs import NodeInputs
from .observation_builder import ObservationBuilder
from .param_io import declare_specs, read_specs_of
from .run_server import RunHooks, RunTaskServer

__all__ = ["ACTION_TOPIC", "LANGUAGE_TOPIC", "NODE_NAME", "TRAJECTORY_TOPIC", "OxygenNode"]

NODE_NAME = "oxygen"
ACTION_TOPIC = "~/action_chunk"
LANGUAGE_TOPIC = "~/language_output"
TRAJECTORY_TOPIC = "~/trajectory"
DIAGNOSTICS_TOPIC = "/diagnostics"
# Overrides that rclpy or rcl handle themselves: not reported as unknown parameters.
_BUILTIN_PARAMS = ("use_sim_time", "start_type_description_service")
SUCCESS, FAILURE, ERROR = TransitionCallbackReturn.SUCCESS, TransitionCallbackReturn.FAILURE, \
    TransitionCallbackReturn.ERROR


class OxygenNode(NodeInputs, ControlFrame, NodeDiagnostics, LifecycleNode):
    """pi0.5 VLA inference with a unified KV cache as a ROS 2 lifecycle node (see the module docstring).

    ``on_configure`` validates the parameters, loads the checkpoint with its I/O contract (policy layer), checks
    the parameters against it, builds the frame runner, runs a warm-up frame and creates the publishers;
    ``on_activate`` creates the inputs, subscriptions, inference thread and control timer; ``on_deactivate``
    destroys them (the model stays loaded); ``on_cleanup`` releases the model. With ``autostart`` (default) the
    node configures and activates itself once an executor spins it.
    """

    def __init__(self, node_name: str = NODE_NAME, **kwargs: Any) -> None:
        super().__init__(node_name, **kwargs)
        declare_specs(self, PARAMS)  # dynamic typing: types are checked at configure, with clear errors
        log = self.get_logger()
        self.stats = NodeStats(log=log.warning)
        self._input_group = ReentrantCallbackGroup()
        self._control_group = MutuallyExclusiveCallbackGroup()
        self._diag_group = MutuallyExclusiveCallbackGroup()
        self._steady = Clock(clock_type=ClockType.STEADY_TIME)
        self._engine_lock = threading.Lock()
        self._state = "unconfigured"
        self._faults = FaultCounter()  # survives the error processing: /diagnostics reports the last fault
        self._fault_pending = False
        self._stuck_worker: threading.Thread | None = None  # a frame that did not end when processing stopped
        self._publish_lock = threading.Lock()  # admit + publish of a chunk; a ~/run cancel holds the gate under it
        # observations stamped before this process's node existed never make a chunk (a respawned node must not
        # act on what was observed before its predecessor crashed); with use_sim_time before /clock: 0 (no guard)
        self.born_ns = self.get_clock().now().nanoseconds
        self._reset_runtime()
        self._diag_pub = self.create_publisher(DiagnosticArray, DIAGNOSTICS_TOPIC, 10)
        self._supervisor = self.create_timer(0.05, self._safe(self._supervise, "supervisor"),
                                             MutuallyExclusiveCallbackGroup(), clock=self._steady)
        self._diag_timer = self.create_timer(1.0, self._safe(self._publish_diagnostics), self._diag_group,
                                             clock=self._steady)
        autostart = self.get_parameter("autostart").value
        self._autostart_timer = None
        if autostart is not False:  # a wrongly typed value is reported by configure
            self._autostart_timer = self.create_timer(0.01, self._autostart, clock=self._steady)

    # ------------------------------------------------------------------------------------------ lifecycle
    def _reset_runtime(self) -> None:
        self.params: NodeParams | None = None
        self._loaded: LoadedPolicy | None = None
        self._runner: FrameRunner | None = None
        self._store: InputStore | None = None
        self._builder: ObservationBuilder | None = None
        self._input_subs: list = []
        self._camera_watch: CameraWatch | None = None
        self._action_pub = self._language_pub = self._trajectory_pub = None
        self._stream_pubs: dict[str, Any] = {}
        self._ask: AskServer | None = None
        self._run: RunTaskServer | None = None
        self._task_begins = False  # a ~/run goal was accepted: the next frame starts its task afresh
        self._control_timer = None
        self._worker: threading.Thread | None = None
        self._last_instruction = ""
        self._cut_instruction = ""
        self._frame_began = 0.0  # time.perf_counter() when the running frame began building its observation
        self._rtc_guided = 0  # chunks real-time chunking guided
        self._rtc_last_guided = False
        self._guard: ActionGuard | None = None  # limits, ~/enable, ~/halt, the watchdog (docs/safety.md)
        self._coverage: CoverageWatch | None = None  # does each published chunk last until the next one?
        self._coverage_note = ""  # the configure-time coverage warning ('' = none)
        self._executed: ExecutedPlanInput | None = None  # rtc.remainder_source executor: the executor's plans

    def _autostart(self) -> None:
        if self._autostart_timer is not None:
            self.destroy_timer(self._autostart_timer)
            self._autostart_timer = None
        if self.trigger_configure() != SUCCESS:
            self.get_logger().error("autostart: configure failed; the node stays unconfigured (fix the parameters, "
                                    "then call the configure transition)")
            return
        if self.trigger_activate() != SUCCESS:
            self.get_logger().error("autostart: activate failed")

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        t0 = time.perf_counter()
        try:
            # loading, engine building and warm-up on a thread that ends: the inference thread is then the only
            # OpenMP team in the process (engine/threads.py; two live teams slow every frame down)
            run_in_scratch_thread(self._configure, name="oxygen-configure")
        except Exception as e:  # every failure becomes a logged FAILURE, never a crash
            self.get_logger().error(f"configure failed: {e}")
            self._release()
            return FAILURE
        p, model = self.params, self._loaded.policy.model
        self.get_logger().info(
            f"configured in {time.perf_counter() - t0:.1f} s: {self._loaded.source} on {model.device} "
            f"(precision {self._loaded.policy.precision.describe()}), mode={p.mode} S={p.num_steps} "
            f"H={self._loaded.policy.spec.chunk_size} "
            f"(execute {self._runner.n_execute}) N={p.max_new_tokens} k={'auto' if p.k_auto else p.k}, graphs "
            f"{self._runner.engine.graph_stages}, kernels: {self._runner.engine.kernels}, cameras "
            + ", ".join(f"{c}<-{p.camera_topic(i)}" for i, c in enumerate(p.camera_names)))
        self._state = "inactive"
        return super().on_configure(state)

    def _configure(self) -> None:
        values = read_specs_of(self, PARAMS)
        values.update(self._stream_parameters(values["language_streams"]))
        values.update(limit_parameters(self))
        unknown = sorted(set(getattr(self, "_parameter_overrides", {})) - set(values) - set(_BUILTIN_PARAMS))
        unknown = [u for u in unknown if not u.startswith("qos_overrides.")]
        if unknown:
            self.get_logger().warning(f"ignoring unknown parameter(s) {unknown} (typo?)")
        p = validate(values)
        if p.torch_threads:
            torch.set_num_threads(p.torch_threads)
        torch.manual_seed(p.seed)
        self._loaded = loaded = load_node_policy(p)
        for note in loaded.notes:
            self.get_logger().info(note)
        self.params = p = loaded.params
        self._runner = build_runner(loaded)
        note = getattr(getattr(self._runner.engine, "runner", None), "compiled_note", "")
        if note:  # graphs auto on CPU: the compiled steps found, or the key looked for and the field that differed
            self.get_logger().info(note)
        warm = warm_up(loaded)
        if warm > p.period_s:
            self.get_logger().warning(f"warm-up frame took {warm * 1e3:.0f} ms, longer than the control period "
                                      f"{p.period_s * 1e3:.0f} ms: expect deadline misses")
        self._coverage = CoverageWatch(p.period_s)
        self._coverage_note = coverage_warning(self._runner.n_publish, action_period_s(p, self._runner.n_execute),
                                               p.period_s, warm, p.rtc_enabled) or ""
        if self._coverage_note:
            self.get_logger().warning(self._coverage_note)
        self._action_pub = self.create_lifecycle_publisher(ActionChunk, ACTION_TOPIC, 10)
        self._language_pub = self.create_lifecycle_publisher(LanguageOutput, LANGUAGE_TOPIC, 50)
        if p.language_topic_per_stream:
            self._stream_pubs = {s.name: self.create_lifecycle_publisher(LanguageOutput, f"~/language/{s.name}", 50)
                                 for s in p.streams}
        if p.publish_trajectory:
            self._trajectory_pub = self.create_lifecycle_publisher(JointTrajectory, TRAJECTORY_TOPIC, 10)
        if p.ask_enabled:  # goals are accepted while active
            self._ask = AskServer(self, self._runner, p, lambda: self._state == "active",
                                  self.stats.rejected_inputs.add)
        self._guard = ActionGuard(self, p, loaded.action_names, self.stats)
        if p.run_enabled:
            self._run = self._run_server(p)
        self._faults.reset(p.max_consecutive_faults)
        self._fault_pending = False
        install_runner_hook(self._runner, loaded.policy.model, self.get_logger().warning)  # tests only (unset: none)

    def _run_server(self, p: NodeParams) -> RunTaskServer:
        """The ``~/run`` action server, wired to the gate, the input store and the stats."""
        names = tuple(s.name for s in p.streams)
        subtask = p.subtask_conditioning or ("subtask" if "subtask" in names else None)
        gate = self._guard.gate

        def now_ns() -> int:
            return self.get_clock().now().nanoseconds

        def hold(held: bool) -> None:
            with self._publish_lock:  # a chunk being published is out before; none after
                gate.set_held(held, now_ns())

        def own(text: str) -> bool:
            store = self._store
            return store is not None and store.own_instruction(text)

        def release() -> None:
            store = self._store
            if store is not None:
                store.release_instruction()

        def new_task() -> None:
            self._task_begins = True  # the inference thread starts the task at its next frame (_run_frame)

        hooks = RunHooks(is_active=lambda: self._state == "active", why_closed=gate.why_closed, new_task=new_task,
                         enable=lambda: gate.set_enabled(True, now_ns()), hold=hold, own_instruction=own,
                         release_instruction=release, deadline_misses=lambda: self.stats.deadline_misses,
                         last_skip=self.stats.skipped.latest, now_ns=now_ns, on_reject=self.stats.rejected_inputs.add)
        return RunTaskServer(self, names, subtask, p.run_may_enable, p.run_stall_s, hooks)

    def _stream_parameters(self, streams: Any) -> dict[str, Any]:
        """Declare (once) and read the ``<stream>.<field>`` parameters of the listed language streams (the
        plugin-list style: which names exist depends on ``language_streams``); bad names are left to validate."""
        values: dict[str, Any] = {}
        for stream in streams if isinstance(streams, (list, tuple)) else ():
            if not isinstance(stream, str) or not STREAM_NAME_RE.match(stream) or stream in RESERVED_STREAM_NAMES:
                continue
            declare_specs(self, STREAM_PARAMS, f"{stream}.", f"language stream {stream}: ")
            values |= read_specs_of(self, STREAM_PARAMS, f"{stream}.")
        return values

    def _supervise(self) -> None:
        """Steady-clock timer: report a frame that exceeds the watchdog, and start the error processing after
        max_consecutive_faults failing frames (from the executor: the inference thread cannot stop itself)."""
        guard = self._guard
        if guard is not None:
            guard.check_watchdog()
        if self._fault_pending and self._state == "active":
            self._fault_pending = False
            self.get_logger().error(f"{self._faults.consecutive} frames in a row failed (max_consecutive_faults="
                                    f"{self._faults.limit}), last: {self._faults.last}; going to error processing")
            self.trigger_deactivate()  # on_deactivate returns ERROR: ErrorProcessing, on_error releases

    def _start_processing(self, p: NodeParams) -> None:
        """Inputs, subscriptions, the inference thread and the control timer (created on activate, as yolo_ros
        and ros2/demos lifecycle_py do: an inactive node neither receives nor decodes anything)."""
        # the instruction is task state, not a stream: it survives a deactivate / activate cycle
        instruction = self._last_instruction or p.instruction
        policy = self._loaded.policy
        self._store = store = InputStore(p.camera_names, p.joint_names, self.stats.rejected_inputs,
                                         p.max_image_pixels, instruction_char_cap(p, policy), instruction,
                                         node_clock_ns=lambda: self.get_clock().now().nanoseconds,
                                         max_image_age_s=p.max_image_age_s)
        self._builder = ObservationBuilder(store, policy, p.max_image_age_s, p.max_joint_age_s,
                                           max_camera_skew_s=p.max_camera_skew_s)
        camera_qos = qos.camera(p.camera_reliability == "best_effort")
        self._input_subs += self._camera_subscriptions(p, store, camera_qos)
        self._input_subs.append(self.create_subscription(  # best effort: matches any publisher
            JointState, "joint_states", self._safe(store.on_joint_state, "joint_state_callback"), qos.best_effort(),
            callback_group=self._input_group))
        self._input_subs += self._instruction_subscriptions(store)
        if p.rtc_enabled and p.rtc_remainder_source == "executor":
            self._input_subs.append(self._executed_plan_subscription(p))
        # node clock: follows /clock with use_sim_time. The timer only wakes the inference thread: a callback that
        # ran the whole frame would keep rclpy's multi-threaded executor busy-polling the still-ready timer,
        # starving inference of the GIL (measured: 7x slower frames).
        self._tick = threading.Event()
        self._tick_at = 0.0  # time.perf_counter() of the newest control tick
        self._action_path_s: deque[float] = deque(maxlen=30)  # tick handled -> chunk ready, recent frames
        self._worker_stop = threading.Event()
        self._worker = threading.Thread(target=self._inference_loop, name="oxygen-inference", daemon=True)
        self._worker.start()
        self._control_timer = self.create_timer(p.period_s, self._on_timer, self._control_group)

    def _stop_processing(self, timeout_s: float = 60.0) -> bool:
        """Stop the timer and the inference thread (after its running frame), destroy the subscriptions and drop
        the inputs; in-flight language requests are dropped with them (a fresh engine serves the next activation).
        False when the running frame has not ended after ``timeout_s`` (hung): then nothing else is touched, and
        later calls do not wait for that frame again."""
        if self._control_timer is not None:
            self._control_timer.cancel()
        worker = self._worker
        if worker is not None:
            self._worker_stop.set()
            self._tick.set()
            if worker is not threading.current_thread():
                worker.join(timeout=0.0 if worker is self._stuck_worker else timeout_s)
                if worker.is_alive():
                    if worker is not self._stuck_worker:
                        self.get_logger().error(f"the running frame did not end within {timeout_s:g} s (hung?): "
                                                "the model it uses is not released")
                    self._stuck_worker = worker
                    return False
        with self._engine_lock:
            if self._control_timer is not None:
                self.destroy_timer(self._control_timer)
            for sub in self._input_subs:
                self.destroy_subscription(sub)
            self._input_subs, self._control_timer, self._worker = [], None, None
            if self._runner is not None:
                self._runner.executed_remainder = None
            self._executed = None
            self._camera_watch = None
            if self._store is not None:
                self._last_instruction = self._store.instruction or ""
            self._store = self._builder = None
            if self._ask is not None:
                self._ask.abort_all("the node stopped processing (deactivated)")
            if self._run is not None:
                self._run.abort(f"faults: {self._faults.consecutive} frames in a row failed, last: {self._faults.last}"
                                if self._faults.tripped else "the node stopped processing (deactivated)")
            if self._runner is not None and self._runner.backlog:
                self._runner.reset()
        return True

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        try:
            self._start_processing(self.params)
        except Exception as e:
            self.get_logger().error(f"activate failed: {e}")
            self._stop_processing()
            return FAILURE
        self._state = "active"
        self.get_logger().info(f"active: {self.params.control_rate_hz:g} Hz control, publishing "
                               f"{self.resolve_topic_name(ACTION_TOPIC)}")
        return super().on_activate(state)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        if not self._stop_processing():
            return FAILURE  # a hung frame: still active (its chunk will not be published, see watchdog_s)
        self._state = "inactive"
        if self._faults.tripped:  # max_consecutive_faults: on to ErrorProcessing (on_error releases everything)
            super().on_deactivate(state)
            return ERROR
        self.get_logger().info("deactivated: subscriptions and timer destroyed, model kept")
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._release()
        self.get_logger().info("cleaned up: model released")
        return super().on_cleanup(state)

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._release()
        self._state = "finalized"
        return super().on_shutdown(state)

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.get_logger().error(f"error while in {state.label}: releasing everything")
        self._release()
        return SUCCESS

    def _release(self, timeout_s: float = 60.0) -> bool:
        """Stop processing, then drop publishers, runner, engine and model. False (nothing released) when the
        running frame did not end within ``timeout_s``."""
        if not self._stop_processing(timeout_s):
            return False
        with self._engine_lock:
            for pub in (self._action_pub, self._language_pub, self._trajectory_pub, *self._stream_pubs.values()):
                if pub is not None:
                    self.destroy_lifecycle_publisher(pub)
            if self._guard is not None:
                self._guard.destroy()
            if self._ask is not None:
                self._ask.destroy()
            if self._run is not None:
                self._run.destroy()
            if self._runner is not None:
                self._runner.close()
            if self._loaded is not None:
                self._loaded.release()
            self._reset_runtime()
            self._state = "unconfigured"
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return True

    def release(self, timeout_s: float = 60.0) -> bool:
        """Release everything (for shutdown paths outside the lifecycle, e.g. SIGINT), waiting at most
        ``timeout_s`` for the running frame, and not at all when the watchdog reports it past watchdog_s. False:
        that frame still runs (hung) and keeps the model; the process can exit without it."""
        guard = self._guard
        return self._release(0.0 if guard is not None and guard.watchdog.tripped else timeout_s)

    def destroy_node(self) -> None:
        """Release the model (and a generated model's temporary directory), then destroy the node."""
        self.release()
        super().destroy_node()

    def _safe(self, fn: Callable[..., Any], what: str | None = None) -> Callable[..., None]:
        """Wrap a callback so an unexpected exception is counted and logged instead of killing the executor."""
        reason = what or getattr(fn, "__name__", "callback")

        def wrapped(*args: Any) -> None:
            try:
                fn(*args)
            except Exception as e:
                if not self.context.ok():
                    return  # shutting down
                self.stats.errors.add(reason, f"{type(e).__name__}: {e}")
                self.get_logger().debug(traceback.format_exc())

        return wrapped
