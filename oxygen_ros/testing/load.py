"""A busy host on demand: CPU-bound hog processes beside a test, and a load check that runs a pytest selection
several times in a row beside them.

``python -m oxygen_ros.testing.load --hogs 2 --rounds 3 -- test/test_safety.py`` starts 2 hogs (each a Python
busy loop on one core, bounded in time even if this process dies, killed at exit), runs the selection 3 times and
prints one line per round (pass/fail, exit status, wall time, the pytest summary) and a final verdict. Exit 0 when
every round passed. With ``--command`` the arguments are a command instead (``--rounds 1 --command -- .ci/run``: CI
beside the hogs). Needs nothing but the standard library.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RoundResult", "cpu_hogs", "load_check", "main"]

# a busy loop that ends at its own deadline (max_s) or as soon as its parent is gone (reparented), whichever is
# first; ordinary load at normal priority even where its parent runs real-time (a child inherits the policy)
_HOG = ("import os, time\nif hasattr(os, 'sched_setscheduler'):\n"
        "    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))\n"
        "parent = os.getppid()\nend = time.monotonic() + {max_s}\n"
        "while time.monotonic() < end and os.getppid() == parent:\n    pass\n")


@contextlib.contextmanager
def cpu_hogs(n: int, max_s: float = 600.0) -> Iterator[list[subprocess.Popen]]:
    """``n`` CPU-bound processes (a busy loop each) for the duration of the block, at most ``max_s`` seconds;
    killed (by their process ids) when the block ends."""
    if n < 0 or max_s <= 0:
        raise ValueError(f"hogs must be >= 0 and max_s > 0, got {n}, {max_s}")
    procs = [subprocess.Popen([sys.executable, "-c", _HOG.format(max_s=float(max_s))],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for _ in range(n)]
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait(timeout=10)


@dataclass(frozen=True)
class RoundResult:
    """One run of the selection: its exit status, wall time and pytest's last summary line."""

    round: int
    returncode: int
    wall_s: float
    summary: str

    @property
    def passed(self) -> bool:
        return self.returncode == 0

    def line(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        return f"round {self.round}: {verdict} (rc {self.returncode}) in {self.wall_s:.1f} s: {self.summary}"


_PROGRESS = re.compile(r"^([.sxXFE]+)\s*(\[\s*\d+%\])?$")  # a pytest progress line: one character per test
_OUTCOMES = {".": "passed", "F": "failed", "E": "error", "s": "skipped", "x": "xfailed", "X": "xpassed"}


def _summary(output: str) -> str:
    """pytest's final ``=== N passed ... in Xs ===`` line; where ``-qq`` prints none, the outcomes counted from the
    progress characters (and the first ``FAILED``/``ERROR`` line); else the last non-empty line."""
    lines = [ln.strip(" =") for ln in output.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if (" passed" in ln or " failed" in ln or " error" in ln) and " in " in ln:
            return ln
    counts = Counter(ch for ln in lines if (m := _PROGRESS.match(ln)) for ch in m.group(1))
    if counts:
        counted = ", ".join(f"{counts[ch]} {name}" for ch, name in _OUTCOMES.items() if counts[ch])
        first_failure = next((ln for ln in lines if ln.startswith(("FAILED ", "ERROR "))), "")
        return f"{counted} (counted from the progress){': ' + first_failure if first_failure else ''}"
    return lines[-1] if lines else ""


def load_check(selection: Sequence[str], hogs: int = 2, rounds: int = 3, python: str = sys.executable,
               cwd: Path | None = None, log_dir: Path | None = None, round_timeout_s: float = 3600.0,
               show: bool = True, command: bool = False) -> list[RoundResult]:
    """Run ``python -m pytest <selection>`` ``rounds`` times in a row while ``hogs`` CPU hogs run (started once
    for all rounds); each round's full output goes to ``log_dir/round_<i>.log`` when given. With ``command`` the
    selection is the command line itself (its last output line is the summary unless pytest's is found)."""
    argv = list(selection) if command else [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *selection]
    results: list[RoundResult] = []
    with cpu_hogs(hogs, max_s=rounds * round_timeout_s + 60) as procs:
        if show:
            print(f"{hogs} CPU hog(s) running (pids {[p.pid for p in procs]}); {os.cpu_count()} CPUs; "
                  f"load average {os.getloadavg()[0]:.1f}", flush=True)
        for i in range(1, rounds + 1):
            t0 = time.monotonic()
            try:
                done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=round_timeout_s)
                rc, output = done.returncode, done.stdout + done.stderr
            except subprocess.TimeoutExpired as e:
                out = e.stdout or ""
                rc, output = 124, out.decode(errors="replace") if isinstance(out, bytes) else out
                output += f"\n(round timed out after {round_timeout_s:.0f} s)"
            result = RoundResult(i, rc, time.monotonic() - t0, _summary(output))
            if log_dir is not None:
                log_dir.mkdir(parents=True, exist_ok=True)
                (log_dir / f"round_{i}.log").write_text(output)
            results.append(result)
            if show:
                print(result.line(), f"(load average {os.getloadavg()[0]:.1f})", flush=True)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m oxygen_ros.testing.load [--hogs N] [--rounds K] [--log-dir DIR] [--command] -- <args>``."""
    p = argparse.ArgumentParser(prog="python -m oxygen_ros.testing.load", description=__doc__.split("\n\n")[0])
    p.add_argument("--hogs", type=int, default=2, help="CPU-bound processes beside the tests (default 2)")
    p.add_argument("--rounds", type=int, default=3, help="runs of the selection in a row (default 3)")
    p.add_argument("--log-dir", type=Path, help="write each round's pytest output here")
    p.add_argument("--round-timeout", type=float, default=3600.0, help="seconds before a round is stopped")
    p.add_argument("--command", action="store_true", help="the arguments are a command (.ci/run), not pytest's")
    p.add_argument("selection", nargs="+", help="pytest arguments (files, -k ...) or the command, after --")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill still ends the hogs (the block's finally)
    if args.hogs < 0 or args.rounds < 1:
        p.error("--hogs must be >= 0 and --rounds >= 1")
    t0 = time.monotonic()
    results = load_check(args.selection, args.hogs, args.rounds, log_dir=args.log_dir,
                         round_timeout_s=args.round_timeout, command=args.command)
    passed = sum(r.passed for r in results)
    print(f"{passed}/{len(results)} rounds passed with {args.hogs} hog(s) in {time.monotonic() - t0:.1f} s",
          flush=True)
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
