"""The benchmarks' figures (matplotlib, Agg, PNG): oxygen-bench's and the sweep's, one per suite and compile mode.

Importing this module needs matplotlib; the sweep catches the ImportError and writes its JSON without plots.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from oxygen_ros.bench.report import COLORS, save_figure  # noqa: E402
from oxygen_ros.bench.sweep_report import row  # noqa: E402

STAGE_COLORS = {"prefill_ms": "tab:blue", "language_prefill_ms": "tab:cyan", "denoise_ms": "tab:red",
                "decode_ms": "tab:green", "manager_ms": "black"}


def _name(r: dict) -> str:
    return f"{r['engine']} k={r['k']}" if r["engine"] == "oxygen" else r["engine"]


def plot_bench(result: dict, out: Path) -> list[Path]:
    """oxygen-bench's figures: the stage breakdown per engine and the action-frequency / token-throughput trade-off."""
    points = result["points"]
    cfg = result["config"]
    title = f"{cfg['model']}/{cfg['preset']} on {result['machine']['device']} ({cfg['dtype']})"
    fig, ax = plt.subplots(figsize=(8, 4.5))
    labels = [f"{_name(p)}\nN={p['N']}" for p in points]
    bottom = [0.0] * len(points)
    for stage, color in STAGE_COLORS.items():
        vals = [p["stage_ms"].get(stage.removesuffix("_ms"), 0.0) for p in points]
        ax.bar(labels, vals, bottom=bottom, label=stage.removesuffix("_ms"), color=color)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.scatter(labels, [p["frame_ms_mean"] for p in points], marker="_", s=400, color="k", label="frame time")
    ax.set(ylabel="ms per frame", title=f"Per-frame stage time: {title}")
    ax.legend(fontsize=8)
    paths = [save_figure(fig, out / "frame_breakdown.png")]
    fig, ax = plt.subplots(figsize=(6, 4.5))
    _lines(ax, points, "tokens_per_s", "action_hz", sort="N")
    for q in points:
        ax.annotate(f"N={q['N']}", (q["tokens_per_s"], q["action_hz"]), fontsize=7)
    ax.set(xlabel="language throughput (tokens/s)", ylabel="action frequency (Hz)")
    ax.set_title(f"Action frequency vs language throughput\n{title}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return [*paths, save_figure(fig, out / "tradeoff.png")]


def _lines(ax, rows: list[dict], x: str, y: str, sort: str | None = None) -> None:
    """One line per engine (and k), over ``x`` (in the order of ``sort``, default ``x``)."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(_name(r), []).append(r)
    for name, rs in groups.items():
        rs = sorted(rs, key=lambda r: r[sort or x])
        ax.plot([r[x] for r in rs], [r[y] for r in rs], "o-", label=name, color=COLORS.get(rs[0]["engine"]),
                alpha=1.0 if rs[0]["engine"] != "oxygen" or rs[0]["k"] == 5 else 0.6)


def plot_headline(rows: list[dict], title: str, path: Path) -> Path:
    """Action Hz and tokens/s of the headline points, speedup vs isolated annotated."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    labels = [f"{_name(r)}\nN={r['N']}" + (f"\n{r['compile']}" if r["compile"] != "off" else "") for r in rows]
    for ax, key, unit in ((axes[0], "action_hz", "action frequency (Hz)"), (axes[1], "tokens_per_s", "tokens/s")):
        bars = ax.bar(labels, [r[key] for r in rows], color=[COLORS.get(r["engine"], "tab:blue") for r in rows])
        for bar, r in zip(bars, rows, strict=True):
            ratio = r["speedup"] if key == "action_hz" else r["token_x"]
            if ratio:
                ax.annotate(f"{ratio:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                            va="bottom", fontsize=8)
        ax.set_ylabel(unit)
        ax.tick_params(axis="x", labelsize=7)
    fig.suptitle(f"Headline points (ratios vs isolated at the same N): {title}", fontsize=10)
    return save_figure(fig, path)


def plot_speedup(maps: dict, axis: str, title: str, path: Path) -> Path:
    """Fig 5 / Fig 10: speedup heatmaps, one subplot per preset (rows S, columns k or N)."""
    presets = list(maps)
    values = [v for grid in maps.values() for line in grid.values() for v in line.values()]
    fig, axes = plt.subplots(1, len(presets), figsize=(3.4 * len(presets) + 1, 3.4), squeeze=False,
                             layout="constrained")
    for ax, preset in zip(axes[0], presets, strict=True):
        grid = maps[preset]
        ss = sorted(grid, key=int)
        cols = sorted({c for v in grid.values() for c in v}, key=int)
        vals = [[grid[s].get(c, float("nan")) for c in cols] for s in ss]
        im = ax.imshow(vals, cmap="YlGn", origin="lower", aspect="auto", vmin=min(values), vmax=max(values))
        for i, line in enumerate(vals):
            for j, v in enumerate(line):
                ax.text(j, i, f"{v:.2f}x", ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(cols)), cols)
        ax.set_yticks(range(len(ss)), ss)
        ax.set_xlabel(f"{axis} ({'N=30' if axis == 'k' else 'k=5'})")
        ax.set_ylabel("denoise steps S")
        ax.set_title(preset)
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8)
    fig.suptitle(f"Action-frequency speedup of oxygen over isolated: {title}", fontsize=10)
    return save_figure(fig, path, tight=False)  # constrained layout places the shared colour bar


def _line_plot(rows: list[dict], x: str, y: str, labels: tuple[str, str, str], path: Path,
               oracle: float | None = None) -> Path:
    """:func:`_lines` of ``rows`` on one axis; ``labels``: x label, y label, title; ``oracle``: a dash-dotted
    no-language line."""
    fig, ax = plt.subplots(figsize=(6, 4.2))
    _lines(ax, rows, x, y)
    if oracle is not None:
        ax.axhline(oracle, ls="-.", color="k", label="no language (oracle)")
    ax.set_xlabel(labels[0])
    ax.set_ylabel(labels[1])
    ax.set_title(labels[2], fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_ablation(rows: list[dict], title: str, path: Path) -> Path:
    """Fig 6: action Hz across N for isolated / shared_kv / oxygen k=5, the no-language oracle dash-dotted."""
    oracle = [r for r in rows if r["N"] == 0]
    return _line_plot([r for r in rows if r["N"] > 0], "N", "action_hz",
                      ("tokens per request N", "action frequency (Hz)", f"Ablation (k=5): {title}"), path,
                      oracle[0]["action_hz"] if oracle else None)


def plot_arrivals(rows: list[dict], title: str, path: Path) -> Path:
    """Fig 7: action Hz and mean batch per arrival pattern; dashed: isolated, one 30-token request per frame."""
    base = [r for r in rows if r["engine"] == "isolated"]
    rs = [r for r in rows if r["engine"] == "oxygen"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    labels = [r["workload"] for r in rs]
    axes[0].bar(labels, [r["action_hz"] for r in rs], color=COLORS["oxygen"])
    if base:
        axes[0].axhline(base[0]["action_hz"], ls="--", color=COLORS["isolated"], label="isolated, every frame")
        axes[0].legend(fontsize=8, loc="lower right")
    axes[0].set_ylabel("action frequency (Hz)")
    axes[1].bar(labels, [r["batch_mean"] for r in rs], color="tab:olive")
    axes[1].set_ylabel("mean decode batch")
    for ax in axes:
        ax.tick_params(axis="x", labelsize=7, rotation=30)
    fig.suptitle(f"Arrival patterns (oxygen k=5): {title}", fontsize=10)
    return save_figure(fig, path)


def plot_overhead(rows: list[dict], title: str, path: Path) -> Path:
    """Table 7: cache-manager share of the frame by decode batch size."""
    rs = sorted(rows, key=lambda r: r["batch_mean"])
    fig, ax = plt.subplots(figsize=(6, 4.2))
    ax.bar([f"k={r['k']}\nB={r['batch_mean']:.1f}" for r in rs], [r["manager_pct"] for r in rs],
           color=COLORS["oxygen"])
    ax.axhline(1.0, ls="--", color="tab:red", label="1% target")
    ax.set_ylabel("manager share of frame time (%)")
    ax.set_title(f"KV-manager overhead (N=30): {title}", fontsize=10)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_memory(rows: list[dict], title: str, path: Path) -> Path:
    """Table 3: engine memory (parameters + KV pool) and, on CUDA, the allocator's peak per engine."""
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    labels = [_name(r) for r in rows]
    x = range(len(rows))
    cuda = any(r["cuda_peak_gib"] for r in rows)
    w = 0.4 if cuda else 0.8
    ax.bar([i - (w / 2 if cuda else 0) for i in x], [r["memory_gib"] for r in rows], w, label="weights + KV pool")
    if cuda:
        ax.bar([i + w / 2 for i in x], [r["cuda_peak_gib"] or 0 for r in rows], w, label="CUDA peak allocated")
    ax.set_xticks(list(x), labels)
    ax.set_ylabel("GiB")
    ax.set_title(f"Memory per engine (N=30): {title}", fontsize=10)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def plot_stages(rows: list[dict], profile: dict | None, title: str, path: Path) -> Path:
    """Table 6: per-stage time per frame of shared_kv and isolated across N; the decode step cost by batch."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [2, 1]})
    rs = sorted(rows, key=lambda r: (r["N"], r["engine"]))
    labels = [f"{r['engine']}\nN={r['N']}" for r in rs]
    bottom = [0.0] * len(rs)
    for stage, color in STAGE_COLORS.items():
        vals = [r.get(stage) or 0.0 for r in rs]
        axes[0].bar(labels, vals, bottom=bottom, color=color, label=stage.removesuffix("_ms"))
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    axes[0].set_ylabel("ms per frame")
    axes[0].tick_params(axis="x", labelsize=7)
    axes[0].legend(fontsize=7)
    if profile:
        steps = sorted((int(b), 1e3 * t) for b, t in profile["decode_step_s"].items())
        axes[1].plot([b for b, _ in steps], [t for _, t in steps], "o-")
        axes[1].set_title(f"prefill {1e3 * profile['prefill_s']:.1f} ms, denoise {1e3 * profile['denoise_s']:.1f} ms",
                          fontsize=8)
    axes[1].set_xlabel("decode batch")
    axes[1].set_ylabel("ms per decode step")
    fig.suptitle(f"Stage breakdown: {title}", fontsize=10)
    return save_figure(fig, path)


def plot_auto(records: list[dict], title: str, path: Path) -> Path:
    """k=auto vs fixed k under bursts: frame time against the deadline, and the backlog, frame by frame."""
    fig, axes = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    deadline = None
    for r in records:
        tr, k = r["trace"], r["params"]["k"]
        style = {"lw": 2.0} if k == "auto" else {"lw": 1.0, "alpha": 0.7}
        axes[0].plot(tr["frame_ms"], label=f"k={k}", **style)
        axes[1].plot(tr["backlog"], label=f"k={k}", **style)
        deadline = r.get("deadline_ms") or deadline
    if deadline:
        axes[0].axhline(deadline, ls="--", color="tab:red", label="deadline")
    axes[0].set_ylabel("frame time (ms)")
    axes[1].set_ylabel("requests in flight")
    axes[1].set_xlabel("frame (warm-up included)")
    axes[0].legend(fontsize=8, ncol=3)
    axes[0].set_title(f"k=auto vs fixed k, bursty arrivals: {title}", fontsize=10)
    return save_figure(fig, path)


def plot_heads(rows: list[dict], title: str, path: Path) -> Path:
    """More action experts reading one prefix: speedup over isolated at each E."""
    return _line_plot([r for r in rows if r["engine"] == "oxygen"], "E", "speedup",
                      ("action experts E (the paper counts the language expert too: E + 1)",
                       "speedup over isolated (N=30)", f"Multiple action experts: {title}"), path)


ROW_PLOTS: dict[str, Callable[[list[dict], str, Path], Path]] = {
    "headline": plot_headline, "ablation": plot_ablation, "arrivals": plot_arrivals, "overhead": plot_overhead,
    "memory": plot_memory, "heads": plot_heads}


def plot_mode(summary: dict, mode: str, out: Path, with_bench: bool) -> list[Path]:
    """The plots of one compile mode (file suffix ``_<mode>`` unless off)."""
    m, c = summary["machine"], summary["context"]
    records = [r for r in summary["points"] if "profile" not in r and r["params"]["compile"] == mode]
    rows = [row(r) for r in records]
    title = f"{c['config']} {c['dtype']} on {m.get('gpu') or m['device']}" + (
        f", compile {mode}" if mode != "off" else "")
    suffix = "" if mode == "off" else f"_{mode}"
    paths = []
    for suite, plot in ROW_PLOTS.items():
        rs = [r for r in rows if r["suite"] == suite]
        if rs:
            paths.append(plot(rs, title, out / f"{suite}{suffix}.png"))
    stages = [r for r in rows if r["suite"] == "stages"]
    if stages:
        profile = summary["profiles"].get(f"libero/{mode}")
        paths.append(plot_stages(stages, profile, title, out / f"stages{suffix}.png"))
    auto = [r for r in records if r["suite"] == "auto" and r.get("trace")]
    if auto:
        paths.append(plot_auto(auto, title, out / f"auto{suffix}.png"))
    for axis, name in (("k", "speedup"), ("N", "speedup_N")):
        maps = summary["heatmaps"].get(axis, {}).get(mode)
        if maps and any(len(line) > 1 for grid in maps.values() for line in grid.values()):
            paths.append(plot_speedup(maps, axis, title, out / f"{name}{suffix}.png"))
    tradeoff = [r for r in records if r["suite"] == "tradeoff"]
    if tradeoff and with_bench:  # oxygen-bench's plots: tradeoff.png and frame_breakdown.png
        result = {"points": tradeoff, "machine": m,
                  "config": {"model": c["config"], "preset": "libero", "dtype": c["dtype"]}}
        paths += plot_bench(result, out)
    return paths


def plot_all(summary: dict, out: Path) -> list[Path]:
    """Every suite's plot for every compile mode; returns the PNG paths."""
    modes = list(dict.fromkeys(r["params"]["compile"] for r in summary["points"] if "profile" not in r))
    return [path for mode in modes for path in plot_mode(summary, mode, out, with_bench=mode == modes[0])]


def main(argv: list[str] | None = None) -> None:
    """``python -m oxygen_ros.bench.plots OUT``: (re)draw the sweep plots of ``OUT/summary.json``, e.g. on a
    workstation for a summary written on a GPU machine without matplotlib."""
    import json
    import sys

    for out in map(Path, argv if argv is not None else sys.argv[1:]):
        paths = plot_all(json.loads((out / "summary.json").read_text()), out)
        print(f"{out}: {len(paths)} plots: {', '.join(p.name for p in paths)}")


if __name__ == "__main__":
    main()
