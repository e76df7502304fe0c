"""Kernel choice by measurement: per stage, oneDNN's packed inner product or MKL's GEMM.

Which of the two is faster depends on the host, the thread count and the shape. Measured on the benchmark host
(``small``, 2 threads): packed weights made the prefill 13% faster and the 10-step denoise 16% slower; on ``tiny``
they make every stage slower. A global switch (``cpu_kernels.use_onednn``) cannot be right for every stage, so each
stage is run both ways, on the model itself, and the faster kept:

  stage     stack              what is timed                                          row class (``FEW_ROWS``)
  prefill   backbone           every camera and half the prompt length                many
  decode    backbone           one decode step of ``DECODE_ROWS`` rows                 few
  denoise   the action heads   the S-step loop of the first head                      the head's (one shape)

Runs alternate plain and packed; the verdict is the median of the paired ratios, and packed is kept only when it
takes at most ``MARGIN`` of plain's time (plain, the reference kernel, wins ties). In a precision with openpi's
roundings (``bfloat16_islands``, ``bfloat16_lerobot``: the numbers must be openpi's bit for bit) a stage also keeps
packed weights only where its output equals the plain one bit for bit (KV cache, logits, actions); oneDNN's bf16
inner product and ATen's bf16 GEMM agree wherever measured, but a host whose ATen bf16 GEMM is not oneDNN's would
not. A choice is stored in the
compiled-step cache directory under a key of the sizes, the thread count, the torch version and the CPU, so a later
configure reads it instead of measuring (about 2 s on ``small``, 0.1 s on ``tiny``).
"""

from __future__ import annotations

import json
import logging
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from oxygen_ros.util.host import cpu_name

from ..kv_cache import KVCache
from ..layers import GemmaStack
from ..observation import Observation
from ..parts import HeadParts
from .compiled_store import default_cache_dir, digest
from .fusion import PACKED_DTYPES, fused_stack
from .packed_linear import packed_available

log = logging.getLogger(__name__)

KERNEL_CHOICES = ("auto", "plain", "packed")  # EngineConfig.kernels, less "keep"
MARGIN = 0.97  # packed must take at most this fraction of plain's time
DECODE_ROWS = 4  # a typical decode batch (a single row always runs plain: a vector product either way)
BUDGET_S = 0.6  # measuring time per stage (at least MIN_PAIRS pairs of runs, at most MAX_PAIRS)
MIN_PAIRS, MAX_PAIRS = 5, 40


@dataclass(frozen=True)
class StageTiming:
    """One stage run both ways: median ms of each and the median of the paired ratios packed / plain;
    ``identical``: whether packed gave the plain output bit for bit (checked under openpi's roundings, else None)."""

    stage: str
    rows: int
    plain_ms: float
    packed_ms: float
    ratio: float
    identical: bool | None = None

    @property
    def packed(self) -> bool:
        return self.ratio <= MARGIN and self.identical is not False


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
        detail = "; ".join(f"{t.stage} {t.rows} rows: plain {t.plain_ms:.2f} ms, packed {t.packed_ms:.2f} ms "
                           f"(x{t.ratio:.2f}{IDENTITY[t.identical]})" for t in self.timings)
        return f"kernels ({self.source}): {stages}" + (f" [{detail}]" if detail else "")


IDENTITY = {None: "", True: ", bit-identical", False: ", NOT bit-identical: plain kept"}


def time_pair(first: Callable[[], object], second: Callable[[], object]) -> tuple[float, float, float]:
    """Median ms of ``first`` and ``second`` (CPU work), run in alternating pairs (at least ``MIN_PAIRS``, then
    until ``BUDGET_S``), and the median of the paired ratios second / first."""
    times: tuple[list[float], list[float]] = ([], [])
    runs = (first, second)
    start = time.perf_counter()
    pair = 0
    while pair < MIN_PAIRS or (pair < MAX_PAIRS and time.perf_counter() - start < BUDGET_S):
        for j in (0, 1) if pair % 2 else (1, 0):
            t0 = time.perf_counter()
            runs[j]()
            times[j].append(time.perf_counter() - t0)
        pair += 1
    pairs = list(zip(times[0][1:], times[1][1:], strict=True))  # the first pair warms both up
    ratio = statistics.median(b / a for a, b in pairs)
    return 1e3 * statistics.median(a for a, _ in pairs), 1e3 * statistics.median(b for _, b in pairs), ratio


def synthetic_observation(model, prompt_tokens: int) -> Observation:
    """Random inputs shaped as a frame's: every camera, ``prompt_tokens`` prompt tokens (on the model's device)."""
    cfg, dev = model.config, model.device
    g = torch.Generator().manual_seed(0)
    size = cfg.vision.image_size
    images = torch.rand(1, cfg.num_cameras, 3, size, size, generator=g) * 2 - 1
    tokens = torch.randint(3, cfg.vocab_size, (1, prompt_tokens), generator=g)
    return Observation(images.to(dev, model.input_dtype), torch.ones(1, cfg.num_cameras, dtype=torch.bool, device=dev),
                       tokens.to(dev), torch.ones(1, prompt_tokens, dtype=torch.bool, device=dev))


def identical(set_packed: Callable[[bool], None], run: Callable[[], object]) -> bool:
    """Whether ``run`` (returning the tensors it computed) gives the same bits with packed weights as with plain."""
    set_packed(False)
    plain = [t.clone() for t in run()]
    set_packed(True)
    return all(torch.equal(a, b) for a, b in zip(plain, run(), strict=True))


def measure(model, head: HeadParts, num_steps: int, prefix_tokens: int) -> list[StageTiming]:
    """Run the prefill, one decode step and the denoise loop of ``model`` (random inputs, a scratch cache) with
    plain and packed weights; leaves the stacks packed for every row class. Under openpi's roundings
    (``model.rounded``) each stage's outputs are also compared bit for bit (:class:`StageTiming` ``identical``)."""
    cfg = model.config
    dev = model.device
    backbone, expert = model.backbone, head.stack
    obs = synthetic_observation(model, prefix_tokens)
    cache = KVCache(cfg, DECODE_ROWS, cfg.max_prefix_len + max(head.horizon, 2), dtype=model.dtype, device=dev)
    noise = torch.randn(1, head.horizon, head.action_in_proj.in_features, generator=torch.Generator().manual_seed(1))
    noise = noise.to(dev)
    fused_stack(backbone, pack=True)
    fused_stack(expert, pack=True)

    def both(set_packed: Callable[[bool], None], run: Callable[[], object],
             outputs: Callable[[], list[torch.Tensor]],
             check_packed: Callable[[bool], None] | None = None) -> tuple[float, float, float, bool | None]:
        def with_kernel(packed: bool) -> Callable[[], object]:
            return lambda: (set_packed(packed), run())
        same = identical(check_packed or set_packed, lambda: (run(), outputs())[1]) if model.rounded else None
        return (*time_pair(with_kernel(False), with_kernel(True)), same)

    timings = []
    with torch.no_grad():
        prefix = model.prefill(obs, cache, slice(0, 1))
        rows = int(obs.image_masks.sum()) * cfg.vision.tokens_per_image + prefix_tokens
        timings.append(StageTiming("prefill", rows, *both(
            lambda on: fused_stack(backbone, pack=(True, on)), lambda: model.prefill(obs, cache, slice(0, 1)),
            lambda: [cache.k[:, 0], cache.v[:, 0]],
            lambda on: fused_stack(backbone, pack=(on, on)))))  # the bit check: a short prefix is a few-rows call
        for r in range(1, DECODE_ROWS):  # every decode row reads the same prefix
            cache.k[:, r], cache.v[:, r], cache.valid[r] = cache.k[:, 0], cache.v[:, 0], cache.valid[0]
        p = prefix.length
        step = torch.full((DECODE_ROWS,), p, device=dev)
        decode_tokens = torch.arange(3, 3 + DECODE_ROWS, device=dev)
        logits: list[torch.Tensor] = []

        def decode() -> None:
            logits[:] = [model.decode_step(cache, slice(0, DECODE_ROWS), decode_tokens,
                                           prefix.num_valid.expand(DECODE_ROWS), step, p + 1)]
        timings.append(StageTiming("decode", DECODE_ROWS, *both(
            lambda on: fused_stack(backbone, pack=(on, True)), decode, lambda: logits)))
        actions: list[torch.Tensor] = []

        def denoise() -> None:
            actions[:] = [model.denoise(prefix, cache, noise, num_steps, head)]
        timings.append(StageTiming("denoise", head.horizon, *both(
            lambda on: fused_stack(expert, pack=on), denoise, lambda: actions)))
    return timings


def _key(backbone: GemmaStack, experts: list[GemmaStack], rows: dict[str, int]) -> dict:
    def sizes(s: GemmaStack) -> list[int]:
        g = s.cfg
        return [g.width, g.depth, g.mlp_dim, g.num_heads, g.num_kv_heads, g.head_dim]

    w = backbone.layers[0].mlp.down_proj.weight
    return {"backbone": sizes(backbone), "experts": [sizes(e) for e in experts], "rows": rows,
            "dtype": str(w.dtype),
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "cpu": cpu_name() or platform.processor() or platform.machine()}


def _applicable(stack: GemmaStack) -> bool:
    w = fused_stack(stack).qkv[0].weight
    return w.device.type == "cpu" and w.dtype in PACKED_DTYPES and packed_available(w.dtype)


def choose(model, heads: list[HeadParts], num_steps: int, how: str = "auto",
           cache_dir: str | Path | None = None) -> KernelChoice:
    """Decide (``how`` = auto: measure, or read a stored measurement) and apply the kernels of ``model``'s backbone
    (prefill, decode) and of the action ``heads`` (denoise). Off CPU float32 / bfloat16 or without oneDNN every
    stage stays plain."""
    if how not in KERNEL_CHOICES:
        raise ValueError(f"kernels must be one of {KERNEL_CHOICES}, got {how!r}")
    backbone, experts = model.backbone, [h.stack for h in heads]
    if not all(_applicable(s) for s in [backbone, *experts]):
        choice = KernelChoice(False, False, False, "unavailable", [])
    elif how != "auto":
        on = how == "packed"
        choice = KernelChoice(on, on, on, how, [])
    else:
        cfg = model.config
        prefix_tokens = max(1, cfg.max_token_len // 2)
        key = _key(backbone, experts, {"cameras": cfg.num_cameras, "image_tokens": cfg.vision.tokens_per_image,
                                       "prompt": prefix_tokens, "horizon": heads[0].horizon, "steps": num_steps})
        key["openpi_rounding"] = bool(model.rounded)  # the verdict then includes the bit-identity check
        path = Path(cache_dir) if cache_dir else default_cache_dir()
        path = path / f"kernels-{digest(key)[:20]}.json"
        choice = _read(path, key)
        if choice is None:
            # the first head stands for all: they share the chunk's shape (their widths may differ, rarely the
            # verdict)
            timings = measure(model, heads[0], num_steps, prefix_tokens)
            choice = KernelChoice(*(t.packed for t in timings), "measured", timings)
            _write(path, key, choice)
    fused_stack(backbone, pack=(choice.decode, choice.prefill))
    for e in experts:
        fused_stack(e, pack=(choice.denoise, choice.denoise))
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
