"""The evaluation's output bag: the node's ActionChunk / LanguageOutput messages, and the determinism digest."""

from __future__ import annotations

import hashlib
import shutil
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rosbags.rosbag2 import Writer

from oxygen_ros.engine.requests import FinishedRequest
from oxygen_ros.ros.publishers import language_output, make_action_chunk

from .typestore import ACTION_TYPE, LANGUAGE_TYPE, to_typestore

__all__ = ["ACTION_TOPIC", "LANGUAGE_TOPIC", "OutputBag", "prepare_out_bag"]

# The node's output topics as it resolves them (node name ``oxygen``, ``~/action_chunk``, ``~/language_output``).
ACTION_TOPIC = "/oxygen/action_chunk"
LANGUAGE_TOPIC = "/oxygen/language_output"


def prepare_out_bag(out: Path, overwrite: bool) -> Path:
    """``out/out_bag``, made free: an existing rosbag2 there is removed with ``overwrite``; ``out`` is created.

    Raises:
        FileExistsError: ``out_bag`` exists and ``overwrite`` is false, or it is not a rosbag2 directory.
    """
    out_bag = out / "out_bag"
    if out_bag.exists():
        if not overwrite:
            raise FileExistsError(f"{out_bag} exists (pass overwrite=True / --overwrite)")
        if not (out_bag / "metadata.yaml").exists():
            raise FileExistsError(f"{out_bag} exists and is not a rosbag2 directory; not removing it")
        shutil.rmtree(out_bag)
    out.mkdir(parents=True, exist_ok=True)
    return out_bag


class OutputBag:
    """Writes the node's ActionChunk / LanguageOutput messages to an open bag writer and keeps the digests
    (sha256 of every chunk and of every finished request's text and tokens)."""

    def __init__(self, writer: Writer, ts: Any) -> None:
        self.ts, self.writer = ts, writer
        self.action_conn = writer.add_connection(ACTION_TOPIC, ACTION_TYPE, typestore=ts)
        self.language_conn = writer.add_connection(LANGUAGE_TOPIC, LANGUAGE_TYPE, typestore=ts)
        self.actions_hash, self.texts_hash = hashlib.sha256(), hashlib.sha256()
        self.num_chunks = self.num_texts = 0

    def _write(self, conn: Any, log_ns: int, msg: Any, msgtype: str) -> None:
        self.writer.write(conn, log_ns, self.ts.serialize_cdr(to_typestore(msg, self.ts), msgtype))

    def chunk(self, frame_index: int, stamp_ns: int, log_ns: int, actions: np.ndarray, names: Sequence[str],
              dt_s: float, latency_s: float, subtask: str = "", first_step: int = 0) -> None:
        """One action chunk [H, D] float32 in robot units, stamped with the observation time ``stamp_ns`` and
        logged at the tick ``log_ns`` that produced it (``subtask``: what its prompt was conditioned on;
        ``first_step``: the denoised chunk's index of ``actions[0]``, ActionChunk.first_step)."""
        self._write(self.action_conn, log_ns, make_action_chunk(actions, stamp_ns, frame_index, names, dt_s,
                                                                latency_s, subtask=subtask, first_step=first_step),
                    ACTION_TYPE)
        horizon, dim = actions.shape
        self.actions_hash.update(struct.pack("<qqii", frame_index, stamp_ns, horizon, dim) + actions.tobytes())
        self.num_chunks += 1

    def language(self, f: FinishedRequest, now_ns: int) -> None:
        """A finished request: header stamp = originating observation time, logged at the finishing tick."""
        self._write(self.language_conn, now_ns, language_output(f), LANGUAGE_TYPE)
        self.texts_hash.update(struct.pack("<qqq?", f.request_id, f.frame_index, int(f.stamp), bool(f.eos))
                               + np.asarray(f.tokens, dtype=np.int64).tobytes() + (f.text or "").encode() + b"\0")
        self.num_texts += 1

    def digest(self) -> dict[str, Any]:
        """``sha256`` over both digests, ``actions_sha256``, ``texts_sha256`` and the message counts."""
        a, t = self.actions_hash.hexdigest(), self.texts_hash.hexdigest()
        return {"sha256": hashlib.sha256(f"{a}:{t}".encode()).hexdigest(), "actions_sha256": a,
                "texts_sha256": t, "num_chunks": self.num_chunks, "num_texts": self.num_texts}
