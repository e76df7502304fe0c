"""The parameters the node and the chunk executor share, declared once: the launch files feed both the same preset
file, so both read the same name with the same type, default and meaning. ``NodeParams`` and ``ExecutorParams``
take them with ``robot_param("<field>")``; their spec lists hold these very objects.

``max_joint_age_s`` is 0.25 s for both (the executor had 0.5 s): 2.5 control periods at the node's default 10 Hz.
A joint state older than that has missed two updates of a 10 Hz (or faster) stream and should neither seed a
chunk in the node nor be where the executor starts a chunk from.
"""

from __future__ import annotations

from typing import Any

from .schema import ParamSpec, declared

__all__ = ["ROBOT_PARAMS", "robot_param"]

_SPECS = (
    ParamSpec("autostart", bool, True,
              'Configure and activate on startup (plain runs); false: wait for lifecycle transitions.',
              attr="autostart"),
    ParamSpec("action_rate_hz", float, 0.0,
              'Rate the robot executes chunk actions at (ActionChunk.dt = 1 / rate); 0 = action_horizon * '
              'control_rate_hz. The chunk executor commands setpoints at this rate unless command_rate_hz is set.',
              minimum=0.0, attr="action_rate_hz"),
    ParamSpec("action_names", "str[]", (),
              "Names of the robot's action dimensions (ActionChunk.joint_names, JointTrajectory joints); [] = "
              'joint_names. Its length is the published action dim. The chunk executor names the actions of a '
              'chunk that carries none with them.', attr="action_names"),
    ParamSpec("max_joint_age_s", float, 0.25,
              'Skip the frame when any joint position is older than this (arrival, node clock): a stopped '
              'joint_states stream, or one joint no longer published; the chunk executor does not start a chunk '
              'from such a position. 0 = no limit. 0.25 s is 2.5 control periods at 10 Hz: an older joint state '
              'should not seed a chunk.', minimum=0.0, attr="max_joint_age_s"),
    ParamSpec("limits.robot_description", str, "robot_description",
              'Topic of the URDF (std_msgs/String, transient local, as robot_state_publisher publishes it) whose '
              "joint limits apply to the action names; '' = none (limits.<joint>.* parameters only).",
              attr="limits_robot_description"),
    ParamSpec("limits.required", bool, False,
              'Publish no chunk (the chunk executor: command nothing) while an action joint has no limit at all '
              '(no URDF yet, or action_names that are not its joints): counted as limits_missing. Real robots: '
              'true.', attr="limits_required"),
)
ROBOT_PARAMS: dict[str, ParamSpec] = {s.attr: s for s in _SPECS}


def robot_param(attr: str) -> Any:
    """The dataclass field of the shared parameter ``attr`` (``max_joint_age_s: float = robot_param(...)``)."""
    return declared(ROBOT_PARAMS[attr])
