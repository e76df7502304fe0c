"""Offline evaluation over rosbags, and the bag tools around it, none of which needs DDS except the replayer.

- :mod:`.run`: :func:`evaluate_bag`, the deterministic run of the node's pipeline (input store, observation
  builder, frame runner) over a bag on a virtual clock, configured by the node's own parameters; :mod:`.timing`
  (:class:`ReplayTiming`: the bag clock's delay model that keeps it deterministic, or the wall clock);
- :mod:`.report` (report.json), :mod:`.plots` (PNGs), :mod:`.outputs` (the output bag and the digest),
  :mod:`.typestore` (ROS 2 and oxygen_ros message types for rosbags, storage plugins);
- scores against the recording: :mod:`.reference` (reference topics, annotations, :class:`ScoringOptions`),
  :mod:`.alignment` (the action timing rule, interpolation), :mod:`.scoring` (the metrics);
- many bags: :mod:`.fleet` (:func:`evaluate_fleet`, on Ray or sequential), :mod:`.fleet_worker`, :mod:`.fleet_report`;
- :mod:`.demo_bag` (a synthetic demo bag; the toy world's bags are :mod:`oxygen_ros.toy.demo_fleet`), :mod:`.replay`
  (the DDS bag replayer with /clock, needs rclpy);
- :mod:`.cli`: the command lines (``python -m oxygen_ros.evaluation``, ``oxygen_ros.tools.*`` call it).

Names are loaded on first use, so importing one module (the replayer, say) does not load torch and the model.
"""

from oxygen_ros._lazy import lazy_exports

_EXPORTS = {"evaluate_bag": "run", "REPORT_KEYS": "report", "PLOT_FILES": "plots", "write_plots": "plots",
            "make_demo_bag": "demo_bag", "evaluate_fleet": "fleet",
            "ScoringOptions": "reference", "ReplayTiming": "timing"}

__all__ = ["PLOT_FILES", "REPORT_KEYS", "ReplayTiming", "ScoringOptions", "evaluate_bag", "evaluate_fleet",
           "make_demo_bag", "write_plots"]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
