"""``oxygen-export-lerobot BAG... (--contract FILE | --preset PARAMS) --out DATASET``: bags -> a LeRobotDataset."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .contract import ContractError, contract_from_preset, load_contract

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="oxygen-export-lerobot", description=__doc__)
    ap.add_argument("bags", nargs="*", help="bags, folders of bags or quoted globs (one episode per bag); A+B: "
                    "two bags of one recording (e.g. a bag and oxygen-evaluate-bag's out_bag of it)")
    ap.add_argument("--contract", help="contract YAML (topics -> features, fps, tolerances)")
    ap.add_argument("--preset", help="a node preset (params file) to generate the contract from")
    ap.add_argument("--fps", type=int, help="with --preset: the frame rate (default: control_rate_hz)")
    ap.add_argument("--out", help="the dataset folder to create")
    ap.add_argument("--print-contract", action="store_true", help="print the contract as YAML and exit")
    ap.add_argument("--no-ray", action="store_true", help="export the bags in this process")
    ap.add_argument("--ray", action="store_true", help="export on Ray (a local Ray unless --ray-address)")
    ap.add_argument("--ray-address", help="a running Ray cluster's address")
    ap.add_argument("--workers", type=int, help="Ray actors (default: one per CPU, at most one per bag)")
    ap.add_argument("--make-demo-bag", metavar="DIR", help="write the export demo bag to DIR and exit")
    a = ap.parse_args(argv)
    if a.make_demo_bag:
        from .demo import make_export_demo_bag

        print(make_export_demo_bag(a.make_demo_bag))
        return 0
    try:
        if bool(a.contract) == bool(a.preset):
            ap.error("give exactly one of --contract and --preset")
        contract = load_contract(a.contract) if a.contract else contract_from_preset(a.preset, fps=a.fps)
    except ContractError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if a.print_contract:
        print(contract.to_yaml(), end="")
        return 0
    if not a.bags or not a.out:
        ap.error("bags and --out are needed")
    from .exporter import export_bags

    use_ray = True if (a.ray or a.ray_address) else (False if a.no_ray else None)
    try:
        report = export_bags(a.bags, contract, Path(a.out), use_ray=use_ray, workers=a.workers,
                             ray_address=a.ray_address)
    except (FileNotFoundError, FileExistsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for b in report["bags"]:
        frames = sum(e["frames"] for e in b["episodes"])
        extra = f": {b['reason']}" if b["status"] != "ok" else ""
        print(f"{b['status']:6s} {b['bag']} ({len(b['episodes'])} episodes, {frames} frames){extra}")
        for f in b["failed_episodes"]:
            print(f"  episode {f['episode']} failed: {f['reason']}")
    print(json.dumps({k: report.get(k) for k in ("written", "episodes", "frames", "codec", "wall_s")}))
    return 1 if report["failed"] else 0
