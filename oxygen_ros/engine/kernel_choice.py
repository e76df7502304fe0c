"""Kernel choice by measurement: per stack and row class, oneDNN's packed inner product or MKL's GEMM.

Which of the two is faster depends on the host, the thread count and the shape. Measured on the benchmark host
(``small``, 2 threads): packed weights make the prefill 13% faster and the 10-step denoise 16% slower; on ``tiny``
they make both slower. A global switch (``cpu_kernels.use_onednn``) cannot be right for every stage, so each stage's
projections are timed both ways at the shapes it runs and the faster kept:

  stage     stack           rows                          row class (``fusion.FEW_ROWS``)
  prefill   backbone        cameras x image tokens + prompt   many
  decode    backbone        a few language rows               few
  denoise   each action head  the chunk (H)                   few and many (a head runs one shape)

Plain GEMM is the default: packed weights are kept only when they are at least ``MARGIN`` faster. A choice is
stored in the compiled-step cache directory under a key of the sizes, the thread count, the torch version and the
CPU, so a later configure reads it instead of measuring (about 0.3 s on ``small``).
"""

from __future__ import annotations

import json
import logging
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .compiled_store import default_cache_dir, digest
from .fusion import FusedLinear, FusedStack
from .layers import GemmaStack
from .packed_linear import packed_available

log = logging.getLogger(__name__)

KERNEL_CHOICES = ("auto", "plain", "packed")  # EngineConfig.kernels, less "keep"
MARGIN = 0.97  # packed must take at most this fraction of plain's time
DECODE_ROWS = 4  # a typical decode batch (a single row always runs plain: a vector product either way)


@dataclass(frozen=True)
class StageTiming:
    """One stage's projections, timed both ways (median ms over interleaved repeats)."""

    stage: str
    rows: int
    plain_ms: float
    packed_ms: float

    @property
    def packed(self) -> bool:
        return self.packed_ms <= MARGIN * self.plain_ms


@dataclass
class KernelChoice:
    """Packed or plain per stage; ``timings`` is how it was decided (empty when it was not measured)."""

    prefill: bool
    decode: bool
    denoise: bool
    source: str  # "measured" | "cached" | "plain" | "packed" | "unavailable"
    timings: list[StageTiming]

    def summary(self) -> str:
        stages = ", ".join(f"{s} {'packed' if getattr(self, s) else 'plain'}" for s in ("prefill", "decode", "denoise"))
        detail = "; ".join(f"{t.stage} {t.rows} rows: plain {t.plain_ms:.2f} ms, packed {t.packed_ms:.2f} ms"
                           for t in self.timings)
        return f"kernels ({self.source}): {stages}" + (f" [{detail}]" if detail else "")


def _projections(fs: FusedStack, layer: int) -> list[FusedLinear]:
    return [fs.qkv[layer], fs.o[layer], fs.gate_up[layer], fs.down[layer]]


def time_stage(stack: GemmaStack, rows: int, repeats: int = 7) -> tuple[float, float]:
    """Median ms of one layer's four projections at ``rows`` rows, plain GEMM and packed, interleaved."""
    fs = stack.fused(pack=True)  # packed copies (fused once; the caller sets the final policy)
    projections = _projections(fs, 0)
    dev, dtype = projections[0].weight.device, projections[0].weight.dtype
    inputs = [torch.randn(rows, f.weight.shape[1], device=dev, dtype=dtype) for f in projections]
    packed = [f._packed for f in projections]  # noqa: SLF001
    times: dict[bool, list[float]] = {False: [], True: []}
    with torch.no_grad():
        for rep in range(repeats + 1):
            for use in (False, True) if rep % 2 else (True, False):
                t0 = time.perf_counter()
                for f, p, x in zip(projections, packed, inputs, strict=True):
                    p.apply(x) if use else torch.nn.functional.linear(x, f.weight, f.bias)
                if rep:  # the first round warms both up
                    times[use].append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times[False]), 1e3 * statistics.median(times[True])


def _key(backbone: GemmaStack, experts: list[GemmaStack], rows: dict[str, int]) -> dict:
    def sizes(s: GemmaStack) -> list[int]:
        g = s.cfg
        return [g.width, g.depth, g.mlp_dim, g.num_heads, g.num_kv_heads, g.head_dim]

    return {"backbone": sizes(backbone), "experts": [sizes(e) for e in experts], "rows": rows,
            "threads": torch.get_num_threads(), "torch": torch.__version__, "cpu": _cpu_name()}


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _applicable(stack: GemmaStack) -> bool:
    w = stack.fused().qkv[0].weight
    return w.device.type == "cpu" and w.dtype == torch.float32 and packed_available()


def choose(backbone: GemmaStack, experts: list[GemmaStack], prefix_rows: int, action_rows: int, how: str = "auto",
           cache_dir: str | Path | None = None) -> KernelChoice:
    """Decide (``how`` = auto: measure, or read a stored measurement) and apply the kernels of ``backbone`` (prefill,
    decode) and ``experts`` (denoise). Off CPU float32 or without oneDNN every stage stays plain."""
    if how not in KERNEL_CHOICES:
        raise ValueError(f"kernels must be one of {KERNEL_CHOICES}, got {how!r}")
    stacks = [backbone, *experts]
    if not all(_applicable(s) for s in stacks):
        choice = KernelChoice(False, False, False, "unavailable", [])
    elif how != "auto":
        on = how == "packed"
        choice = KernelChoice(on, on, on, how, [])
    else:
        rows = {"prefill": prefix_rows, "decode": DECODE_ROWS, "denoise": action_rows}
        key = _key(backbone, experts, rows)
        path = Path(cache_dir) if cache_dir else default_cache_dir()
        path = path / f"kernels-{digest(key)[:20]}.json"
        choice = _read(path, key)
        if choice is None:
            timings = [StageTiming("prefill", prefix_rows, *time_stage(backbone, prefix_rows)),
                       StageTiming("decode", DECODE_ROWS, *time_stage(backbone, DECODE_ROWS))]
            # one action head stands for all: they share the chunk's shape (the widths may differ, rarely the
            # verdict)
            timings.append(StageTiming("denoise", action_rows, *time_stage(experts[0], action_rows)))
            choice = KernelChoice(*(t.packed for t in timings), "measured", timings)
            _write(path, key, choice)
    backbone.fused(pack=(choice.decode, choice.prefill))
    for e in experts:
        e.fused(pack=(choice.denoise, choice.denoise))
    log.info(choice.summary())
    return choice


def _read(path: Path, key: dict) -> KernelChoice | None:
    try:
        data = json.loads(path.read_text())
        if data["key"] != json.loads(json.dumps(key)):
            return None
        c = data["choice"]
        return KernelChoice(c["prefill"], c["decode"], c["denoise"], "cached",
                            [StageTiming(**t) for t in c["timings"]])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent, unreadable or another key: measure again


def _write(path: Path, key: dict, choice: KernelChoice) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"key": key, "choice": asdict(choice)}, indent=1))
        tmp.replace(path)
    except OSError as e:  # a read-only cache: the choice holds for this process only
        log.warning("could not store the kernel choice in %s: %s", path, e)
