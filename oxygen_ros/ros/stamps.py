"""ROS time <-> integer nanoseconds and seconds: the one place these conversions are written."""

from __future__ import annotations

from typing import Any

from builtin_interfaces.msg import Duration, Time

__all__ = ["NS_PER_S", "duration_msg", "duration_s", "stamp_to_ns", "time_msg", "to_time_msg"]

NS_PER_S = 1_000_000_000


def stamp_to_ns(stamp: Any) -> int:
    """builtin_interfaces/Time or Duration (or anything with ``sec`` / ``nanosec``) -> integer nanoseconds."""
    return int(stamp.sec) * NS_PER_S + int(stamp.nanosec)


def duration_s(duration: Any) -> float:
    """builtin_interfaces/Duration -> seconds."""
    return stamp_to_ns(duration) / NS_PER_S


def time_msg(ns: int) -> Time:
    """Integer nanoseconds -> builtin_interfaces/Time."""
    sec, nanosec = divmod(int(ns), NS_PER_S)
    return Time(sec=sec, nanosec=nanosec)


def duration_msg(seconds: float) -> Duration:
    """Seconds (negative values clamp to 0) -> builtin_interfaces/Duration."""
    sec, nanosec = divmod(max(0, round(seconds * NS_PER_S)), NS_PER_S)
    return Duration(sec=sec, nanosec=nanosec)


def to_time_msg(stamp: Any) -> Time:
    """A builtin_interfaces Time, rclpy Time, integer nanoseconds, anything with ``sec``/``nanosec`` (e.g. a rosbags
    Time) or None (zero) -> builtin_interfaces/Time."""
    if stamp is None:
        return Time()
    if isinstance(stamp, Time):
        return stamp
    if hasattr(stamp, "to_msg"):  # rclpy.time.Time
        return stamp.to_msg()
    if isinstance(stamp, int) or (hasattr(stamp, "dtype") and getattr(stamp, "ndim", 1) == 0):
        return time_msg(int(stamp))
    if hasattr(stamp, "sec") and hasattr(stamp, "nanosec"):
        return Time(sec=int(stamp.sec), nanosec=int(stamp.nanosec))
    raise TypeError(f"stamp must be a builtin_interfaces Time, rclpy Time, int nanoseconds or None, got {stamp!r}")
