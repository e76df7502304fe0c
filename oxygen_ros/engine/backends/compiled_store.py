"""A cache directory of compiled steps: one AOTInductor package per step, found by a key of all it depends on.

Each entry is ``<step>-<digest>.pt2`` plus ``<step>-<digest>.json``, its manifest: the full key (the step's shapes,
dtypes and options, the device, the thread count, the torch version, a hash of the engine's source) and the
package's sha256. An entry is used only when its manifest holds exactly the key asked for and the package's bytes
match the checksum; anything else (a stale key, a corrupt or truncated file, a package that fails to load) is
rebuilt, with a log line saying why. Writes go to a temporary name first and are renamed into place, so a reader
never sees half a package.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

FORMAT = 1  # bump when the layout of a package's inputs changes


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/oxygen_ros/compiled`` (``~/.cache/oxygen_ros/compiled`` when the variable is unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "oxygen_ros" / "compiled"


@functools.cache
def source_hash() -> str:
    """sha256 of the engine's Python source: a compiled step is stale once the code it was traced from changes."""
    h = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def full_key(spec: dict) -> dict:
    """``spec`` (the step's own description) plus what every compiled step depends on, as JSON values (the form
    the manifest stores it in, so the two compare equal)."""
    key = {**spec, "format": FORMAT, "torch": torch.__version__, "threads": torch.get_num_threads(),
           "source": source_hash()}
    return json.loads(json.dumps(key, sort_keys=True))


def digest(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _short(value: object, limit: int = 60) -> str:
    text = "absent" if value is _ABSENT else json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_ABSENT = object()


def key_diff(want: dict, have: dict, prefix: str = "") -> list[str]:
    """The fields in which ``have`` (an entry's key) differs from ``want``, as ``path: wanted vs found`` lines:
    nested maps by dotted path (``config.max_token_len``), a step's ``inputs`` signature per input name."""
    out: list[str] = []
    for k in sorted(set(want) | set(have)):
        a, b = want.get(k, _ABSENT), have.get(k, _ABSENT)
        if a == b:
            continue
        path = f"{prefix}{k}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += key_diff(a, b, path + ".")
        elif k == "inputs" and isinstance(a, list) and isinstance(b, list):
            wa, hb = ({str(x[0]): x[1:] for x in v if isinstance(x, list) and x} for v in (a, b))
            for name in [*wa, *(n for n in hb if n not in wa)]:
                if wa.get(name, _ABSENT) != hb.get(name, _ABSENT):
                    out.append(f"{path}[{name}]: {_short(wa.get(name, _ABSENT))} wanted, "
                               f"{_short(hb.get(name, _ABSENT))} found")
        else:
            out.append(f"{path}: {_short(a)} wanted, {_short(b)} found")
    return out


def key_summary(key: dict) -> str:
    """A key in one line without its long parts (the inputs' signature, the source hash): what a log names."""
    brief = {k: v for k, v in key.items() if k not in ("inputs", "source", "config")}
    cfg = key.get("config")
    if isinstance(cfg, dict):
        brief["config"] = cfg.get("name")
    return f"{digest(key)[:20]} {json.dumps(brief, sort_keys=True)}"


@dataclass
class Entry:
    """What :meth:`CompiledStore.get` returns: the loaded object, how it came (``loaded`` / ``built``) and times."""

    value: object
    how: str
    seconds: float
    path: Path


class CompiledStore:
    """Compiled steps under ``root`` (created on first write)."""

    def __init__(self, root: str | os.PathLike | None = None) -> None:
        self.root = Path(root).expanduser() if root else default_cache_dir()

    def paths(self, name: str, key: dict) -> tuple[Path, Path]:
        """The package and manifest paths of ``name`` under ``key`` (a :func:`full_key`)."""
        stem = f"{name}-{digest(key)[:20]}"
        return self.root / f"{stem}.pt2", self.root / f"{stem}.json"

    def check(self, name: str, key: dict) -> str | None:
        """Why the entry of ``name`` under ``key`` cannot be used (``None``: it can); ``"missing"`` when absent."""
        package, manifest = self.paths(name, key)
        if not package.exists() and not manifest.exists():
            return "missing"
        try:
            meta = json.loads(manifest.read_text())
        except (OSError, ValueError) as e:
            return f"unreadable manifest ({e})"
        if meta.get("key") != key:
            changed = sorted(k for k in set(key) | set(meta.get("key", {})) if key.get(k) != meta.get("key", {}).get(k))
            return f"stale key (differs in {', '.join(changed) or 'format'})"
        if not package.exists():
            return "package missing"
        if file_sha256(package) != meta.get("sha256"):
            return "checksum mismatch (corrupt package)"
        return None

    def nearest(self, name: str, key: dict) -> tuple[Path, list[str]] | None:
        """The manifest of step ``name`` in the directory whose key differs from ``key`` in the fewest fields, and
        those fields (:func:`key_diff`); None when there is no entry of that step."""
        best: tuple[Path, list[str]] | None = None
        for manifest in sorted(self.root.glob(f"{name}-*.json")) if self.root.is_dir() else []:
            try:
                meta = json.loads(manifest.read_text())
            except (OSError, ValueError):
                continue
            if meta.get("name") != name or not isinstance(meta.get("key"), dict):
                continue
            diff = key_diff(key, meta["key"])
            if best is None or len(diff) < len(best[1]):
                best = (manifest, diff)
        return best

    def explain_miss(self, name: str, key: dict) -> str:
        """Why the entry of ``name`` under ``key`` is not there, for the log: the key looked for and, when the
        directory holds another entry of that step, the fields its key differs in."""
        near = self.nearest(name, key)
        looked = f"looked for {name} {key_summary(key)}"
        if near is None:
            return f"{looked}; {self.root} holds no {name} entry"
        fields = near[1]
        return f"{looked}; the nearest entry {near[0].name} differs in {len(fields)} field(s): " + "; ".join(fields[:8])

    def get(self, name: str, key: dict, build: Callable[[Path], None], load: Callable[[Path], object]) -> Entry:
        """Load the entry of ``name`` under ``key``, or build it (``build(path)`` writes a package at ``path``) and
        load that. A present entry that fails :meth:`check` or fails to load is rebuilt, with a warning."""
        t0 = time.perf_counter()
        package, manifest = self.paths(name, key)
        reason = self.check(name, key)
        if reason is None:
            try:
                return Entry(load(package), "loaded", time.perf_counter() - t0, package)
            except Exception as e:  # noqa: BLE001 - any load failure means: rebuild
                reason = f"load failed ({type(e).__name__}: {e})"
        if reason != "missing":
            logger.warning("compiled step %s at %s: %s; rebuilding it", name, package, reason)
        else:
            logger.info("compiled step %s: not in %s; building it (once) (%s)", name, self.root,
                        self.explain_miss(name, key))
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".pt2", prefix=f".{name}-", dir=self.root)
        os.close(fd)
        tmp_path = Path(tmp)
        try:
            build(tmp_path)
            meta = {"name": name, "key": key, "sha256": file_sha256(tmp_path), "built_s": time.perf_counter() - t0}
            os.replace(tmp_path, package)
            tmp_manifest = manifest.with_name(f".{manifest.name}.{os.getpid()}.tmp")
            tmp_manifest.write_text(json.dumps(meta, indent=1, sort_keys=True))
            os.replace(tmp_manifest, manifest)
        finally:
            tmp_path.unlink(missing_ok=True)
        value = load(package)
        return Entry(value, "built", time.perf_counter() - t0, package)
