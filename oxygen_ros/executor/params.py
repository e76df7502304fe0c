"""The executor's parameters, each declared once as a field of :class:`ExecutorParams` (type, default, help,
choices, minimum: the node's scheme, ros/params.py), and the joint limit parameters ``limits.<joint>.min / .max /
.max_velocity / .max_acceleration`` parsed by the node's own function (:func:`oxygen_ros.ros.limits.
parse_limit_parameters`), so one preset file serves both. :func:`validate` reports every problem at once; no ROS
graph needed. Nothing here imports torch (the executor's process stays small and starts fast).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from oxygen_ros.ros.limits import joint_limit_names, parse_limit_parameters

from .aggregation import AGGREGATE_NAMES, parse_aggregate
from .interpolation import INTERPOLATIONS
from .rt import parse_cpus
from .streamer import ON_STALE
from .timeline import SWITCH_MODES

__all__ = ["EXECUTOR_PARAMS", "OUTPUTS", "ExecutorParams", "ParamError", "ParamSpec", "validate"]

OUTPUTS = ("float64_array", "joint_state", "trajectory")
LOOPS = ("thread", "timer")


class ParamError(ValueError):
    """Invalid parameters; ``problems`` lists one message per offending parameter."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        super().__init__("invalid parameters:\n  - " + "\n  - ".join(self.problems))


def param(default: Any, help: str, *, choices: tuple[str, ...] | None = None, minimum: float | None = None,
          ros_name: str | None = None) -> Any:
    """A parameter field: default, help and its one-field checks (``ros_name``: a group's ``<group>.<name>``)."""
    return field(default=default, metadata={"help": help, "choices": choices, "minimum": minimum,
                                            "ros_name": ros_name})


@dataclass(frozen=True)
class ParamSpec:
    """One declared parameter: ROS name, kind (bool, float, str or 'str[]'), default, description, checks."""

    name: str
    kind: Any
    default: Any
    description: str
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    attr: str = ""

    @property
    def type_name(self) -> str:
        return self.kind if isinstance(self.kind, str) else self.kind.__name__

    @property
    def ros_default(self) -> Any:
        return list(self.default) if isinstance(self.default, tuple) else self.default

    def check(self, value: Any) -> tuple[Any, str | None]:
        """(the value as this type, None) or (None, the problem)."""
        got = f"got {type(value).__name__} {value!r}"[:160]
        if self.kind is bool:
            ok = isinstance(value, bool)
        elif self.kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif self.kind is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            value = float(value) if ok else value
        elif self.kind is str:
            ok = isinstance(value, str)
        else:  # str[]: a YAML [] arrives unset (None)
            value = () if value is None else tuple(value.tolist() if hasattr(value, "tolist") else value) \
                if isinstance(value, (list, tuple)) or hasattr(value, "tolist") else value
            ok = isinstance(value, tuple) and all(isinstance(v, str) for v in value)
        if not ok:
            return None, f"{self.name}: expected {self.type_name}, {got}"
        if self.choices is not None and value not in self.choices:
            return None, f"{self.name}: must be one of {', '.join(self.choices)}; got {value!r}"
        if self.minimum is not None and value < self.minimum:
            return None, f"{self.name}: must be >= {self.minimum}; got {value}"
        return value, None


@dataclass(frozen=True)
class ExecutorParams:
    """Validated executor parameters (docs/executor.md has the table)."""

    command_rate_hz: float = param(0.0,
        'Setpoints per second (the controller\'s rate); 0 = action_rate_hz, else 1 / ActionChunk.dt of the first '
        'chunk.', minimum=0.0)
    action_rate_hz: float = param(0.0,
        "The node's action_rate_hz (read from the same preset file when given one): the default command rate.",
        minimum=0.0)
    chunk_topic: str = param('oxygen/action_chunk',
        "The node's ActionChunk topic (relative: follows the namespace; the node's ~/action_chunk).")
    halt_topic: str = param('oxygen/halt',
        "The node's halt topic (std_msgs/Bool; latched and volatile publishers both): true holds at once.")
    joint_states_topic: str = param('joint_states', 'The measured joint positions (sensor_msgs/JointState).')
    switch: str = param('replace',
        'replace (RTC-consistent: a newer chunk takes over at its first action not yet due) | aggregate (merge '
        'overlapping actions with the aggregate rule).', choices=SWITCH_MODES)
    aggregate: str = param('weighted_average',
        f"Merge rule of switch: aggregate: {' | '.join(AGGREGATE_NAMES)} (LeRobot's async inference; ACT's "
        'weights exp(-m i), i = 0 the oldest).')
    interpolation: str = param('linear',
        'hold (zero-order) | linear | cubic (through the actions, velocity-continuous at a chunk switch).',
        choices=INTERPOLATIONS)
    on_exhausted: str = param('hold',
        'When the chunk in force runs out: hold its last action (counted as an underrun); never extrapolate.',
        choices=('hold',))
    stale_timeout_s: float = param(1.0,
        'No chunk for this long is stale (reported on /diagnostics); 0 = never.', minimum=0.0)
    on_stale: str = param('hold', 'When stale: hold (keep commanding the last setpoint) | stop (command nothing).',
                          choices=ON_STALE)
    output: str = param('joint_state',
        'float64_array (std_msgs/Float64MultiArray for forward_command_controller, output_joints order) | '
        'joint_state (sensor_msgs/JointState: position, and velocity when interpolating) | trajectory (a '
        'single-point trajectory_msgs/JointTrajectory per setpoint).', choices=OUTPUTS)
    output_topic: str = param('~/command', 'Where setpoints go (remap or set, e.g. /<controller>/commands).')
    output_joints: tuple[str, ...] = param((),
        "The output's joint order (float64_array: the controller's joints); [] = the chunk's action order "
        '(after joint_map). Joints are matched by name.')
    joint_map: tuple[str, ...] = param((),
        "Renames 'action:joint' from the chunk's action names to the robot's joint names (outputs, joint_states, "
        'limits); unnamed actions keep their names.')
    action_names: tuple[str, ...] = param((),
        "Names of the actions when a chunk carries none (ActionChunk.joint_names empty).")
    max_joint_age_s: float = param(0.5,
        'A measured position older than this is not used to start from (0 = any age).', minimum=0.0)
    limits_robot_description: str = param('robot_description',
        "Topic of the URDF (std_msgs/String, transient local) whose joint limits apply; '' = parameters only.",
        ros_name='limits.robot_description')
    limits_required: bool = param(False,
        'Command nothing while a joint has no limit at all (real robots: true).', ros_name='limits.required')
    autostart: bool = param(True,
        'Configure and activate at startup (as the node does); false: wait for lifecycle transitions (a '
        'lifecycle manager, ros2 lifecycle set).')
    deactivate_hold_s: float = param(0.1,
        'On deactivate: the setpoint is held (published unchanged) this long, then publishing stops.',
        minimum=0.0)
    loop: str = param('thread',
        'thread (a command loop of its own: absolute monotonic deadlines, rt.* settings) | timer (an rclpy timer '
        'on the multi-threaded executor: the former loop, kept for the timing benchmark).', choices=LOOPS)
    rt_priority: int = param(0,
        'SCHED_FIFO priority (1-99) of the command loop thread only; 0 = normal. Refused by the OS: warned once, '
        'normal priority (oxygen-doctor names the fix).', minimum=0, ros_name='rt.priority')
    rt_cpus: str = param('',
        "The command loop thread's CPUs, e.g. '3' or '2-3' ('' = any); keep the node's CPUs apart.",
        ros_name='rt.cpus')
    rt_switch_interval_s: float = param(0.001,
        "The interpreter's switch interval (sys.setswitchinterval; Python's default 0.005): how soon the loop "
        'gets the GIL back from another thread; 0 = leave it.', minimum=0.0, ros_name='rt.switch_interval_s')
    rt_gc_freeze: bool = param(True,
        'gc.freeze() after configure and automatic collection off: the 1 Hz diagnostics callback collects (all '
        'generations once a minute), never the command loop.', ros_name='rt.gc_freeze')
    rt_mlockall: bool = param(False,
        'mlockall(MCL_CURRENT | MCL_FUTURE): no page faults in the loop (needs RLIMIT_MEMLOCK; refused: warned).',
        ros_name='rt.mlockall')
    joint_limits: dict = field(default_factory=dict, compare=False)  # limits.<joint>.<field>

    @property
    def joint_renames(self) -> dict[str, str]:
        """joint_map as {action name: joint name}."""
        return dict(item.split(":", 1) for item in self.joint_map)


_KINDS = {"bool": bool, "int": int, "float": float, "str": str, "tuple[str, ...]": "str[]"}
EXECUTOR_PARAMS: tuple[ParamSpec, ...] = tuple(
    ParamSpec(f.metadata["ros_name"] or f.name, _KINDS[str(f.type)], f.default, f.metadata["help"],
              f.metadata["choices"], f.metadata["minimum"], attr=f.name)
    for f in dataclasses.fields(ExecutorParams) if f.name != "joint_limits")


def validate(values: Mapping[str, Any]) -> ExecutorParams:
    """Check parameter values (missing ones take their defaults; unknown ones are ignored: a preset file may hold
    the node's too).

    Raises:
        ParamError: listing every problem, each starting with the parameter's name.
    """
    problems: list[str] = []
    out: dict[str, Any] = {}
    for spec in EXECUTOR_PARAMS:
        raw = values.get(spec.name, spec.default)
        if "." in spec.name and spec.name not in values:  # a YAML file's nested group: limits: {required: ...}
            group, name = spec.name.split(".", 1)
            nested = values.get(group)
            raw = nested.get(name, spec.default) if isinstance(nested, Mapping) else spec.default
        value, problem = spec.check(raw)
        if problem:
            problems.append(problem)
            value = spec.default
        out[spec.attr] = value
    limits_values = {k: v for k, v in values.items() if k in joint_limit_names(values)}
    nested = values.get("limits")
    if isinstance(nested, Mapping):
        limits_values["limits"] = {k: v for k, v in nested.items() if isinstance(v, Mapping)}
    joint_limits, limit_problems = parse_limit_parameters(limits_values)
    problems += limit_problems
    if out["switch"] == "aggregate":
        try:
            parse_aggregate(out["aggregate"])
        except ValueError as e:
            problems.append(str(e))
    bad = [m for m in out["joint_map"] if m.count(":") != 1 or not all(m.split(":"))]
    if bad:
        problems.append(f"joint_map: entries are 'action:joint'; got {bad}")
    if out["rt_priority"] > 99:
        problems.append(f"rt.priority: SCHED_FIFO priorities are 1-99 (0 = normal); got {out['rt_priority']}")
    try:
        parse_cpus(out["rt_cpus"])
    except ValueError as e:
        problems.append(f"rt.cpus: {e}")
    for name in ("output_joints", "action_names"):
        if len(set(out[name])) != len(out[name]):
            problems.append(f"{name}: duplicates in {list(out[name])}")
    if problems:
        raise ParamError(problems)
    return ExecutorParams(**out, joint_limits=joint_limits)
