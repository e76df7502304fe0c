"""Per-stage latency and memory of pi0.5 for a config/device/dtype (calibrates the CPU benchmark configs).

    oxygen-profile --config small --preset libero --batches 1 2 4 8 16 32
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys

import torch

from oxygen_ros.bench.progress import progress_bar
from oxygen_ros.engine import KVCache, Observation, Pi05Model, get_config
from oxygen_ros.engine.checkpoint import init_random_weights
from oxygen_ros.engine.cpu_kernels import use_onednn
from oxygen_ros.engine.timing import median_time

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def dummy_observation(model: Pi05Model, batch: int = 1, prompt_len: int | None = None) -> Observation:
    """A full-size observation: every camera visible, a prompt of ``prompt_len`` tokens (default: max)."""
    cfg = model.config
    n = prompt_len or cfg.max_token_len
    s = cfg.vision.image_size
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(3, cfg.vocab_size, (batch, cfg.max_token_len), generator=g)
    mask = torch.zeros(batch, cfg.max_token_len, dtype=torch.bool)
    mask[:, :n] = True
    return Observation(
        images=(torch.rand(batch, cfg.num_cameras, 3, s, s, generator=g) * 2 - 1),
        image_masks=torch.ones(batch, cfg.num_cameras, dtype=torch.bool),
        tokens=tokens.masked_fill(~mask, 0),
        token_mask=mask,
    ).to(model.device, model.dtype)


def profile_stages(model: Pi05Model, batches: list[int], repeats: int = 5, decode_context: int = 30,
                   prompt_len: int | None = None, lora=None) -> dict:
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
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="small", help="model config: tiny, small, pi05")
    ap.add_argument("--preset", default="libero", help="workload preset: libero, droid, aloha")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="default: float32 on CPU, bfloat16 on GPU")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prompt-len", type=int, default=None, help="valid prompt tokens (default: max_token_len)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-onednn", action="store_true", help="keep plain F.linear on CPU (default: oneDNN)")
    ap.add_argument("--lora-rank", type=int, default=0,
                    help="also time decode steps with a random suffix LoRA of this rank on every projection")
    ap.add_argument("--json", default=None, help="also write the result to this JSON file")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype or ("bfloat16" if device.type == "cuda" else "float32")]
    cfg = get_config(args.config, args.preset)
    model = init_random_weights(Pi05Model(cfg)).to(device=device, dtype=dtype).eval()
    onednn = device.type == "cpu" and dtype == torch.float32 and not args.no_onednn and use_onednn(model) > 0
    lora = None
    if args.lora_rank:
        from oxygen_ros.engine.lora import TARGETS, LoraAdapter, random_lora_weights

        weights = random_lora_weights(model, r=args.lora_rank, modules=TARGETS)
        lora = LoraAdapter({k: (a.to(device, dtype), b.to(device, dtype)) for k, (a, b) in weights.items()}, 2.0)
    res = profile_stages(model, args.batches, args.repeats, prompt_len=args.prompt_len, lora=lora)
    res.update(config=cfg.name, preset=args.preset, device=str(device), dtype=str(dtype).replace("torch.", ""),
               parameters=model.num_parameters(), onednn_linear=onednn, peak_memory_bytes=peak_memory_bytes(device),
               machine=platform.processor() or platform.machine(), threads=torch.get_num_threads())
    p, d = res["prefill_s"], res["denoise_s"]
    print(f"{cfg.name}/{args.preset} on {device} {res['dtype']}: {res['parameters'] / 1e6:.1f}M parameters, "
          f"{res['prefix_tokens']} prefix tokens, {torch.get_num_threads()} threads, oneDNN linear: {onednn}")
    print(f"  prefill            {p * 1e3:9.2f} ms")
    print(f"  denoise (S={cfg.num_steps:2d})     {d * 1e3:9.2f} ms   prefill/denoise = {p / d:.2f}")
    for b, t in res["decode_step_s"].items():
        print(f"  decode step B={b:<3d} {t * 1e3:9.2f} ms   /prefill = {t / p:.3f}   per row {t / b * 1e3:.2f} ms")
    for b, t in res.get("decode_step_lora_s", {}).items():
        base = res["decode_step_s"][b]
        print(f"  + LoRA r={args.lora_rank:<3d} B={b:<3d} {t * 1e3:7.2f} ms   overhead {100 * (t / base - 1):+.1f}%")
    print(f"  KV cache per slot  {res['kv_cache_bytes_per_slot'] / 2**20:9.2f} MiB")
    print(f"  peak memory        {res['peak_memory_bytes'] / 2**30:9.2f} GiB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
