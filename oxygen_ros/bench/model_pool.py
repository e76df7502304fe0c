"""The sweep's model pool: one benchmark model (and its extra heads) per (preset, compile mode) group of points."""

from __future__ import annotations

import gc
import time

import torch
from torch import nn

from oxygen_ros.bench.models import build_heads, build_model, compile_modules, dtype_name
from oxygen_ros.bench.points import Point
from oxygen_ros.engine import Pi05Model


class ModelPool:
    """The model of the current (preset, compile) group and its extra action heads, built once per group."""

    def __init__(self, device: torch.device, dtype: torch.dtype, compile_backend: str = "inductor") -> None:
        self.device, self.dtype, self.backend = device, dtype, compile_backend
        self.model: Pi05Model | None = None
        self.extra: nn.ModuleList | None = None
        self.point: Point | None = None  # the point the model was built for
        self.info: dict = {}

    def get(self, p: Point) -> tuple[Pi05Model, nn.ModuleList | None]:
        """The model for ``p`` and its ``p.heads - 1`` extra action heads (None for one head)."""
        cur = self.point
        if cur is None or (cur.preset, cur.config, cur.seed) != (p.preset, p.config, p.seed) or (
                cur.compile != p.compile and (cur.compile != "off" or self.info["onednn_linear"])):
            self._build(p)
        elif cur.compile != p.compile:  # off -> compiled: compile the same weights in place
            self._compile(p.compile)
        self.point = p
        if p.heads > 1 and (self.extra is None or len(self.extra) < p.heads - 1):
            self._build_heads(p.heads - 1)
        return self.model, (self.extra[:p.heads - 1] if p.heads > 1 else None)

    def _build(self, p: Point) -> None:
        self.release()
        t0 = time.perf_counter()
        # oneDNN for eager points only: a group measured with torch.compile is built without it
        self.model, onednn = build_model(p.config, p.preset, self.device, self.dtype, p.seed,
                                         onednn=p.onednn and p.compile == "off")
        cfg = self.model.config
        self.info = {"name": cfg.name, "preset": p.preset, "parameters": self.model.num_parameters(),
                     "dtype": dtype_name(self.dtype), "onednn_linear": onednn, "compile": "off",
                     "compiled_modules": 0, "build_s": round(time.perf_counter() - t0, 2), "config": cfg.to_dict()}
        self.point = p
        if p.compile != "off":
            self._compile(p.compile)

    def _compile(self, mode: str) -> None:
        roots = [self.model] + ([self.extra] if self.extra is not None else [])
        self.info = {**self.info, "compile": mode, "compiled_modules": compile_modules(roots, mode, self.backend)}

    def _build_heads(self, count: int) -> None:
        self.extra = build_heads(self.model, count, self.point.seed, self.info["onednn_linear"])
        if self.info["compile"] != "off":
            compile_modules([self.extra], self.info["compile"], self.backend)

    def release(self) -> None:
        """Drop the model and heads (and, on CUDA, the allocator's cached blocks)."""
        self.model = self.extra = self.point = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
