"""The tabletop simulator as a ROS 2 node: the robot the oxygen node drives in the closed-loop demo.

    python -m oxygen_ros.toy.sim [--ros-args -p seed:=1000000 -p step_rate_hz:=20.0]

Topics (relative names, remappable; under a namespace they all move with it):
  out  cameras/<camera>/image_raw   sensor_msgs/Image rgb8, one per world camera, every step
  out  joint_states                 sensor_msgs/JointState (ee_x, ee_y, ee_z, gripper), same stamp as the images
  out  instruction                  std_msgs/String, the episode's task (latched: transient local, depth 1; at reset
                                    and every 2 s)
  out  ~/events                     std_msgs/String, one JSON line per finished episode and per scored memory
  in   /oxygen/action_chunk         oxygen_ros/ActionChunk: replaces the action queue (latency-aligned)
  in   /oxygen/language_output      oxygen_ros/LanguageOutput: "memory" texts scored against the world's truth
                                    (both topics are parameters: chunk_topic, language_topic)
  in   <setpoint_topic>             with setpoint_topic set (e.g. the chunk executor's output), instead of chunks:
                                    sensor_msgs/JointState (setpoint_type joint_state, by name) or
                                    std_msgs/Float64MultiArray (float64_multi_array, joint order); each step the
                                    arm moves toward the newest setpoint (see setpoints.py)
  out  /clock                       rosgraph_msgs/Clock, with publish_clock:=true only (see below)

Every step (``step_rate_hz``) the next queued action is applied and a new observation is published, all stamped
with one time. A chunk computed from the observation stamped ``t0`` holds actions for ``t0 + (i + 1) * dt``; the ones
whose time has passed are skipped, so a slow policy does not replay stale actions. Chunks from before the current
episode and malformed chunks are dropped (counted, warned). After success or ``max_steps`` the finished scene stays
up for ``reset_pause_s`` (so its memory is asked about too), then the next seed starts. The ROS-free parts live
next to this module: :mod:`.chunks` (chunk timing and validation) and :mod:`.scoring` (records, counters, truth).

With ``publish_clock:=true`` the simulator owns the time: a simulated clock that starts at ``SIM_CLOCK_START_NS``
(1 s, so that no stamp is 0) and advances exactly one step period per step (paced by the wall clock) is published
on ``/clock`` before each step's observation and stamps everything the simulator does; nodes with
``use_sim_time:=true`` follow it. The simulator itself must then not use sim time (it would wait for itself).
"""

from __future__ import annotations

import json
import sys
import threading
from collections import deque
from dataclasses import asdict
from typing import Any

import numpy as np
from rclpy.node import Node
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import Float64MultiArray, String

from oxygen_ros.msg import ActionChunk, LanguageOutput
from oxygen_ros.ros import qos
from oxygen_ros.ros.image_conversion import array_to_image_msg
from oxygen_ros.ros.process import run_node
from oxygen_ros.ros.stamps import stamp_to_ns, time_msg
from oxygen_ros.toy.world import CAMERAS, JOINT_NAMES, TabletopWorld, WorldConfig

from .chunks import aligned_actions, chunk_problem
from .scoring import SCORED_TASKS, EpisodeRecord, MemoryTruth, SimCounters, TaskScore, scene_truth
from .setpoints import SETPOINT_TYPES, setpoint_from_array, setpoint_from_joint_state

__all__ = ["INSTRUCTION_REPEAT_S", "PARAMETERS", "SIM_CLOCK_START_NS", "TabletopSimNode", "main"]

INSTRUCTION_REPEAT_S = 2.0
SIM_CLOCK_START_NS = 1_000_000_000  # the simulated clock's first value (publish_clock)
PARAMETERS: dict[str, Any] = {  # the node's ROS parameters and their defaults
    "seed": 1_000_000,  # first episode seed (evaluation seeds, unseen in training)
    "step_rate_hz": 20.0,
    "image_size": 64,
    "max_steps": WorldConfig.max_steps,
    "reset_pause_s": 1.0,
    "max_episodes": 0,  # 0: run until shut down
    "chunk_topic": "/oxygen/action_chunk",
    "language_topic": "/oxygen/language_output",
    "frame_id": "table",
    "autostart": True,  # false: wait for start() (lets a caller wait for discovery)
    "publish_clock": False,  # own the time: publish a simulated clock on /clock (for use_sim_time nodes)
    "setpoint_topic": "",  # '': execute action chunks; a topic: follow a setpoint stream instead (an executor's)
    "setpoint_type": "joint_state",  # joint_state | float64_multi_array
}


class TabletopSimNode(Node):
    """Publishes the world's sensors, executes received action chunks, scores memories, resets between tasks."""

    def __init__(self, name: str = "tabletop_sim", **kwargs: Any) -> None:
        super().__init__(name, **kwargs)
        for parameter, default in PARAMETERS.items():
            self.declare_parameter(parameter, default)
        get = self.get_parameter
        rate = float(get("step_rate_hz").value)
        if not rate > 0.0:
            raise ValueError(f"step_rate_hz must be > 0, got {rate}")
        self.period_ns = int(round(1e9 / rate))
        self.world = TabletopWorld(WorldConfig(image_size=int(get("image_size").value),
                                               max_steps=int(get("max_steps").value)))
        self.next_seed = int(get("seed").value)
        self.max_episodes = int(get("max_episodes").value)
        self.reset_pause_ns = int(float(get("reset_pause_s").value) * 1e9)
        self.frame_id = str(get("frame_id").value)
        self.publish_clock = bool(get("publish_clock").value)
        if self.publish_clock and bool(get("use_sim_time").value):
            raise ValueError("publish_clock and use_sim_time are exclusive: the simulator publishing /clock would "
                             "wait for its own clock")
        self._sim_ns = SIM_CLOCK_START_NS
        self.counters = SimCounters()
        self._queue: deque[np.ndarray] = deque()
        self.truth = MemoryTruth()  # observation stamp -> the scene's truth (language.scene_truth)
        self._episode_chunks = 0
        self._done_since: int | None = None
        self._last_instruction_ns = 0
        self.last_memory: tuple[str, str] | None = None  # (text, truth) of the newest scored memory

        self._image_pubs = {c: self.create_publisher(Image, f"cameras/{c}/image_raw", qos.camera()) for c in CAMERAS}
        self._clock_pub = self.create_publisher(Clock, "/clock", qos.reliable(1)) if self.publish_clock else None
        self._joint_pub = self.create_publisher(JointState, "joint_states", 10)
        # latched (transient local, as robot_state_publisher's URDF): a node that starts or restarts later gets the
        # episode's instruction at once, volatile subscribers match too
        self._instruction_pub = self.create_publisher(String, "instruction", qos.latched())
        self._event_pub = self.create_publisher(String, "~/events", 10)
        self.setpoint_topic, setpoint_type = str(get("setpoint_topic").value), str(get("setpoint_type").value)
        if setpoint_type not in SETPOINT_TYPES:
            raise ValueError(f"setpoint_type must be one of {list(SETPOINT_TYPES)}, got {setpoint_type!r}")
        self._setpoint: np.ndarray | None = None  # the newest setpoint of this episode (setpoint_topic)
        if self.setpoint_topic:
            kind = JointState if setpoint_type == "joint_state" else Float64MultiArray
            self.create_subscription(kind, self.setpoint_topic, self._on_setpoint, 10)
        else:
            self.create_subscription(ActionChunk, str(get("chunk_topic").value), self._on_chunk, 10)
        self.create_subscription(LanguageOutput, str(get("language_topic").value), self._on_language, 10)
        self.started = False
        self._episode_start_ns = 0
        self._tick_lock = threading.Lock()
        self._closed = False
        self._timer = self.create_timer(1.0 / rate, self._tick)
        self._publish_clock()
        if bool(get("autostart").value):
            self.start()

    def start(self) -> None:
        """Lay out the first episode and start stepping (once)."""
        if not self.started:
            self.started = True
            self._reset()

    # ------------------------------------------------------------------------------------------ episodes
    @property
    def finished(self) -> bool:
        """All ``max_episodes`` episodes are done (never, when it is 0)."""
        return bool(self.max_episodes) and self.counters.episodes >= self.max_episodes

    def cameras_connected(self) -> bool:
        """Every camera topic has at least one subscriber (discovery done)."""
        return all(p.get_subscription_count() > 0 for p in self._image_pubs.values())

    def _now_ns(self) -> int:
        """The simulator's time: the simulated clock with publish_clock, else the node clock."""
        return self._sim_ns if self.publish_clock else self.get_clock().now().nanoseconds

    def _publish_clock(self) -> None:
        if self._clock_pub is not None:
            msg = Clock()
            msg.clock = time_msg(self._sim_ns)
            self._clock_pub.publish(msg)

    def _reset(self) -> None:
        self.world.reset(self.next_seed)
        self.next_seed += 1
        self._queue.clear()
        self._setpoint = None
        self._episode_chunks = 0
        self._done_since = None
        self._episode_start_ns = self._now_ns()
        self.get_logger().info(f"episode {self.counters.episodes} (seed {self.world.seed}): {self.world.instruction}")
        self._publish_instruction()
        self._publish_observation(self._episode_start_ns)

    def _finish_episode(self) -> None:
        record = EpisodeRecord(self.counters.episodes, self.world.seed, self.world.instruction, self.world.success,
                               self.world.steps, self._episode_chunks)
        self.counters.episodes += 1
        self.counters.successes += int(record.success)
        self._event("episode", **asdict(record))
        self.get_logger().info(f"episode {record.episode} {'succeeded' if record.success else 'failed'} in "
                               f"{record.steps} steps ({self.counters.successes}/{self.counters.episodes} tasks done)")

    def destroy_node(self) -> None:
        """Stop ticking first: an executor thread may still be inside a tick when a host destroys the node."""
        with self._tick_lock:
            self._closed = True
            self.destroy_timer(self._timer)
        super().destroy_node()

    def _tick(self) -> None:
        with self._tick_lock:
            if not self._closed:
                if self.publish_clock:  # one step of simulated time, announced before the step's observation
                    self._sim_ns += self.period_ns
                    self._publish_clock()
                self._step_world()

    def _step_world(self) -> None:
        now = self._now_ns()
        if not self.started or self.finished:
            return
        if self.world.done:
            if self._done_since is None:
                self._done_since = now
                self._finish_episode()
            elif now - self._done_since >= self.reset_pause_ns and not self.finished:
                self._reset()
                return
        elif self._setpoint is not None:
            self.world.apply(self._setpoint)
        elif self._queue:
            self.world.apply(self._queue.popleft())
        if now - self._last_instruction_ns >= INSTRUCTION_REPEAT_S * 1e9:
            self._publish_instruction()
        self._publish_observation(now)

    # ------------------------------------------------------------------------------------------ sensors
    def _publish_instruction(self) -> None:
        self._instruction_pub.publish(String(data=self.world.instruction))
        self._last_instruction_ns = self._now_ns()

    def _publish_observation(self, stamp_ns: int) -> None:
        obs = self.world.observation()
        for camera, pub in self._image_pubs.items():
            pub.publish(array_to_image_msg(obs.images[camera], stamp_ns, self.frame_id))
        js = JointState()
        js.header.stamp = time_msg(stamp_ns)
        js.header.frame_id = self.frame_id
        js.name = list(JOINT_NAMES)
        js.position = [float(v) for v in obs.state]
        self._joint_pub.publish(js)
        self.truth.record(stamp_ns, scene_truth(self.world))

    # ------------------------------------------------------------------------------------------ inputs
    def _on_chunk(self, msg: ActionChunk) -> None:
        if not self.started:
            return
        dim, horizon = int(msg.action_dim), int(msg.horizon)
        actions = np.asarray(msg.actions, dtype=np.float64)
        problem = chunk_problem(actions, horizon, dim, list(msg.joint_names), JOINT_NAMES)
        if problem is not None:
            self.counters.rejected_chunks += 1
            self.get_logger().warning(f"rejected action chunk {msg.frame_index}: {problem}",
                                      throttle_duration_sec=2.0)
            return
        stamp = stamp_to_ns(msg.header.stamp)
        if stamp < self._episode_start_ns or self.world.done:
            self.counters.stale_chunks += 1  # planned for the previous episode, or nothing left to do
            return
        dt_ns = stamp_to_ns(msg.dt) or self.period_ns
        start = stamp + int(msg.first_step) * dt_ns  # actions[0]'s step (the committed ones were not sent)
        self._queue = deque(aligned_actions(actions, horizon, dim, len(JOINT_NAMES), start, self._now_ns(), dt_ns))
        self.counters.chunks += 1
        self._episode_chunks += 1

    def _on_setpoint(self, msg: JointState | Float64MultiArray) -> None:
        if not self.started:
            return
        if isinstance(msg, JointState):
            if stamp_to_ns(msg.header.stamp) < self._episode_start_ns:
                self.counters.stale_setpoints += 1  # commanded before this episode
                return
            setpoint = setpoint_from_joint_state(list(msg.name), list(msg.position), JOINT_NAMES)
        else:
            setpoint = setpoint_from_array(list(msg.data), JOINT_NAMES)
        if isinstance(setpoint, str):
            self.counters.rejected_setpoints += 1
            self.get_logger().warning(f"rejected setpoint: {setpoint}", throttle_duration_sec=2.0)
            return
        if self.world.done:
            return
        self._setpoint = setpoint
        self.counters.setpoints += 1

    def _on_language(self, msg: LanguageOutput) -> None:
        if msg.task not in SCORED_TASKS:
            return  # answers are scored by whoever asked (the question is not in the message): answer_truth()
        scene = self.truth.get(stamp_to_ns(msg.header.stamp))
        truth = None if scene is None else scene[msg.task]
        exact = self.counters.tasks.setdefault(msg.task, TaskScore()).add(msg.text, truth)
        if msg.task == "memory":
            self.counters.memories += 1
            if truth is None:
                self.counters.memory_unscored += 1
            else:
                self.last_memory = (msg.text, truth)
                self.counters.memory_exact += int(bool(exact))
        if truth is not None:
            self._event(msg.task, frame_index=int(msg.frame_index), stream=msg.stream, text=msg.text, truth=truth,
                        exact=exact)

    def answer_truth(self, stamp_ns: int, question: str) -> str | None:
        """The world's answer to ``question`` at the observation stamped ``stamp_ns`` (None: unknown observation
        or not a valid question about that scene)."""
        scene = self.truth.get(stamp_ns)
        return None if scene is None else scene["answers"].get(" ".join(question.strip().lower().split()))

    def _event(self, kind: str, **fields: Any) -> None:
        self._event_pub.publish(String(data=json.dumps({"event": kind, **fields})))


def main(args: list[str] | None = None) -> int:
    """Run the simulator until SIGINT/SIGTERM or until ``max_episodes`` are done (:func:`.process.run_node`)."""
    def done(node: TabletopSimNode) -> None:
        node.get_logger().info(f"done: {node.counters.summary()}")

    return run_node(TabletopSimNode, args=args, help_text=__doc__ or "", finished=lambda node: node.finished,
                    on_stopped=done)

if __name__ == "__main__":
    sys.exit(main())
