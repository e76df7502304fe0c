"""A robot's joint limits from its URDF (the ``robot_description`` topic, parsed with ROS's ``urdf_parser_py``;
no rclpy). Rules follow ros2_control's ``joint_limits`` package: revolute and prismatic joints have a position range
and a velocity limit, continuous joints only a velocity limit, other joint types none; a velocity of 0 means none.
"""

from __future__ import annotations

import math
import threading

from .limits import JointLimit

__all__ = ["UrdfError", "urdf_limits"]


class UrdfError(ValueError):
    """A robot description that cannot be parsed."""


_URDF_LOCK = threading.Lock()


def urdf_limits(xml: str) -> tuple[str, dict[str, JointLimit], list[str]]:
    """The joint limits of a URDF document: (robot name, limits per joint name, notes on what was not taken).

    Raises:
        UrdfError: the text is not a URDF urdf_parser_py can read.
    """
    from lxml import etree  # here, not at the top: the XML parser loads when a URDF arrives
    from urdf_parser_py import urdf
    from urdf_parser_py.xml_reflection import core

    if not xml.strip():
        raise UrdfError("empty robot description")
    notes: list[str] = []
    with _URDF_LOCK:  # the parser reports unknown tags through a module-level hook
        hook, core.on_error = core.on_error, lambda message: None
        try:
            root = etree.fromstring(xml.encode())
            if root.tag != "robot":
                raise UrdfError(f"the root element is <{root.tag}>, not <robot>")
            robot = urdf.URDF.from_xml_string(xml)
        except UrdfError:
            raise
        except Exception as e:  # ParseError, lxml's XMLSyntaxError, assertions on joint types
            raise UrdfError(f"{type(e).__name__}: {str(e).strip()[:300]}") from e
        finally:
            core.on_error = hook
    limits: dict[str, JointLimit] = {}
    for joint in robot.joints:
        kind, lim = joint.type, joint.limit
        if kind not in ("revolute", "prismatic", "continuous"):
            continue
        if lim is None:
            notes.append(f"{joint.name}: {kind} joint without <limit>")
            continue
        velocity = _finite(lim.velocity)
        velocity = abs(velocity) if velocity else None  # 0: no velocity limit
        lower = upper = None
        if kind != "continuous":
            lower, upper = _finite(lim.lower), _finite(lim.upper)
            if lower is not None and upper is not None and lower > upper:
                notes.append(f"{joint.name}: lower {lower:g} > upper {upper:g}, position limits ignored")
                lower = upper = None
        limits[joint.name] = JointLimit(lower, upper, velocity, "urdf")
    return str(robot.name or ""), limits, notes


def _finite(value: object) -> float | None:
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None
