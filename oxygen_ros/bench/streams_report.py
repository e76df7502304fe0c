"""The report of ``oxygen-bench streams``: ``results.json``, the ``summary.md`` tables and the plots (matplotlib,
PNG, where it is installed): frame-time distribution and trace per engine, per-stream request latency per engine."""

from __future__ import annotations

from pathlib import Path

from oxygen_ros.bench.report import COLORS, save_figure, subplots, write_run

# k=auto without --deadline-ms: the deadline is factor x the no-language frame time, measured ...
DEADLINE_MODES = {
    "warmup": "on calibration frames, then on them and every engine's warm-up frames; fixed while measuring",
    "calibration": "on the calibration frames before the run; fixed",
    "tracking": "before each frame, on oxygen's last frames (it follows the host's load)",
}


def _title(res: dict) -> str:
    cfg, m = res.get("config", {}), res.get("machine", {})
    return (f"{cfg.get('model', '?')}/{cfg.get('preset', '?')} on {m.get('device', '?')} "
            f"(torch threads: {m.get('threads', '?')})")


def plot_frame_times(res: dict, path: Path) -> Path:
    """Left: each engine's measured frame times (box, every frame as a dot, stalls as red crosses) with the
    no-language frame and oxygen's deadline; right: frame time against the measured frame index."""
    engines = res["engines"]
    names = list(engines)
    base = res["no_language_frame_ms"]["median"]
    deadline = res["oxygen"].get("deadline_ms")
    fig, (ax, ax2) = subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [1, 1.6]})
    data = [engines[n]["frame_ms_all"] for n in names]
    ax.boxplot(data, showfliers=False, widths=0.5)
    ax.set_xticks(range(1, len(names) + 1), names)
    for i, n in enumerate(names, start=1):
        s = engines[n]
        stall_at = s["frame_ms_median"] * 5
        xs = [i + 0.18 * ((j % 7) / 6 - 0.5) for j in range(len(s["frame_ms_all"]))]
        calm = [(x, t) for x, t in zip(xs, s["frame_ms_all"], strict=True) if t <= stall_at]
        ax.scatter([x for x, _ in calm], [t for _, t in calm], s=9, alpha=0.6, color=COLORS.get(n, "tab:blue"))
        stalls = [(x, t) for x, t in zip(xs, s["frame_ms_all"], strict=True) if t > stall_at]
        if stalls:
            ax.scatter([x for x, _ in stalls], [t for _, t in stalls], marker="x", color="red",
                       label="host stall (> 5x median)")
        ax.hlines(s["frame_ms_p99_without_stalls"], i - 0.3, i + 0.3, colors="k", linestyles=":")
    ax.axhline(base, color="tab:blue", ls="--", lw=1, label=f"no-language frame {base:.0f} ms")
    if deadline:
        ax.axhline(deadline, color="tab:red", ls="--", lw=1, label=f"oxygen deadline (median) {deadline:.0f} ms")
    ax.set_ylabel("frame ms")
    ax.set_ylim(0, 1.3 * max(max(d) for d in data))  # headroom for the legend
    ax.set_title("frame time per engine (dotted: p99 without stalls)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    for n in names:
        ax2.plot(engines[n]["frame_ms_all"], ".-", lw=0.8, ms=4, label=n, color=COLORS.get(n))
    ax2.axhline(base, color="tab:blue", ls="--", lw=1)
    per_frame = engines.get("oxygen", {}).get("deadline_ms_all")
    if per_frame:
        ax2.step(range(len(per_frame)), per_frame, where="mid", color="tab:red", ls="--", lw=1,
                 label="oxygen deadline")
    elif deadline:
        ax2.axhline(deadline, color="tab:red", ls="--", lw=1)
    ax2.set_xlabel("measured frame")
    ax2.set_ylabel("frame ms")
    ax2.set_ylim(bottom=0)
    ax2.set_title("frame time over the run (frames interleaved across engines)", fontsize=10)
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3)
    fig.suptitle(f"Multi-stream workload: {_title(res)}", fontsize=11)
    return save_figure(fig, path)


def plot_stream_latency(res: dict, path: Path) -> Path:
    """Per stream, bars per engine: median latency (p99 as the whisker's top), in frames and in seconds."""
    engines = res["engines"]
    names = list(engines)
    streams = [s["name"] for s in res["workload"]["streams"]]
    fig, axes = subplots(1, 2, figsize=(11, 4))
    width = 0.8 / max(len(names), 1)
    for ax, unit, label in ((axes[0], "frames", "latency (frames spanned)"), (axes[1], "s", "latency (s)")):
        for j, n in enumerate(names):
            st = engines[n]["streams"]
            p50 = [st[s].get(f"latency_{unit}_p50", 0.0) for s in streams]
            p99 = [st[s].get(f"latency_{unit}_p99", 0.0) for s in streams]
            xs = [i + (j - (len(names) - 1) / 2) * width for i in range(len(streams))]
            ax.bar(xs, p50, width, color=COLORS.get(n), label=n)
            ax.errorbar(xs, p50, yerr=[[0] * len(p50), [b - a for a, b in zip(p50, p99, strict=True)]],
                        fmt="none", ecolor="k", capsize=3, lw=1)
        ax.set_xticks(range(len(streams)), streams)
        ax.set_ylabel(label)
        ax.set_title(f"per-stream {label}: bar p50, whisker p99", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Request latency per stream: {_title(res)}", fontsize=11)
    return save_figure(fig, path)


def plot_streams(res: dict, out: Path) -> list[Path]:
    """``frame_times.png`` and ``stream_latency.png`` in ``out``."""
    return [plot_frame_times(res, out / "frame_times.png"), plot_stream_latency(res, out / "stream_latency.png")]


def markdown(res: dict) -> str:
    """The summary tables: one row per engine, then per-stream latency, then the targets."""
    eng = res["engines"]
    wl, oxy = res["workload"], res["oxygen"]
    nl = res["no_language_frame_ms"]
    head = (f"{wl['frames']} measured frames per engine after {wl['warmup']} warm-up, interleaved; no-language frame "
            f"{nl['median']:.0f} ms at calibration ({nl['median_with_warmup']:.0f} ms with the warm-up frames).")
    if oxy.get("deadline"):
        mode = oxy["deadline"]
        head += f" oxygen: k=auto, deadline {oxy['deadline_ms_first']:.0f} ms first"
        if mode == "absolute":
            head += " (given)"
        else:
            head += f", {oxy['deadline_factor']}x the no-language frame measured {DEADLINE_MODES[mode]}"
        if "oxygen" in eng:
            o = eng["oxygen"]
            head += (f"; median deadline {o['deadline_ms']:.0f} ms, {o['deadline_misses']} misses, worst overrun "
                     f"{o['deadline_overrun_ms_max']:.0f} ms, frame / deadline median "
                     f"{o['frame_over_deadline_median']:.2f} p99 {o['frame_over_deadline_p99']:.2f}.")
    head += " Host drift (p99 / median of prefill + denoise, the same work in every frame): " + ", ".join(
        f"{n} {e['action_part_p99_over_median']:.2f}" for n, e in eng.items()) + "."
    lines = [head, "", "| engine | k | action Hz (mean) | action Hz (median) | frame ms median | p99 | p99/median "
             "| stalls | deadline misses | tokens/s | x isolated Hz (mean / median) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    ratios = res["ratios"]
    for name, s in eng.items():
        key = f"{name}_over_isolated_action_hz"
        x = (f"{ratios[key]:.2f}x / {ratios[key + '_median']:.2f}x" if key in ratios
             else ("1.00x" if name == "isolated" else "-"))
        k = f"{s['k']} ({s['deadline_ms']:.0f} ms)" if s["deadline_ms"] else (s["k"] if s["k"] is not None else "-")
        misses = s["deadline_misses"] if s["deadline_misses"] is not None else "-"
        lines.append(f"| {name} | {k} | {s['action_hz']:.2f} | {s['action_hz_median']:.2f} | "
                     f"{s['frame_ms_median']:.0f} | {s['frame_ms_p99_without_stalls']:.0f} | "
                     f"{s['p99_over_median']:.2f} | {s['host_stalls']} | {misses} | {s['tokens_per_s']:.1f} | {x} |")
    lines += ["", "| engine | stream | requests | latency frames p50 / p99 | latency s p50 / p99 |",
              "|---|---|---|---|---|"]
    for name, s in eng.items():
        for stream, st in s["streams"].items():
            if not st["finished"]:
                lines.append(f"| {name} | {stream} | 0 / {st['submitted']} | - | - |")
                continue
            lines.append(f"| {name} | {stream} | {st['finished']} / {st['submitted']} | "
                         f"{st['latency_frames_p50']:g} / {st['latency_frames_p99']:g} | "
                         f"{st['latency_s_p50']:.2f} / {st['latency_s_p99']:.2f} |")
    texts = res["texts_vs_isolated"]
    if texts:
        lines += ["", "Texts vs isolated: " + ", ".join(
            f"{n} {'identical' if t['identical'] else 'DIFFERENT'} ({t['compared']} requests, {t['differ']} differ, "
            f"{t['missing']} missing)" for n, t in texts.items())]
    if res["targets"]:
        lines += ["", "| target | value | threshold | result |", "|---|---|---|---|"]
        for t in res["targets"]:
            lines.append(f"| {t['name']} | {t['value']:.2f} | {t['op']} {t['threshold']} | "
                         f"{'PASS' if t['pass'] else 'FAIL'} |")
    return "\n".join(lines)


def write_results(res: dict, out: Path) -> str:
    """``out/results.json``, ``out/summary.md`` and the plots (where matplotlib is installed); returns the tables."""
    return write_run(out, res, markdown(res), plot_streams, echo=False)
