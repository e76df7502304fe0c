"""The executor's parameters, each declared once as a field of :class:`ExecutorParams` with the package's one
schema (:mod:`oxygen_ros.params`); those it shares with the node (action rate and names, joint age, limits.*) are the
node's own declarations (:mod:`oxygen_ros.params.robot`). Also the joint limit parameters ``limits.<joint>.min / .max /
.max_velocity / .max_acceleration`` parsed by the node's own function (:func:`oxygen_ros.robot.limits.
parse_limit_parameters`), so one preset file serves both. :func:`validate` reports every problem at once; no ROS
graph needed. Nothing here imports torch (the executor's process stays small and starts fast).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from oxygen_ros.params import ParamError, ParamSpec, param, read_specs, robot_param, specs_of
from oxygen_ros.robot.limits import parse_limit_parameters

from .aggregation import AGGREGATE_NAMES, parse_aggregate
from .interpolation import INTERPOLATIONS
from .rt import parse_cpus
from .streamer import ON_STALE
from .timeline import SWITCH_MODES

__all__ = ["EXECUTOR_PARAMS", "OUTPUTS", "ExecutorParams", "ParamError", "ParamSpec", "validate"]

OUTPUTS = ("float64_array", "joint_state", "trajectory")
LOOPS = ("thread", "timer")


@dataclass(frozen=True)
class ExecutorParams:
    """Validated executor parameters (docs/executor.md has the table)."""

    command_rate_hz: float = param(0.0,
        'Setpoints per second (the controller\'s rate); 0 = action_rate_hz, else 1 / ActionChunk.dt of the first '
        'chunk.', minimum=0.0)
    action_rate_hz: float = robot_param('action_rate_hz')
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
    action_names: tuple[str, ...] = robot_param('action_names')
    max_joint_age_s: float = robot_param('max_joint_age_s')
    limits_robot_description: str = robot_param('limits_robot_description')
    limits_required: bool = robot_param('limits_required')
    autostart: bool = robot_param('autostart')
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


EXECUTOR_PARAMS: tuple[ParamSpec, ...] = specs_of(ExecutorParams, skip=("joint_limits",))


def validate(values: Mapping[str, Any]) -> ExecutorParams:
    """Check parameter values (missing ones take their defaults; unknown ones are ignored: a preset file may hold
    the node's too).

    Raises:
        ParamError: listing every problem, each starting with the parameter's name.
    """
    out, problems = read_specs(EXECUTOR_PARAMS, values)
    joint_limits, limit_problems = parse_limit_parameters(values)  # picks the limits.<joint>.<field> values itself
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
