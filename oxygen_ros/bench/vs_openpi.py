"""oxygen_ros against openpi's own PyTorch pi0.5, side by side: same weights, same inputs, one process, shuffled calls.

``run`` executes in openpi's side environment (never in the test suite), with this repository on ``PYTHONPATH``:

    mkdir -p /tmp/vs_openpi && cd /tmp/vs_openpi     # empty cwd (openpi probes ./assets)
    PYTHONPATH=/work/sidenv/openpi_src/src:$REPO /work/sidenv/openpi_venv/bin/python -m oxygen_ros.bench.vs_openpi \
        run --config small --threads 1 --out $REPO/runs/vs_openpi/small_t1.json

It writes a random ``config``-sized pi0.5 in openpi's checkpoint layout (our ``save_checkpoint``), loads it in
openpi's ``PI0Pytorch`` (``safetensors.torch.load_model``, strict, as ``create_trained_policy`` does) and in
oxygen_ros (``load_checkpoint``), checks that every variant's actions agree with openpi eager, then times the
action path (prefill + denoise, batch 1) of every variant in rounds of shuffled order. ``plot`` (the project's venv,
which has matplotlib) turns the JSON files into one PNG and a markdown table.

``--precision``:

- ``float32``: openpi in fp32 (patch P2) against our fp32 engine.
- ``bfloat16``: what ``create_trained_policy`` gives an openpi user: its mixed bf16
  (``to_bfloat16_for_selected_params("bfloat16")`` after the strict load), eager and ``max-autotune`` compiled,
  against the node's default for an openpi checkpoint, ``bfloat16_islands`` (``dtype: auto``), whose fused prefill
  keeps openpi's padded layout; ``@compact`` variants run the compacting layout instead.

``--setup``: ``masked`` (3 camera slots, the third masked as openpi does for LIBERO and DROID) or ``unmasked``
(all 3 valid). The prompt is padded to ``max_token_len`` in both.

openpi runs with the patches of ``test/fixtures/openpi/make_openpi_fixtures.py`` that apply to a bare model (P0
lerobot stub, P1 sizes, P2 fp32 under ``--precision float32`` only), plus one more: its observation preprocessing is
told the image size of the checkpoint (``image_resolution``), instead of resizing every image to 224.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import torch

OPENPI_SLOTS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")


# ------------------------------------------------------------------------------------------------------ openpi side
def _stub_lerobot() -> None:
    """P0: openpi.training imports LeRobot's dataset module at import time; inference never uses it."""
    for name in ("lerobot", "lerobot.common", "lerobot.common.datasets", "lerobot.common.datasets.lerobot_dataset"):
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = []
            sys.modules[name] = module


def build_openpi(cfg, compile_mode: str | None, precision: str = "float32"):
    """openpi's PI0Pytorch at ``cfg``'s sizes (oxygen_ros Pi05Config) in ``precision`` (``float32``: patch P2;
    ``bfloat16``: openpi's own mixed bf16, as its constructor applies it), optionally ``torch.compile``d."""
    _stub_lerobot()
    import openpi.models.gemma as gemma
    import openpi.models.pi0_config as pi0_config
    import openpi.models_pytorch.gemma_pytorch as gemma_pytorch
    import openpi.models_pytorch.pi0_pytorch as pi0_pytorch
    import openpi.models_pytorch.preprocessing_pytorch as preprocessing

    b, e, v = cfg.backbone, cfg.expert, cfg.vision
    sizes = {
        "gemma_2b": dict(width=b.width, depth=b.depth, mlp_dim=b.mlp_dim, num_heads=b.num_heads,
                         num_kv_heads=b.num_kv_heads, head_dim=b.head_dim),
        "gemma_300m": dict(width=e.width, depth=e.depth, mlp_dim=e.mlp_dim, num_heads=e.num_heads,
                           num_kv_heads=e.num_kv_heads, head_dim=e.head_dim),
    }
    proxy = types.ModuleType("openpi.models.gemma (sized)")
    proxy.__getattr__ = lambda name: getattr(gemma, name)
    proxy.get_config = lambda variant: (gemma.get_config(variant), gemma.Config(**sizes[variant]))[1]
    pi0_pytorch._gemma = proxy  # P1

    orig_pali = getattr(gemma_pytorch, "_orig_pali", gemma_pytorch.PaliGemmaForConditionalGeneration)
    orig_lm = getattr(gemma_pytorch, "_orig_lm", gemma_pytorch.GemmaForCausalLM)
    gemma_pytorch._orig_pali, gemma_pytorch._orig_lm = orig_pali, orig_lm

    def paligemma(config):
        vc = config.vision_config
        for k, val in dict(hidden_size=v.width, num_hidden_layers=v.depth, num_attention_heads=v.num_heads,
                           intermediate_size=v.mlp_dim, patch_size=v.patch_size, image_size=v.image_size,
                           layer_norm_eps=v.layer_norm_eps).items():
            setattr(vc, k, val)
        vc.projection_dim = config.projection_dim = config.text_config.hidden_size
        config.text_config.vocab_size = config._vocab_size = cfg.vocab_size  # noqa: SLF001
        config.text_config.num_image_tokens = (v.image_size // v.patch_size) ** 2
        return orig_pali(config=config)

    def gemma_lm(config):
        config.vocab_size = cfg.vocab_size
        return orig_lm(config=config)

    gemma_pytorch.PaliGemmaForConditionalGeneration = paligemma
    gemma_pytorch.GemmaForCausalLM = gemma_lm
    expert_model = gemma_pytorch.PaliGemmaWithExpertModel
    orig_prec = getattr(gemma_pytorch, "_orig_prec", expert_model.to_bfloat16_for_selected_params)
    gemma_pytorch._orig_prec = orig_prec
    forced = precision  # P2 under float32; bfloat16 is openpi's own (Pi0Config.dtype and create_trained_policy)
    expert_model.to_bfloat16_for_selected_params = lambda self, precision="bfloat16": orig_prec(self, forced)
    # the checkpoint's image size, not 224 (openpi would resize our 84x84 images)
    pi0_pytorch._preprocessing = types.SimpleNamespace(preprocess_observation_pytorch=functools.partial(
        preprocessing.preprocess_observation_pytorch, image_resolution=(v.image_size, v.image_size)))

    config = pi0_config.Pi0Config(pi05=True, action_dim=cfg.action_dim, action_horizon=cfg.action_horizon,
                                  max_token_len=cfg.max_token_len, pytorch_compile_mode=compile_mode)
    return pi0_pytorch.PI0Pytorch(config)


def openpi_observation(obs, cfg):
    """Our preprocessed observation as openpi's model input (images [B, 3, H, W] in [-1, 1], one per slot)."""
    images = {s: obs.images[:, i].contiguous() for i, s in enumerate(OPENPI_SLOTS)}
    masks = {s: obs.image_masks[:, i] for i, s in enumerate(OPENPI_SLOTS)}
    return types.SimpleNamespace(images=images, image_masks=masks, state=torch.zeros(1, 32),
                                 tokenized_prompt=obs.tokens, tokenized_prompt_mask=obs.token_mask,
                                 token_ar_mask=None, token_loss_mask=None)


# ------------------------------------------------------------------------------------------------------ our side
SETUPS = {"masked": [[True, True, False]], "unmasked": [[True, True, True]]}  # --setup -> image_masks


def make_inputs(cfg, seed: int = 0, setup: str = "masked"):
    """One observation (3 cameras; ``masked``: the last masked out as openpi does for LIBERO) and its noise."""
    from oxygen_ros.engine.observation import Observation

    g = torch.Generator().manual_seed(seed)
    size = cfg.vision.image_size
    n_tokens = cfg.max_token_len // 2
    tokens = torch.zeros(1, cfg.max_token_len, dtype=torch.long)
    tokens[0, :n_tokens] = torch.randint(3, cfg.vocab_size, (n_tokens,), generator=g)
    tokens[0, 0] = 2
    obs = Observation(images=torch.rand(1, 3, 3, size, size, generator=g) * 2 - 1,
                      image_masks=torch.tensor(SETUPS[setup]), tokens=tokens,
                      token_mask=torch.arange(cfg.max_token_len)[None] < n_tokens)
    noise = torch.randn(1, cfg.action_horizon, cfg.action_dim, generator=g)
    return obs, noise


def parse_variant(variant: str) -> tuple[str, str, str, bool]:
    """``[step/]GRAPHS[:KERNELS][@LAYOUT]`` -> (graphs, kernels, prefill layout, whole ``Engine.step``)."""
    step = variant.startswith("step/")
    rest, _, layout = variant.removeprefix("step/").partition("@")
    graphs, _, kernels = rest.partition(":")
    return graphs, kernels or "auto", layout or "auto", step


def ours_runner(model, variant: str, stages: dict[str, list[float]] | None = None):
    """The engine's batch-1 action path for ``variant`` = ``[step/]GRAPHS[:KERNELS][@LAYOUT]``: the node's default
    is ``off`` (kernels ``auto``, prefill layout ``auto``: padded under ``bfloat16_islands``); ``off:plain`` is the
    plain fused path, ``off@compact`` the compacting prefill; ``step/off`` times the whole ``Engine.step`` of an
    action-only frame (what the node calls each tick) instead of the runner's prefill + denoise. ``stages``: when
    given, each call appends its prefill and denoise seconds to ``stages["prefill"]`` / ``stages["denoise"]``."""
    from oxygen_ros.engine.engine import EngineConfig, build_engine
    from oxygen_ros.engine.requests import Frame

    graphs, kernels, layout, whole_step = parse_variant(variant)
    # the node's engine build: kernels chosen, compiled steps warmed up, graph stages chosen (a 2-slot pool)
    engine = build_engine(model, EngineConfig(num_steps=10, graphs=graphs, max_new_tokens=8, max_inflight=1,
                                              kernels=kernels, prefill_layout=layout))
    runner = engine.runner
    if runner.kernels is not None:
        print(f"oxygen_{variant}: {runner.kernels.summary()}", flush=True)
    if runner.graphs is not None:
        print(f"oxygen_{variant}: graph stages {runner.graph_stages}", flush=True)

    def step(obs, noise):
        result = engine.step(Frame(obs, [], [noise]))
        if stages is not None:
            stages["prefill"].append(result.timings["prefill"])
            stages["denoise"].append(result.timings["denoise"])
        return result.actions[0]

    def act(obs, noise):
        t0 = time.perf_counter()
        prefix = runner.prefill(runner.prepare(obs), 0)
        t1 = time.perf_counter()
        out = runner.denoise(prefix, noise)[0]
        if stages is not None:
            stages["prefill"].append(t1 - t0)
            stages["denoise"].append(time.perf_counter() - t1)
        return out
    return step if whole_step else act


def add_expert_lm_head(weights: Path, cfg) -> None:
    """openpi's converter stores the action expert's (unused) LM head; its strict load wants it: add a zero one."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(weights))
    tensors["paligemma_with_expert.gemma_expert.lm_head.weight"] = torch.zeros(cfg.vocab_size, cfg.expert.width)
    save_file(tensors, str(weights), metadata={"format": "pt"})


# ------------------------------------------------------------------------------------------------------ measurement
def run(args: argparse.Namespace) -> None:
    from safetensors.torch import load_model

    from oxygen_ros.engine import get_config
    from oxygen_ros.engine.backends.precision import apply_precision
    from oxygen_ros.engine.checkpoint import load_checkpoint
    from oxygen_ros.policy.synthetic import make_random_checkpoint
    from oxygen_ros.util.host import cpu_name

    ours_precision = {"float32": "float32", "bfloat16": "bfloat16_islands"}[args.precision]  # the node's dtype: auto
    tolerance = args.tolerance if args.tolerance is not None else {"float32": 1e-4, "bfloat16": 0.1}[args.precision]

    torch.set_num_threads(args.threads)
    uptime_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    cfg = get_config(args.config, None, camera_names=OPENPI_SLOTS, action_dim=32, action_horizon=10)
    ckpt = Path(tempfile.mkdtemp(prefix="vs_openpi_")) / "ckpt"
    make_random_checkpoint(ckpt, args.config, None, seed=args.seed, std=args.std, camera_names=OPENPI_SLOTS,
                           action_dim=32, action_horizon=10)
    add_expert_lm_head(ckpt / "model.safetensors", cfg)
    obs, noise = make_inputs(cfg, args.seed, args.setup)
    pobs = openpi_observation(obs, cfg)

    variants = {}
    compile_modes = {"openpi_eager": None}
    if args.openpi_compile != "none":
        compile_modes["openpi_compiled"] = args.openpi_compile
    for name, mode in compile_modes.items():
        model = build_openpi(cfg, mode, args.precision)
        load_model(model, str(ckpt / "model.safetensors"))  # strict, as openpi's load_pytorch
        if args.precision == "bfloat16":  # create_trained_policy, after load_pytorch
            model.paligemma_with_expert.to_bfloat16_for_selected_params("bfloat16")
        else:
            model = model.to(torch.float32)
        model = model.eval()
        variants[name] = (lambda m: lambda o, n: m.sample_actions("cpu", o, noise=n, num_steps=10))(model)
    build_s = {}  # our graphs' build (compile: every step compiled in warm_up), before the first call
    stage_times: dict[str, dict[str, list[float]]] = {}
    for variant in args.ours:
        model = apply_precision(load_checkpoint(ckpt), ours_precision)
        t0 = time.perf_counter()
        stage_times[f"oxygen_{variant}"] = {"prefill": [], "denoise": []}
        variants[f"oxygen_{variant}"] = ours_runner(model, variant, stage_times[f"oxygen_{variant}"])
        build_s[f"oxygen_{variant}"] = time.perf_counter() - t0

    outputs, first_call_s = {}, {}
    for name, fn in variants.items():  # first call: includes compiling for the compiled variants
        t0 = time.perf_counter()
        with torch.no_grad():
            out = fn(pobs if name.startswith("openpi") else obs, noise.clone())
        first_call_s[name] = time.perf_counter() - t0
        outputs[name] = out.reshape(cfg.action_horizon, cfg.action_dim).float()
        print(f"{name}: first call {first_call_s[name]:.1f} s", flush=True)
    ref = outputs["openpi_eager"]
    max_abs = {name: float((o - ref).abs().max()) for name, o in outputs.items()}
    print("max |actions - openpi eager|:", max_abs, flush=True)
    if max(max_abs.values()) > tolerance:
        raise SystemExit(f"actions disagree beyond {tolerance}: {max_abs}")

    names = list(variants)
    times: dict[str, list[float]] = {n: [] for n in names}
    with torch.no_grad():
        for _ in range(args.warmup):
            for n in names:
                variants[n](pobs if n.startswith("openpi") else obs, noise.clone())
        shuffle = random.Random(args.seed)
        for _ in range(args.rounds):
            # a fresh order every round: who goes first and who follows whom both vary (with a fixed rotation a
            # variant always ran after the same other one, whose leftovers in caches and allocator it inherited)
            order = shuffle.sample(names, len(names))
            for n in order:
                t0 = time.perf_counter()
                variants[n](pobs if n.startswith("openpi") else obs, noise.clone())
                times[n].append(time.perf_counter() - t0)
    median_ms = {n: 1e3 * statistics.median(t) for n, t in times.items()}
    stage_median_ms = {n: {k: 1e3 * statistics.median(v[-args.rounds:]) for k, v in st.items()}
                       for n, st in stage_times.items()}  # the measured rounds (the last ones)
    ratios = {}
    for base in [n for n in names if n.startswith("openpi")]:
        for n in [n for n in names if n.startswith("oxygen")]:
            per_round = [a / b for a, b in zip(times[base], times[n], strict=True)]
            ratios[f"{base}/{n}"] = statistics.median(per_round)
    record = {
        "config": args.config, "threads": args.threads, "batch": 1, "num_steps": 10, "precision": args.precision,
        "oxygen_precision": ours_precision, "setup": args.setup, "image_masks": SETUPS[args.setup][0],
        "model": {"camera_slots": list(OPENPI_SLOTS), "image_size": cfg.vision.image_size,
                  "max_token_len": cfg.max_token_len, "action_horizon": 10, "action_dim": 32,
                  "params": sum(p.numel() for p in load_checkpoint(ckpt).parameters())},
        "openpi_compile_mode": args.openpi_compile, "rounds": args.rounds, "warmup": args.warmup,
        "max_abs_vs_openpi_eager": max_abs, "tolerance": tolerance,
        "bit_identical_to_openpi_eager": {n: v == 0.0 for n, v in max_abs.items()},
        "actions_abs_max": float(ref.abs().max()),
        "actions_std": float(ref.std()),
        "host": {"processor": platform.processor(), "cpu": cpu_name(), "cpus": os.cpu_count()},
        "first_call_s": first_call_s, "oxygen_build_s": build_s, "median_ms": median_ms,
        "oxygen_stage_median_ms": stage_median_ms,
        "paired_median_ratio_openpi_over_ours": ratios, "times_s": times, "torch": torch.__version__,
        "uptime_before": uptime_before,
        "uptime_after": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1))
    print(json.dumps({k: record[k] for k in ("median_ms", "paired_median_ratio_openpi_over_ours")}, indent=1))


def record_precision(rec: dict) -> str:
    """``float32`` / ``bfloat16`` (records from before ``--precision`` were fp32)."""
    return rec.get("precision", rec.get("dtype", "float32"))


def plot(args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [json.loads(Path(p).read_text()) for p in args.inputs]
    cols = min(3, len(records))
    rows = -(-len(records) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.6 * rows), squeeze=False)
    for ax in axes.flat[len(records):]:
        ax.set_visible(False)
    for ax, rec in zip(axes.flat, records, strict=False):
        names = list(rec["median_ms"])
        ax.barh(names, [rec["median_ms"][n] for n in names],
                color=["tab:gray" if n.startswith("openpi") else "tab:blue" for n in names])
        ax.invert_yaxis()
        ax.set_xlabel("action path, median ms (prefill + 10 denoise steps, batch 1)")
        ax.set_title(f"{rec['config']} {record_precision(rec)}, {rec.get('setup', 'masked')} camera, "
                     f"{rec['threads']} thread(s), openpi compile: {rec['openpi_compile_mode']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    print("wrote", args.png)
    if args.md:
        Path(args.md).write_text(summary_table(records))
        print("wrote", args.md)


def variant_label(name: str) -> str:
    """``oxygen_off`` -> "`graphs: off`, `kernels: auto` (node default)"; ``oxygen_step/off@compact`` -> "whole
    `Engine.step`, `graphs: off`, `kernels: auto`, `prefill_layout: compact`"."""
    graphs, kernels, layout, step = parse_variant(name.removeprefix("oxygen_"))
    label = f"`graphs: {graphs}`, `kernels: {kernels}`" + (f", `prefill_layout: {layout}`" if layout != "auto" else "")
    if step:
        return "whole `Engine.step`, " + label
    return label + (" (node default)" if (graphs, kernels, layout) == ("off", "auto", "auto") else "")


def summary_table(records: list[dict]) -> str:
    """Markdown: per config x precision x setup x threads x our variant, medians (ours split into prefill +
    denoise) and the paired ratios (openpi's time over ours); the largest action difference to openpi eager (0:
    bit-identical)."""
    lines = ["| config | precision | camera | threads | openpi eager ms | openpi compiled ms | oxygen_ros "
             "| ours ms (prefill + denoise) | vs openpi eager | vs openpi compiled | max abs diff |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for rec in records:
        med, ratio = rec["median_ms"], rec["paired_median_ratio_openpi_over_ours"]
        stages = rec.get("oxygen_stage_median_ms", {})
        precision = {"float32": "fp32", "bfloat16": "bf16 (ours: islands)"}[record_precision(rec)]
        for n in [n for n in med if n.startswith("oxygen")]:
            compiled = ratio.get(f"openpi_compiled/{n}")
            split = f" ({stages[n]['prefill']:.1f} + {stages[n]['denoise']:.1f})" if n in stages else ""
            diff = rec["max_abs_vs_openpi_eager"][n]
            lines.append(
                f"| {rec['config']} | {precision} | {rec.get('setup', 'masked')} | {rec['threads']} | "
                f"{med['openpi_eager']:.1f} | {med.get('openpi_compiled', float('nan')):.1f} | {variant_label(n)} | "
                f"{med[n]:.1f}{split} | {ratio[f'openpi_eager/{n}']:.2f}x | "
                f"{'-' if compiled is None else f'**{compiled:.2f}x**'} | "
                f"{'0 (bit-identical)' if diff == 0 else f'{diff:.1e}'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="measure (openpi's side environment)")
    r.add_argument("--config", default="small", choices=("tiny", "small"))
    r.add_argument("--threads", type=int, default=1)
    r.add_argument("--rounds", type=int, default=20)
    r.add_argument("--warmup", type=int, default=2)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--std", type=float, default=0.02, help="init scale of the random weights")
    r.add_argument("--openpi-compile", default="max-autotune",
                   help="openpi's torch.compile mode (its default max-autotune; 'default'; 'none')")
    r.add_argument("--ours", nargs="+", default=["off", "step/off", "off@compact"],
                   help="oxygen_ros variants [step/]GRAPHS[:KERNELS][@LAYOUT] (off = the node's default; off:plain = "
                        "the plain fused path, every matrix product on MKL; off@compact = the compacting prefill; "
                        "step/off = the whole Engine.step of an action-only frame)")
    r.add_argument("--precision", default="float32", choices=("float32", "bfloat16"),
                   help="float32: both sides fp32; bfloat16: openpi's create_trained_policy bf16 against the node's "
                        "default for an openpi checkpoint (bfloat16_islands)")
    r.add_argument("--setup", default="masked", choices=tuple(SETUPS),
                   help="masked: the third camera slot masked out (openpi's LIBERO / DROID); unmasked: all valid")
    r.add_argument("--tolerance", type=float, default=None,
                   help="largest |actions - openpi eager| accepted before timing (default 1e-4 in float32, 0.1 in "
                        "bfloat16: the bf16 rounding of a random model, see docs/precision.md)")
    r.add_argument("--out", required=True)
    q = sub.add_parser("plot", help="PNG from run JSON files (the project's venv)")
    q.add_argument("inputs", nargs="+")
    q.add_argument("--png", required=True)
    q.add_argument("--md", default=None, help="also write a markdown table here")
    args = p.parse_args(argv)
    (run if args.cmd == "run" else plot)(args)


if __name__ == "__main__":
    main()
