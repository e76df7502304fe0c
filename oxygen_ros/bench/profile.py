"""Stage profiler: median latency of prefill, full denoise and one decode step per batch size, and memory.

``profile_stages`` times a model you have (the benchmarks feed its numbers to the cost model);
``profile_config`` builds the benchmark model of a config and profiles it (``oxygen-profile``).
"""

from __future__ import annotations

import platform
import resource
from typing import TYPE_CHECKING

import torch

from oxygen_ros.bench.models import build_model, dtype_name
from oxygen_ros.bench.observation import dummy_observation
from oxygen_ros.bench.progress import progress_bar
from oxygen_ros.engine import KVCache, Pi05Model
from oxygen_ros.engine.timing import median_time

if TYPE_CHECKING:
    from oxygen_ros.engine.lora import LoraAdapter


def profile_stages(model: Pi05Model, batches: list[int], repeats: int = 5, decode_context: int = 30,
                   prompt_len: int | None = None, lora: LoraAdapter | None = None) -> dict:
    """Median seconds of prefill, full denoise and one decode step per batch size (and with ``lora``, a
    ``LoraAdapter`` applied to every row, the same decode steps with the adapter)."""
    cfg, dev = model.config, model.device
    obs = dummy_observation(model, 1, prompt_len)
    max_b = max(batches)
    cache = KVCache.for_model(cfg, max_b, extra_tokens=decode_context + 1, dtype=model.dtype, device=dev)
    rows = slice(0, 1)
    prefill_s = median_time(lambda: model.prefill(obs, cache, rows), repeats, dev)
    prefix = model.prefill(obs, cache, rows)
    noise = torch.randn(1, cfg.action_horizon, cfg.action_dim, device=dev)
    denoise_s = median_time(lambda: model.denoise(prefix, cache, noise), repeats, dev)
    # every slot holds the same prefix (copied: profiling only) plus decode_context generated tokens
    cache.k[:, 1:max_b] = cache.k[:, :1]
    cache.v[:, 1:max_b] = cache.v[:, :1]
    cache.valid[1:max_b] = cache.valid[:1]
    cache.valid[:, prefix.length:prefix.length + decode_context] = True
    decode, decode_lora = {}, {}
    for b in progress_bar(batches, desc="decode batch sizes", leave=False):
        idx = torch.full((b,), prefix.length + decode_context, device=dev)
        pos = prefix.num_valid.expand(b) + decode_context
        tokens = torch.full((b,), 5, device=dev)
        for table, adapter in ((decode, None), (decode_lora, lora)) if lora is not None else ((decode, None),):
            if adapter is not None:
                adapter.row_mask = None  # every row adapted
            table[b] = median_time(
                lambda b=b, idx=idx, pos=pos, tokens=tokens, adapter=adapter: model.decode_step(
                    cache, slice(0, b), tokens, pos, idx, prefix.length + decode_context + 1, adapter),
                repeats, dev)
    extra = {"decode_step_lora_s": decode_lora} if lora is not None else {}
    return {
        **extra,
        "prefix_tokens": prefix.length,
        "prefill_s": prefill_s,
        "denoise_s": denoise_s,
        "denoise_step_s": denoise_s / cfg.num_steps,
        "decode_step_s": decode,
        "kv_cache_bytes_per_slot": cache.nbytes // max_b,
    }


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory of this process: the CUDA allocator's peak on CUDA, else the resident set's high-water mark."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def random_lora(model: Pi05Model, rank: int) -> LoraAdapter:
    """A random suffix ``LoraAdapter`` of ``rank`` on every projection, on the model's device and dtype."""
    from oxygen_ros.engine.lora import TARGETS, LoraAdapter, random_lora_weights

    weights = random_lora_weights(model, r=rank, modules=TARGETS)
    device, dtype = model.device, model.dtype
    return LoraAdapter({k: (a.to(device, dtype), b.to(device, dtype)) for k, (a, b) in weights.items()}, 2.0)


def profile_config(config: str, preset: str, device: torch.device, dtype: torch.dtype, batches: list[int],
                   repeats: int = 5, prompt_len: int | None = None, onednn: bool = True,
                   lora_rank: int = 0) -> dict:
    """Build the benchmark model of ``config``/``preset`` and profile it; the result names the machine and model."""
    model, onednn = build_model(config, preset, device, dtype, onednn=onednn)
    lora = random_lora(model, lora_rank) if lora_rank else None
    res = profile_stages(model, batches, repeats, prompt_len=prompt_len, lora=lora)
    res.update(config=model.config.name, preset=preset, device=str(device), dtype=dtype_name(dtype),
               parameters=model.num_parameters(), onednn_linear=onednn, peak_memory_bytes=peak_memory_bytes(device),
               machine=platform.processor() or platform.machine(), threads=torch.get_num_threads())
    return res


def format_profile(res: dict, num_steps: int, lora_rank: int = 0) -> str:
    """The human-readable report of a ``profile_config`` result (``num_steps``: the config's denoise steps)."""
    p, d = res["prefill_s"], res["denoise_s"]
    lines = [f"{res['config']}/{res['preset']} on {res['device']} {res['dtype']}: {res['parameters'] / 1e6:.1f}M "
             f"parameters, {res['prefix_tokens']} prefix tokens, {res['threads']} threads, "
             f"oneDNN linear: {res['onednn_linear']}",
             f"  prefill            {p * 1e3:9.2f} ms",
             f"  denoise (S={num_steps:2d})     {d * 1e3:9.2f} ms   prefill/denoise = {p / d:.2f}"]
    for b, t in res["decode_step_s"].items():
        lines.append(f"  decode step B={b:<3d} {t * 1e3:9.2f} ms   /prefill = {t / p:.3f}   "
                     f"per row {t / b * 1e3:.2f} ms")
    for b, t in res.get("decode_step_lora_s", {}).items():
        base = res["decode_step_s"][b]
        lines.append(f"  + LoRA r={lora_rank:<3d} B={b:<3d} {t * 1e3:7.2f} ms   overhead {100 * (t / base - 1):+.1f}%")
    lines.append(f"  KV cache per slot  {res['kv_cache_bytes_per_slot'] / 2**20:9.2f} MiB")
    lines.append(f"  peak memory        {res['peak_memory_bytes'] / 2**30:9.2f} GiB")
    return "\n".join(lines)
