"""What openpi's exact numbers cost: the fused prefill in openpi's padded layout vs compacted, under
``bfloat16_islands`` (``python -m oxygen_ros.bench.prefill_layout``).

Per setup (cameras masked or not, prompt padded or not), one frame's action path (prefill + S-step denoise, fused)
runs in both layouts, interleaved in pairs (the order alternating); the paired ratio compact / padded is the speed
cost of exactness. Each setup also records how far the compacted actions move from the padded ones and whether
the padded fused path equals the eager reference bit for bit.

Writes ``results.json``, ``summary.md`` and ``prefill_layout.png`` into ``--out`` (default runs/prefill_layout).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from oxygen_ros.bench.models import build_model
from oxygen_ros.bench.report import save_figure, write_run
from oxygen_ros.bench.runner import machine_info
from oxygen_ros.engine import Observation, Pi05Model
from oxygen_ros.engine.backends.precision import apply_precision
from oxygen_ros.engine.kv_cache import KVCache
from oxygen_ros.util.host import cpu_name

# name -> (masked camera slots, valid prompt tokens; None: the whole max_token_len)
SETUPS = {
    "masked_camera_padded_prompt": ((2,), 20),  # openpi LIBERO / DROID: a zero right-wrist slot, padded prompt
    "all_cameras_padded_prompt": ((), 20),
    "all_cameras_full_prompt": ((), None),  # nothing to compact: the control (ratio ~1)
}


def observation(model: Pi05Model, masked: tuple[int, ...], valid: int | None) -> Observation:
    """One observation in the model's input dtype: every slot, ``masked`` slots zero and masked out, the prompt
    padded to ``max_token_len`` with ``valid`` real tokens."""
    cfg = model.config
    g = torch.Generator().manual_seed(0)
    s, n = cfg.vision.image_size, cfg.max_token_len
    images = torch.rand(1, cfg.num_cameras, 3, s, s, generator=g) * 2 - 1
    masks = torch.ones(1, cfg.num_cameras, dtype=torch.bool)
    for c in masked:
        images[:, c] = -1.0  # openpi's zero image, in [-1, 1]
        masks[:, c] = False
    token_mask = torch.zeros(1, n, dtype=torch.bool)
    token_mask[:, : valid or n] = True
    tokens = torch.randint(3, cfg.vocab_size, (1, n), generator=g).masked_fill(~token_mask, 0)
    return Observation(images, masks, tokens, token_mask).to(model.device, model.input_dtype)


def frame(model: Pi05Model, obs: Observation, noise: torch.Tensor, layout: str) -> torch.Tensor:
    """The action path of one frame: prefill (``layout``) + denoise; the chunk [1, H, A]."""
    cache = KVCache.for_model(model.config, 1, dtype=model.dtype, device=model.device)
    return model.denoise(model.prefill(obs, cache, layout=layout), cache, noise)


def paired(a, b, pairs: int) -> dict:
    """Median seconds of ``a`` and ``b`` run in ``pairs`` alternating pairs, and the median paired ratio b / a."""
    ta, tb, ratios = [], [], []
    a(), b()  # warm
    for i in range(pairs):
        times = {}
        for name, fn in ((("a", a), ("b", b)) if i % 2 == 0 else (("b", b), ("a", a))):
            t0 = time.perf_counter()
            fn()
            times[name] = time.perf_counter() - t0
        ta.append(times["a"])
        tb.append(times["b"])
        ratios.append(times["b"] / times["a"])
    return {"padded_ms": 1e3 * statistics.median(ta), "compact_ms": 1e3 * statistics.median(tb),
            "compact_over_padded": statistics.median(ratios), "pairs": pairs}


def run(config: str, precision: str, pairs: int, threads: int) -> dict:
    torch.set_num_threads(threads)
    model, _ = build_model(config, None, torch.device("cpu"), torch.float32, onednn=False)
    apply_precision(model, precision)
    cfg = model.config
    noise = torch.randn(1, cfg.action_horizon, cfg.action_dim, generator=torch.Generator().manual_seed(1))
    res: dict = {"created": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                 "machine": {**machine_info(torch.device("cpu")), "cpu": cpu_name()},
                 "config": {"model": config, "precision": precision, "threads": threads, "pairs": pairs,
                            "cameras": cfg.num_cameras, "tokens_per_image": cfg.vision.tokens_per_image,
                            "max_token_len": cfg.max_token_len, "S": cfg.num_steps, "H": cfg.action_horizon},
                 "setups": {}}
    with torch.no_grad():
        for name, (masked, valid) in SETUPS.items():
            obs = observation(model, masked, valid)
            padded = frame(model, obs, noise, "padded")
            compact = frame(model, obs, noise, "compact")
            eager = frame(model.with_stages("eager"), obs, noise, "padded")
            point = paired(lambda obs=obs: frame(model, obs, noise, "padded"),
                           lambda obs=obs: frame(model, obs, noise, "compact"), pairs)
            point.update({"masked_cameras": list(masked), "valid_prompt_tokens": valid or cfg.max_token_len,
                          "compact_vs_padded_max_abs": float((compact - padded).abs().max()),
                          "padded_equals_eager": bool(torch.equal(padded, eager)),
                          "compact_equals_eager": bool(torch.equal(compact, eager))})
            res["setups"][name] = point
            print(name, point, flush=True)
    return res


def summary(res: dict) -> str:
    c = res["config"]
    lines = [f"{c['model']} in {c['precision']}, {c['threads']} threads, {c['pairs']} interleaved pairs "
             f"({res['created']}, {res['machine'].get('cpu', res['machine'].get('device'))})", "",
             "| setup | padded ms (median) | compact ms (median) | compact / padded (paired median) | cost of "
             "exactness | compact moves actions by | padded == eager | compact == eager |", "|" + "---|" * 8]
    for name, p in res["setups"].items():
        lines.append(f"| {name} | {p['padded_ms']:.1f} | {p['compact_ms']:.1f} | {p['compact_over_padded']:.3f} | "
                     f"{1 / p['compact_over_padded']:.2f}x | {p['compact_vs_padded_max_abs']:.2g} | "
                     f"{p['padded_equals_eager']} | {p['compact_equals_eager']} |")
    return "\n".join(lines)


def plot(res: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(res["setups"])
    fig, ax = plt.subplots(figsize=(7, 3.5))
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], [res["setups"][n]["padded_ms"] for n in names], 0.4, label="padded (openpi's)")
    ax.bar([i + 0.2 for i in x], [res["setups"][n]["compact_ms"] for n in names], 0.4, label="compact")
    ax.set_xticks(list(x), [n.replace("_", "\n") for n in names], fontsize=7)
    ax.set_ylabel("frame ms (prefill + denoise, median)")
    ax.set_title(f"{res['config']['model']} {res['config']['precision']}: prefill layout")
    ax.legend()
    return save_figure(fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="small")
    ap.add_argument("--precision", default="bfloat16_islands")
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("runs/prefill_layout"))
    a = ap.parse_args()
    res = run(a.config, a.precision, a.pairs, a.threads)
    write_run(a.out, res, summary(res), plot, "prefill_layout.png")


if __name__ == "__main__":
    main()
