"""``python -m oxygen_ros.bench.sweep``: the paper's evaluation as one resumable, plotted benchmark sweep.

The command line and its documentation are in ``sweep_cli`` (``--help``); the pieces: ``suites`` (grids and the
points of each suite), ``points`` (point ids and the resumable ``points.jsonl``), ``measure`` (one point),
``sweep_run`` (a whole plan), ``sweep_report`` (summary.json / summary.md) and ``sweep_plots`` (PNGs).
"""

from oxygen_ros.bench.sweep_cli import main

__all__ = ["main"]

if __name__ == "__main__":
    main()
