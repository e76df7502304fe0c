"""The chunk executor: action chunks in, timed and limited joint setpoints out at the controller's rate, and what
was executed back to real-time chunking (``~/executed``). Its own process (``oxygen-executor``), beside the node.

Pure parts (no ROS): :mod:`.timeline` (timing rule, replace / aggregate switching), :mod:`.aggregation` (LeRobot's
and ACT's merge rules), :mod:`.interpolation` (hold, linear, cubic), :mod:`.setpoint_limits` (position, velocity,
acceleration at the streaming rate, at any tick spacing), :mod:`.streamer` (the tick: hold, halt, stale,
underruns), :mod:`.loop` (the command loop thread: absolute deadlines, or /clock), :mod:`.rt` (SCHED_FIFO, affinity,
switch interval, mlockall for that thread). ROS parts: :mod:`.params`, :mod:`.outputs`, :mod:`.node` (a lifecycle
node), :mod:`.main`. See docs/executor.md.
"""
