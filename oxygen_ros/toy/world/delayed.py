"""Chunk execution under inference delay: the world keeps executing the current chunk while the next one is computed.

World time is counted in action steps (one :meth:`TabletopWorld.apply` each). Action i of a chunk computed from the
observation taken at world step t is the command for step t + i (the target for t + i + 1: the project's action
timing rule). A frame observes at step t and its chunk is ready ``delay`` steps later: during steps t .. t + d - 1 the
robot executes what it was already commanded (the previous chunk; once that ran out, its last action held; before
the first chunk of an episode, the joint state it started in), and at step t + d the new chunk takes over from its
action d (actions 0 .. d - 1 were committed: their time passed during inference).

Replanning follows the ROS node: one inference thread, woken by a control timer every ``period`` steps (the
tabletop preset: 10 Hz control, 20 Hz actions, ``period`` 2). A frame that is not late waits for the next tick; a
tick that fell inside a late frame starts the next frame at once when it finishes. So the next observation is taken
at step t + max(period, delay).

How the new chunk takes over (``blend``):

- ``replace``: from action d on, the new chunk alone (the naive switch, and real-time chunking's: there the new
  chunk was already guided toward the old one's remainder);
- ``weighted_average``: LeRobot async inference's aggregation: on the steps both chunks cover, ``old_weight`` * old
  + (1 - ``old_weight``) * new (0.3 / 0.7), the new chunk alone after the old one's end; the blend is what the robot
  executes and what the next chunk is blended with.

Everything the robot was commanded is kept (:attr:`DelayedExecutor.commanded`, one row per executed step), and every
switch between two chunks (:class:`Switch`): the action the old schedule would have commanded at the switch step and
the one the new schedule commands there.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .tabletop import TabletopWorld, WorldObservation

__all__ = ["BLENDS", "DelayedExecutor", "Switch"]

BLENDS = ("replace", "weighted_average")


@dataclass(frozen=True)
class Switch:
    """One chunk switch at world step ``step``: ``old`` what the running schedule would have commanded there (its
    last action held when it ran out), ``new`` what the new one commands."""

    step: int
    old: np.ndarray
    new: np.ndarray

    @property
    def jump(self) -> np.ndarray:
        """new - old, per action dimension."""
        return self.new - self.old


class DelayedExecutor:
    """Drives a :class:`TabletopWorld` with chunks that arrive ``delay`` steps after their observation.

    Use: ``obs = ex.reset(seed)``; then, while ``not ex.done``: compute a chunk from ``obs`` (taken at world step
    :attr:`observed_at`), ``obs = ex.execute(chunk)``.
    """

    def __init__(self, world: TabletopWorld, delay: int, period: int, blend: str = "replace",
                 old_weight: float = 0.3) -> None:
        if delay < 0 or period < 1:
            raise ValueError(f"delay must be >= 0 and period >= 1, got delay={delay}, period={period}")
        if blend not in BLENDS:
            raise ValueError(f"blend must be one of {BLENDS}, got {blend!r}")
        if not 0 <= old_weight <= 1:
            raise ValueError(f"old_weight must be in [0, 1], got {old_weight}")
        self.world, self.delay, self.period, self.blend, self.old_weight = world, delay, period, blend, old_weight
        self.commanded: list[np.ndarray] = []
        self.switches: list[Switch] = []
        self._plan = np.zeros((0, 0))  # the running schedule: row j commands step _plan_start + j
        self._plan_start = 0
        self._first = True
        self.observed_at = 0

    @property
    def stride(self) -> int:
        """World steps from one observation to the next: max(period, delay)."""
        return max(self.period, self.delay)

    @property
    def done(self) -> bool:
        """The episode ended (success or the step limit)."""
        return self.world.done

    def reset(self, seed: int) -> WorldObservation:
        """A new episode: the world's scene of ``seed``; the robot holds its initial joint state until the first
        chunk takes over. Returns the first observation (step 0)."""
        obs = self.world.reset(seed)
        self._plan = np.asarray(obs.state, dtype=np.float64)[None].copy()
        self._plan_start, self._first, self.observed_at = 0, True, 0
        self.commanded, self.switches = [], []
        return obs

    def command(self, step: int) -> np.ndarray:
        """What the running schedule commands at world ``step`` (its last row once it ran out)."""
        j = min(max(step - self._plan_start, 0), len(self._plan) - 1)
        return self._plan[j]

    def _run_until(self, step: int) -> None:
        while self.world.steps < step and not self.world.done:
            action = self.command(self.world.steps).copy()
            self.commanded.append(action)
            self.world.apply(action)

    def _take_over(self, chunk: np.ndarray, origin: int) -> None:
        """The chunk observed at ``origin`` becomes the schedule from step ``origin + delay`` (its action d on)."""
        switch = origin + self.delay
        new = chunk[min(self.delay, len(chunk) - 1):]
        if self.blend == "weighted_average":
            old_rows = self._plan[max(switch - self._plan_start, 0):] if not self._first else self._plan[:0]
            n = min(len(old_rows), len(new))
            new = new.copy()
            new[:n] = self.old_weight * old_rows[:n] + (1 - self.old_weight) * new[:n]
        if not self._first:
            self.switches.append(Switch(switch, self.command(switch).copy(), new[0].copy()))
        self._plan, self._plan_start, self._first = new, switch, False

    def execute(self, chunk: np.ndarray) -> WorldObservation:
        """Execute ``chunk`` [H, A] (world units), computed from the observation taken at :attr:`observed_at`:
        the running schedule until the chunk is ready, then the chunk, until the next observation (or the episode's
        end). Returns that observation."""
        chunk = np.asarray(chunk, dtype=np.float64)
        if chunk.ndim != 2 or len(chunk) == 0 or not np.all(np.isfinite(chunk)):
            raise ValueError(f"a chunk must be a finite [H, A] array, got shape {chunk.shape}")
        origin = self.observed_at
        self._run_until(origin + self.delay)
        if not self.world.done:  # the episode may end before the chunk is ready: then it never takes over
            self._take_over(chunk, origin)
            self._run_until(origin + self.stride)
        self.observed_at = origin + self.stride
        return self.world.observation()
