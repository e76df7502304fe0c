"""File reading shared by the checkpoint formats: every failure is one PolicyConfigError naming the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import PolicyConfigError

__all__ = ["as_stats", "find_tokenizer", "read_json"]

TOKENIZER_FILES = ("tokenizer.model", "paligemma_tokenizer.model")


def read_json(path: Path) -> Any:
    """Parsed JSON, or PolicyConfigError (unreadable, not UTF-8, not JSON)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise PolicyConfigError(f"{path}: cannot read ({e.strerror or e})") from e
    except UnicodeDecodeError as e:
        raise PolicyConfigError(f"{path}: not a text file (is it a binary file given as JSON?)") from e
    except json.JSONDecodeError as e:
        raise PolicyConfigError(f"{path}: not valid JSON ({e})") from e


def as_stats(values: dict[str, Any], where: str, dtype=np.float64) -> dict[str, np.ndarray]:
    """``{name: list of numbers}`` -> finite 1-D arrays of one length (None entries dropped)."""
    out: dict[str, np.ndarray] = {}
    for name, v in values.items():
        if v is None:
            continue
        try:
            a = np.asarray(v, dtype=dtype).reshape(-1)
        except (TypeError, ValueError) as e:
            raise PolicyConfigError(f"{where}.{name}: not a list of numbers ({e})") from e
        if not np.all(np.isfinite(a)):
            raise PolicyConfigError(f"{where}.{name}: contains NaN or Inf")
        out[name] = a
    lengths = {k: int(a.shape[0]) for k, a in out.items()}
    if len(set(lengths.values())) > 1:
        raise PolicyConfigError(f"{where}: statistics have different lengths {lengths}")
    return out


def find_tokenizer(*candidates: Path | None) -> Path | None:
    """The first SentencePiece model among ``candidates`` (files, or directories holding one)."""
    for c in candidates:
        if c is None:
            continue
        c = Path(c).expanduser()
        if c.is_file():
            return c
        for name in TOKENIZER_FILES:
            if (c / name).is_file():
                return c / name
    return None
