"""The host a result was measured on: the CPU's model name and flags as Linux reports them."""

from __future__ import annotations

from pathlib import Path

__all__ = ["cpu_flags", "cpu_name"]


def _cpuinfo_field(name: str) -> str:
    """The first ``name`` line's value in /proc/cpuinfo, '' where absent or unreadable."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(name):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo's ``model name``), '' where unreadable."""
    return _cpuinfo_field("model name")


def cpu_flags() -> set[str]:
    """The CPU's feature flags (/proc/cpuinfo's ``flags``), empty where unreadable."""
    return set(_cpuinfo_field("flags").split())
