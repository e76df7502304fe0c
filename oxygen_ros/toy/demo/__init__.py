"""The embedded demo over ROS 2 (``python -m oxygen_ros.toy.demo``, ``make demo``): the oxygen node as a child process
drives the tabletop simulator (:mod:`oxygen_ros.toy.sim`) while a probe records and scores what it publishes.
:mod:`.run` (the loop, summary, ``main``), :mod:`.scenes` (tabletop / synthetic), :mod:`.config` (finding the
presets in a checkout or an install; ROS-free). The names below load their module on first use.
"""

from oxygen_ros._lazy import lazy_exports

_EXPORTS = {"DemoSummary": "run", "main": "run", "print_summary": "run", "run_demo": "run",
            "config_dirs": "config", "find_config": "config"}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
