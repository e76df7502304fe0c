"""Running a sweep plan: every unfinished point measured (or copied from another suite), then the summary.

Points are grouped by model so each (preset, compile mode) model is built once; every record is appended to
``points.jsonl`` as soon as it is measured, so a killed run resumes where it stopped.
"""

from __future__ import annotations

import os
import sys
import time

import torch

from oxygen_ros.bench.cost_model import normalized_profile
from oxygen_ros.bench.measure import measure, units
from oxygen_ros.bench.model_pool import ModelPool
from oxygen_ros.bench.models import dtype_name
from oxygen_ros.bench.points import Point, PointStore, shared_record
from oxygen_ros.bench.progress import progress_bar
from oxygen_ros.bench.runner import machine_info
from oxygen_ros.bench.sweep_report import summarize


def sweep_machine(device: torch.device) -> dict:
    """runner.machine_info plus the Python version and the CPU count."""
    return {**machine_info(device), "python": sys.version.split()[0], "cpu_count": os.cpu_count()}


def profile_for(p: Point, plan: list[Point], store: PointStore) -> dict | None:
    """The measured stage profile of ``p``'s model (preset, compile mode), if the plan has run it."""
    for q in plan:
        if q.engine == "profile" and (q.preset, q.compile) == (p.preset, p.compile) and q.id in store:
            return normalized_profile(store.records[q.id]["profile"])
    return None


def run_plan(plan: list[Point], store: PointStore, pool: ModelPool, machine: dict) -> None:
    """Measure every unfinished point, grouped so each model is built once; records are appended as they finish."""
    pending = sorted((p for p in plan if p.id not in store), key=lambda p: p.model_key)
    print(f"{len(plan)} points: {len(plan) - len(pending)} done, {len(pending)} to run")
    with progress_bar(total=sum(units(p) for p in pending), desc="sweep", unit="frame") as bar:
        for p in pending:
            bar.set_postfix_str(p.label)
            measured = store.measured(p.key)
            if measured is not None:
                store.append(shared_record(p, measured))
                bar.update(units(p))
                continue
            profile = profile_for(p, plan, store)
            t0 = time.perf_counter()
            rec = measure(p, pool, profile, lambda: bar.update(1))
            store.append({"id": p.id, "suite": p.suite, "key": p.key, "params": p.params(), **rec,
                          "machine": machine, "model": pool.info, "created": time.strftime("%Y-%m-%d %H:%M:%S"),
                          "elapsed_s": round(time.perf_counter() - t0, 3)})
    pool.release()


def run_sweep(plan: list[Point], store: PointStore, device: torch.device, dtype: torch.dtype, *, mode: str,
              config: str, compile_modes: list[str], command: list[str], compile_backend: str = "inductor") -> dict:
    """Run ``plan`` into ``store``; returns the summary of its records, headed by what was run where."""
    machine = sweep_machine(device)
    run_plan(plan, store, ModelPool(device, dtype, compile_backend), machine)
    meta = {"created": time.strftime("%Y-%m-%d %H:%M:%S"), "command": command, "mode": mode, "machine": machine,
            "context": {"config": config, "device": device.type, "dtype": dtype_name(dtype),
                        "compile": compile_modes, "suites": list(dict.fromkeys(p.suite for p in plan))}}
    return summarize([store.records[p.id] for p in plan], meta)
