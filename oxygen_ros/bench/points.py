"""Sweep points and their resumable storage: one JSON line per finished point in ``points.jsonl``.

A ``Point`` is one measurement; its ``key`` names what is measured (every parameter but the suite) and its
``id`` adds the suite. A re-run skips finished ids, and a point whose key another suite already measured copies
that record (``shared_with`` names the measured id) instead of measuring again.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

COMPILE_MODES = ("off", "default", "max-autotune-no-cudagraphs")


@dataclass(frozen=True)
class Point:
    """One measurement. Every field but ``suite`` is a parameter of what is measured."""

    suite: str
    engine: str  # isolated | shared_kv | oxygen | parallel | profile
    preset: str = "libero"
    S: int = 10
    N: int = 30  # tokens per request (0: no language at all, the oracle)
    k: int | str | None = None  # oxygen only
    workload: str = "every_frame"  # runner kinds, or "none" (no requests)
    period: int = 1
    burst: int = 0
    rate: float = 1.0
    min_tokens: int = 0  # random_length: N is the maximum
    heads: int = 1  # action experts (the paper's E counts the language expert too: E = heads + 1)
    deadline: str | None = None  # "1.3x" (of prefill + denoise) or "120ms"
    frames: int = 4
    config: str = "small"
    device: str = "cpu"
    dtype: str = "float32"
    compile: str = "off"
    onednn: bool = True
    seed: int = 0

    def params(self) -> dict:
        """Every field but ``suite``."""
        d = asdict(self)
        d.pop("suite")
        return d

    @property
    def key(self) -> str:
        """What is measured, independent of the suite (points with the same key are measured once)."""
        return ",".join(f"{k}={v}" for k, v in sorted(self.params().items()))

    @property
    def id(self) -> str:
        """Stable id: the suite and every parameter."""
        return f"{self.suite}:{self.key}"

    @property
    def model_key(self) -> tuple[str, int]:
        """Points sharing a model instance (S, k, N and the workload are engine parameters)."""
        return self.preset, COMPILE_MODES.index(self.compile)

    @property
    def label(self) -> str:
        """Short human-readable name (progress bar)."""
        k = f" k={self.k}" if self.k is not None else ""
        return f"{self.suite} {self.engine}{k} N={self.N} {self.preset} S={self.S}" + (
            f" E={self.heads}" if self.heads > 1 else "")


def point_of(rec: dict) -> Point:
    """The point a stored record measured."""
    return Point(suite=rec["suite"], **rec["params"])


class PointStore:
    """``points.jsonl``: one JSON record per finished point, appended as soon as it is measured."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: dict[str, dict] = {}
        self._measured: dict[str, str] = {}  # measurement key -> id of the record that measured it
        if path.exists():
            text = path.read_text()
            if text and not text.endswith("\n"):  # a run killed mid-write: keep the next record on its own line
                with path.open("a") as f:
                    f.write("\n")
            for line in text.splitlines():
                try:
                    self._index(json.loads(line))
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # a torn line: that point simply runs again

    def _index(self, rec: dict) -> None:
        self.records[rec["id"]] = rec
        if not rec.get("shared_with"):
            self._measured.setdefault(rec["key"], rec["id"])

    def __contains__(self, point_id: str) -> bool:
        return point_id in self.records

    def measured(self, key: str) -> dict | None:
        """A finished record measuring ``key`` (from any suite), if any."""
        rid = self._measured.get(key)
        return self.records[rid] if rid else None

    def append(self, rec: dict) -> None:
        """Write ``rec`` as the next line (creating the file and its folder if needed) and index it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(rec, default=str) + "\n")
        self._index(rec)


def shared_record(p: Point, measured: dict) -> dict:
    """The record of ``p`` reusing a measurement taken for another suite."""
    return {**measured, "id": p.id, "suite": p.suite, "shared_with": measured["id"]}
