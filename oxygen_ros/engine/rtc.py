"""Real-time chunking (Black, Galliker, Levine 2025, arXiv 2506.07339): the denoise of a new chunk inpaints the
previous chunk's remainder, so consecutive chunks agree where they overlap in time.

While chunk n+1 is computed (``delay`` d control steps), the robot keeps executing chunk n. The new chunk's first d
actions are guided with full weight toward what chunk n commands for those steps, the next ones up to the execution
horizon E with a decaying weight, the rest are free (:func:`prefix_weights`). Each Euler step (time t from 1 =
noise to 0 = data, ``x <- x + dt * v``) predicts the clean chunk ``x1 = x - t * v`` and corrects the velocity:

    v' = v - g_t * J^T (W * (Y - x1)),   g_t = min(beta, (1 - tau) / (tau * r^2)),   tau = 1 - t,
                                          r^2 = (1 - tau)^2 / (tau^2 + (1 - tau)^2)

with Y the previous chunk's remainder in the model's normalised action space, zero-padded to the chunk (in time and
in action dims, as LeRobot pads it), W the prefix weights and J = dx1/dx. ``identity`` guidance takes J = I
(LeRobot 0.6.1's: no backward pass); ``vjp`` takes the vector-Jacobian product through the action expert (the paper's
and PI's reference code), with the prefix K/V held constant. Every value here follows LeRobot 0.6.1's
``RTCProcessor`` op for op (float32 weights and guidance weights), so the identity variant reproduces its chunks.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["GUIDANCES", "SCHEDULES", "RTCConfig", "RTCGuide", "RTCPrefix", "guidance_weight", "prefix_weights"]

SCHEDULES = ("zeros", "ones", "linear", "exp")
GUIDANCES = ("identity", "vjp")


@dataclass(frozen=True)
class RTCConfig:
    """How chunks are guided (LeRobot's ``RTCConfig`` plus the guidance variant).

    enabled: guide when a previous chunk is given (False: every chunk from plain noise).
    guidance: ``identity`` (J = I, no backward pass; LeRobot) or ``vjp`` (J^T through the action expert; the paper).
    schedule: prefix weights between the delay and the execution horizon: zeros | ones | linear | exp.
    max_guidance_weight: beta, the clamp of the guidance weight.
    execution_horizon: E, where the guided region ends (capped at the remainder's length).
    """

    enabled: bool = True
    guidance: str = "identity"
    schedule: str = "linear"
    max_guidance_weight: float = 10.0
    execution_horizon: int = 10

    def __post_init__(self) -> None:
        if self.guidance not in GUIDANCES:
            raise ValueError(f"rtc guidance must be one of {GUIDANCES}, got {self.guidance!r}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"rtc schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if not self.max_guidance_weight > 0:
            raise ValueError(f"rtc max_guidance_weight must be > 0, got {self.max_guidance_weight}")
        if self.execution_horizon < 0:
            raise ValueError(f"rtc execution_horizon must be >= 0, got {self.execution_horizon}")


@dataclass
class RTCPrefix:
    """The previous chunk's part that the new chunk should continue, for one frame.

    actions: [T, A'] the previous chunk's remainder from the new observation's first action step on, in the
        model's normalised action space (T <= H; A' <= the model's action dim: the rest is zero-padded).
    delay: d, how many of its actions execute while the new chunk is computed (guided with full weight).
    execution_horizon: E for this frame (None: the config's).
    """

    actions: torch.Tensor | np.ndarray
    delay: int
    execution_horizon: int | None = None


def _linear_ramp(start: int, end: int, total: int) -> torch.Tensor:
    steps = total - max(total - end, 0) - start
    if end <= start or steps <= 0:
        return torch.tensor([])
    return torch.linspace(1, 0, steps + 2)[1:-1]


def prefix_weights(delay: int, execution_horizon: int, horizon: int, schedule: str) -> torch.Tensor:
    """W [horizon] (float32): 1 on the first ``delay`` actions, a ramp to 0 until ``execution_horizon`` (ones, a
    straight line or LeRobot's exp curve), 0 after it (LeRobot 0.6.1's ``get_prefix_weights``, value for value)."""
    start, end, total = min(delay, execution_horizon), execution_horizon, horizon
    if schedule == "zeros":
        w = torch.zeros(total)
        w[:start] = 1.0
        return w
    if schedule == "ones":
        w = torch.ones(total)
        w[end:] = 0.0
        return w
    if schedule not in ("linear", "exp"):
        raise ValueError(f"rtc schedule must be one of {SCHEDULES}, got {schedule!r}")
    w = _linear_ramp(start, end, total)
    if schedule == "exp":
        w = w * torch.expm1(w).div(math.e - 1)
    if total - end > 0:
        w = torch.cat([w, torch.zeros(total - end)])
    if min(start, total) > 0:
        w = torch.cat([torch.ones(min(start, total)), w])
    return w


def guidance_weight(time: float, max_guidance_weight: float) -> float:
    """g_t at flow time ``time`` (1 = noise), clamped to beta: LeRobot's float32 arithmetic, as an exact float."""
    beta = torch.as_tensor(max_guidance_weight)
    tau = torch.as_tensor(1 - time)
    one_minus_sq = (1 - tau) ** 2
    inv_r2 = (one_minus_sq + tau ** 2) / one_minus_sq
    c = torch.nan_to_num((1 - tau) / tau, posinf=beta)
    return float(torch.minimum(torch.nan_to_num(c * inv_r2, posinf=beta), beta))


@functools.lru_cache(maxsize=16)
def _step_gains(num_steps: int, max_guidance_weight: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Each Euler step's flow time (LeRobot's ``1 + k * dt``) and guidance weight (computed once per setting)."""
    dt = -1.0 / num_steps
    times = tuple(1.0 + k * dt for k in range(num_steps))
    return times, tuple(guidance_weight(t, max_guidance_weight) for t in times)


@dataclass
class RTCGuide:
    """One frame's guidance, ready for the denoise loop: target Y [1, H, A], weights W [1, H, 1] and per step the
    flow time t and guidance weight g (Python floats: constants in a traced graph)."""

    target: torch.Tensor
    weights: torch.Tensor
    times: list[float]
    gains: list[float]
    vjp: bool = False

    @staticmethod
    def build(prefix: RTCPrefix, config: RTCConfig, horizon: int, action_dim: int, num_steps: int,
              device: torch.device | str = "cpu") -> RTCGuide:
        """The guide of one frame. Raises ValueError on a remainder that is not [T, A'] with A' <= ``action_dim``
        or holds non-finite values."""
        y = torch.as_tensor(np.asarray(prefix.actions) if not isinstance(prefix.actions, torch.Tensor)
                            else prefix.actions).detach().float().cpu()
        if y.ndim == 3 and y.shape[0] == 1:
            y = y[0]
        if y.ndim != 2 or y.shape[1] > action_dim:
            raise ValueError(f"rtc remainder must be [T, <= {action_dim}], got {tuple(y.shape)}")
        if not torch.isfinite(y).all():
            raise ValueError("rtc remainder contains NaN or Inf")
        if prefix.delay < 0:
            raise ValueError(f"rtc delay must be >= 0, got {prefix.delay}")
        y = y[:horizon]
        end = config.execution_horizon if prefix.execution_horizon is None else prefix.execution_horizon
        end = min(end, y.shape[0])  # LeRobot caps E at the remainder's length
        target = torch.zeros(1, horizon, action_dim)
        target[0, : y.shape[0], : y.shape[1]] = y
        weights = prefix_weights(prefix.delay, end, horizon, config.schedule)[None, :, None]
        times, gains = _step_gains(num_steps, config.max_guidance_weight)
        return RTCGuide(target.to(device), weights.to(device), list(times), list(gains), config.guidance == "vjp")

    def to(self, device: torch.device | str) -> RTCGuide:
        return RTCGuide(self.target.to(device), self.weights.to(device), self.times, self.gains, self.vjp)

    def apply(self, step: int, x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Identity guidance of step ``step``: the velocity ``v`` at ``x`` corrected toward the target."""
        x1 = x - self.times[step] * v
        err = (self.target - x1) * self.weights
        return v - self.gains[step] * err

    def apply_vjp(self, step: int, x: torch.Tensor, velocity: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """``vjp`` guidance of step ``step``: ``velocity`` (differentiable in x) evaluated at ``x`` and corrected
        with J^T W (Y - x1) (one backward pass through the action expert)."""
        with torch.enable_grad():
            x = x.detach().requires_grad_(True)
            v = velocity(x)
            x1 = x - self.times[step] * v
            err = ((self.target - x1) * self.weights).detach()
            correction = torch.autograd.grad(x1, x, err)[0]
        return v.detach() - self.gains[step] * correction
