"""Build a small SentencePiece tokenizer for tests and offline demos.

The production tokenizer is PaliGemma's (257152 pieces); it cannot be downloaded here, so tests train a
tiny model with the same special ids (PAD 0, EOS 1, BOS 2, UNK 3) and the same normaliser settings as
Gemma's tokenizer (identity normalisation, no dummy prefix, whitespace kept, digits split), so prompt
strings round-trip exactly through encode/decode. ``byte_fallback`` lets any text encode.
"""

from __future__ import annotations

import io
import itertools
import os
import tempfile
from pathlib import Path

import sentencepiece as spm

TOKENIZER_FILENAME = "tokenizer.model"

_COLORS = ("red", "blue", "green", "yellow", "black", "white", "orange", "purple")
_OBJECTS = ("block", "cup", "bowl", "plate", "mug", "ball", "sponge", "can", "bottle", "box")
_VERBS = ("put", "place", "move", "push", "pick up", "stack")
_PLACES = ("on the", "in the", "next to the", "behind the", "into the")
_TARGETS = ("blue plate", "red bowl", "green tray", "drawer", "basket", "table", "shelf", "sink")
_FIXED = (
    "put the red block on the blue plate",
    "The red block is in the gripper.",
    "The blue plate is empty.",
    "The drawer is open.",
    "I picked up the red block and moved it to the blue plate.",
    "Subtask: grasp the red block",
    "Subtask: move to the blue plate",
    "Subtask: release the block",
    "Memory: the cup is on the left.",
    "Narration: the robot is reaching for the cup.",
    # LIBERO-style instructions.
    "open the top drawer and put the bowl inside",
    "turn on the stove and put the moka pot on it",
    "put both the alphabet soup and the tomato sauce in the basket",
    "pick up the black bowl between the plate and the ramekin and place it on the plate",
    "put the wine bottle on top of the cabinet",
    "push the plate to the front of the stove",
    "put the cream cheese in the bowl",
    "open the middle drawer of the cabinet",
    "put the ketchup in the top drawer and close it",
    "pick up the book and place it in the back compartment of the caddy",
    "put the white mug on the left plate and put the yellow and white mug on the right plate",
    "Then I closed the gripper, lifted the object slowly and checked that nothing fell.",
    "Next, rotate the wrist by ninety degrees, approach from above and avoid the obstacle.",
    "Why did you stop? Because the grasp failed twice; I will retry with a wider opening.",
    "Quick brown foxes jump over lazy dogs while zebras eat hay; questions are welcome!",
)


def _corpus(extra_text: list[str] | None) -> list[str]:
    """Deterministic training corpus: prompt scaffolding, every state bin and robot sentences."""
    lines: list[str] = list(_FIXED)
    # Every state bin appears in a pi0.5-style prompt, so "State:" and digits are frequent.
    for start in range(0, 256, 16):
        bins = " ".join(str(b) for b in range(start, start + 16))
        lines.append(f"Task: put the red block on the blue plate, State: {bins};\nAction: ")
    for i, (verb, color, obj, place, target) in enumerate(
        itertools.product(_VERBS, _COLORS, _OBJECTS, _PLACES[:2], _TARGETS[:4])
    ):
        lines.append(f"{verb} the {color} {obj} {place} {target}")
        if i % 7 == 0:
            lines.append(f"The {color} {obj} is in the gripper.")
            lines.append(f"Memory: the {color} {obj} is {place} {target}.")
            lines.append(f"Narration: the robot will {verb} the {color} {obj}.")
            lines.append(f"Subtask: {verb} the {color} {obj}")
    for place, target in itertools.product(_PLACES, _TARGETS):
        lines.append(f"Task: move the cup {place} {target}, State: 0 127 255;\nAction: ")
    lines.extend(extra_text or [])
    return lines


def _train(lines: list[str], writer: io.BytesIO, vocab_size: int) -> None:
    """Train with Gemma-like settings, writing the serialized model to ``writer``."""
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=writer,
        model_type="bpe",  # Gemma and PaliGemma use BPE
        vocab_size=vocab_size,
        pad_id=0,
        eos_id=1,
        bos_id=2,
        unk_id=3,
        pad_piece="<pad>",
        eos_piece="<eos>",
        bos_piece="<bos>",
        unk_piece="<unk>",
        byte_fallback=True,
        # Gemma-like normaliser: text round-trips exactly (spaces, trailing space, newline).
        normalization_rule_name="identity",
        add_dummy_prefix=False,
        remove_extra_whitespaces=False,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        user_defined_symbols=["\n"],
        character_coverage=1.0,
        num_threads=1,
        minloglevel=2,
    )


def make_test_tokenizer(out_dir: Path, vocab_size: int = 512, extra_text: list[str] | None = None) -> Path:
    """Train a small SentencePiece model and write ``out_dir/tokenizer.model``.

    Args:
        out_dir: Directory to write into (created if missing).
        vocab_size: Total number of pieces, including the 4 special pieces, 256 byte pieces and the
            user-defined newline piece. The built-in corpus supports about 320..1000 (its characters
            need pieces too); pass ``extra_text`` for a larger vocabulary.
        extra_text: Additional training sentences.

    Returns:
        Path of the written model file. Training is single-threaded, so the same arguments give the
        same file bytes.

    Raises:
        ValueError: If SentencePiece cannot build ``vocab_size`` pieces from the corpus.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = io.BytesIO()
    try:
        _train(_corpus(extra_text), model, vocab_size)
    except RuntimeError as e:  # SentencePiece reports bad vocab sizes as INTERNAL errors
        raise ValueError(f"cannot train a tokenizer with vocab_size={vocab_size}: {e}") from e
    path = out_dir / TOKENIZER_FILENAME
    # Write atomically so concurrent readers never see a partial model.
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".tokenizer-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(model.getvalue())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
