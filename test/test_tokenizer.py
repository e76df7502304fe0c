"""Tests for oxygen_ros.engine.tokenizer against a small generated SentencePiece model."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm

from oxygen_ros.engine.small_tokenizer import make_test_tokenizer
from oxygen_ros.engine.tokenizer import (
    BOS_ID,
    EOS_ID,
    LANGUAGE_TEMPLATES,
    PAD_ID,
    PromptTokenizer,
    TokenizedPrompt,
    discretize_state,
)
from oxygen_ros.tools.make_tokenizer import main as make_tokenizer_main

INSTRUCTION = "put the red block on the blue plate"


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tokenizer")
    make_test_tokenizer(out)
    return out


@pytest.fixture(scope="session")
def tok(tokenizer_dir: Path) -> PromptTokenizer:
    return PromptTokenizer(tokenizer_dir)


@pytest.fixture(scope="session")
def sp(tokenizer_dir: Path) -> spm.SentencePieceProcessor:
    return spm.SentencePieceProcessor(model_file=str(tokenizer_dir / "tokenizer.model"))


def openpi_bins(state: np.ndarray) -> np.ndarray:
    """openpi's formula verbatim (no clip)."""
    return np.digitize(state, bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1


# --- state discretisation -------------------------------------------------------------------------


def test_discretize_matches_openpi_in_range() -> None:
    edges = np.array([-1.0, -0.99, 0.0, 0.5, 0.999, 1.0])
    np.testing.assert_array_equal(discretize_state(edges), openpi_bins(edges))
    np.testing.assert_array_equal(discretize_state(edges), [0, 1, 128, 192, 255, 255])
    rng = np.random.default_rng(0)
    values = rng.uniform(-1, 1, size=1000).astype(np.float32)
    np.testing.assert_array_equal(discretize_state(values), openpi_bins(values))
    assert discretize_state(values).dtype == np.int64


def test_discretize_out_of_range_as_upstream() -> None:
    """openpi and LeRobot do not clip: below -1 is bin -1, above 1 saturates at 255; clip=True (our toy
    checkpoints' convention) maps the low side to 0."""
    values = np.array([-5.0, -1.0001, 1.0001, 7.0])
    np.testing.assert_array_equal(discretize_state(values), [-1, -1, 255, 255])
    np.testing.assert_array_equal(discretize_state(values), openpi_bins(values))
    np.testing.assert_array_equal(discretize_state(values, clip=True), [0, 0, 255, 255])
    # openpi itself gives -1 below the range; the clip is deliberate.
    assert openpi_bins(np.array([-1.5]))[0] == -1


def test_discretize_rejects_non_finite() -> None:
    with pytest.raises(ValueError, match="non-finite"):
        discretize_state(np.array([0.0, np.nan]))


# --- action prompt --------------------------------------------------------------------------------


def test_action_prompt_format(tok: PromptTokenizer, sp: spm.SentencePieceProcessor) -> None:
    state = np.array([-1.0, -0.99, 0.0, 0.5, 0.999, 1.0, 2.0, -3.0], dtype=np.float32)
    out = tok.tokenize_action_prompt(INSTRUCTION, state)
    assert isinstance(out, TokenizedPrompt)
    assert out.ids.shape == (200,) and out.ids.dtype == np.int64
    assert out.mask.shape == (200,) and out.mask.dtype == np.bool_
    assert not out.truncated
    n = out.num_tokens
    assert 0 < n < 200
    assert out.ids[0] == BOS_ID
    assert out.mask[:n].all() and not out.mask[n:].any()
    assert (out.ids[n:] == PAD_ID).all()
    expected = f"Task: {INSTRUCTION}, State: 0 1 128 192 255 255 255 -1;\nAction: "  # openpi: no clip
    assert sp.decode(out.ids[:n].tolist()) == expected
    # Same ids as encoding the full string with BOS directly.
    assert out.ids[:n].tolist() == sp.encode(expected, add_bos=True)


def test_action_prompt_cleans_instruction(tok: PromptTokenizer, sp: spm.SentencePieceProcessor) -> None:
    state = np.zeros(2)
    out = tok.tokenize_action_prompt("  put_the red\nblock  ", state)
    text = sp.decode(out.ids[: out.num_tokens].tolist())
    assert text == "Task: put the red block, State: 128 128;\nAction: "


def test_action_prompt_without_state(tok: PromptTokenizer, sp: spm.SentencePieceProcessor) -> None:
    out = tok.tokenize_action_prompt(INSTRUCTION, None)
    ids = out.ids[: out.num_tokens].tolist()
    assert ids == sp.encode(INSTRUCTION, add_bos=True) + sp.encode("\n")
    assert sp.decode(ids) == INSTRUCTION + "\n"


def test_action_prompt_rejects_2d_state(tok: PromptTokenizer) -> None:
    with pytest.raises(ValueError, match="1-D"):
        tok.tokenize_action_prompt(INSTRUCTION, np.zeros((2, 3)))


def test_truncation(tokenizer_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    short = PromptTokenizer(tokenizer_dir, max_token_len=16)
    state = np.linspace(-1, 1, 32)
    full = PromptTokenizer(tokenizer_dir, max_token_len=1000).tokenize_action_prompt(INSTRUCTION, state)
    assert full.num_tokens > 16 and not full.truncated
    with caplog.at_level(logging.WARNING, logger="oxygen_ros.engine.tokenizer"):
        out = short.tokenize_action_prompt(INSTRUCTION, state)
    assert out.truncated and out.num_tokens == 16
    assert out.ids.shape == (16,) and out.mask.all()
    np.testing.assert_array_equal(out.ids, full.ids[:16])
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert str(full.num_tokens) in warnings[0].getMessage() and "16" in warnings[0].getMessage()
    # Only the first truncation per instance is a warning (it repeats every control step).
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="oxygen_ros.engine.tokenizer"):
        assert short.tokenize_action_prompt(INSTRUCTION, state).truncated
    assert not caplog.records


def test_exact_length_is_not_truncated(tokenizer_dir: Path, tok: PromptTokenizer) -> None:
    n = tok.tokenize_action_prompt(INSTRUCTION, np.zeros(3)).num_tokens
    exact = PromptTokenizer(tokenizer_dir, max_token_len=n).tokenize_action_prompt(INSTRUCTION, np.zeros(3))
    assert not exact.truncated and exact.num_tokens == n and exact.mask.all()


# --- language requests ----------------------------------------------------------------------------


@pytest.mark.parametrize("task", sorted(LANGUAGE_TEMPLATES))
def test_request_templates(tok: PromptTokenizer, sp: spm.SentencePieceProcessor, task: str) -> None:
    ids = tok.tokenize_request(task)
    assert ids and ids[0] != BOS_ID and BOS_ID not in ids
    assert sp.decode(ids) == LANGUAGE_TEMPLATES[task]
    assert tok.decode(ids) == LANGUAGE_TEMPLATES[task]


def test_request_custom(tok: PromptTokenizer, caplog: pytest.LogCaptureFixture) -> None:
    ids = tok.tokenize_request("custom", "Where is the red block? ")
    assert ids[0] != BOS_ID
    assert tok.decode(ids) == "Where is the red block? "
    with caplog.at_level(logging.WARNING, logger="oxygen_ros.engine.tokenizer"):
        cut = tok.tokenize_request("custom", "The red block is in the gripper. " * 10, max_len=5)
    assert len(cut) == 5
    assert any("truncating" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("task", "text"),
    [("poem", None), ("custom", None), ("custom", ""), ("memory", "extra text")],
)
def test_request_errors(tok: PromptTokenizer, task: str, text: str | None) -> None:
    with pytest.raises(ValueError):
        tok.tokenize_request(task, text)


# --- decode, loading ------------------------------------------------------------------------------


def test_decode_stops_at_eos_and_drops_pad(tok: PromptTokenizer, sp: spm.SentencePieceProcessor) -> None:
    a = sp.encode("The red block")
    b = sp.encode(" is in the gripper.")
    assert (
        tok.decode([*a, PAD_ID, *b, EOS_ID, *sp.encode(" junk"), PAD_ID])
        == "The red block is in the gripper."
    )
    assert tok.decode(np.array([BOS_ID, *a, EOS_ID])) == "The red block"
    assert tok.decode([EOS_ID, *a]) == ""


def test_properties(tok: PromptTokenizer) -> None:
    assert (tok.pad_id, tok.eos_id, tok.bos_id) == (0, 1, 2)
    assert tok.vocab_size == 512
    assert tok.max_token_len == 200


def test_load_from_dir_and_file(tokenizer_dir: Path, tmp_path: Path) -> None:
    from_dir = PromptTokenizer(tokenizer_dir)
    from_file = PromptTokenizer(tokenizer_dir / "tokenizer.model")
    assert from_dir.model_path == from_file.model_path
    # The name big_vision / openpi use for the downloaded file.
    alt = tmp_path / "alt"
    alt.mkdir()
    (alt / "paligemma_tokenizer.model").write_bytes((tokenizer_dir / "tokenizer.model").read_bytes())
    state = np.array([0.1, -0.2])
    np.testing.assert_array_equal(
        PromptTokenizer(alt).tokenize_action_prompt(INSTRUCTION, state).ids,
        from_file.tokenize_action_prompt(INSTRUCTION, state).ids,
    )


def test_missing_paths(tmp_path: Path) -> None:
    missing = tmp_path / "nope.model"
    with pytest.raises(FileNotFoundError, match="nope.model"):
        PromptTokenizer(missing)
    with pytest.raises(FileNotFoundError, match="tokenizer.model"):
        PromptTokenizer(tmp_path)


def test_wrong_special_ids(tmp_path: Path) -> None:
    import io

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(["put the red block on the blue plate"] * 20),
        model_writer=model,
        vocab_size=30,
        minloglevel=2,
        num_threads=1,
        hard_vocab_limit=False,
    )  # SentencePiece defaults: unk 0, bos 1, eos 2, pad -1
    path = tmp_path / "default.model"
    path.write_bytes(model.getvalue())
    with pytest.raises(ValueError, match="pad=0, eos=1, bos=2"):
        PromptTokenizer(path)


def test_make_tokenizer_deterministic_and_cli(tokenizer_dir: Path, tmp_path: Path) -> None:
    make_tokenizer_main(["--out", str(tmp_path), "--vocab-size", "512"])
    assert (tmp_path / "tokenizer.model").read_bytes() == (tokenizer_dir / "tokenizer.model").read_bytes()
    # Byte fallback: any text round-trips.
    tok = PromptTokenizer(tmp_path)
    text = "Grüße, 机器人 ☃ — ok"
    assert tok.decode(tok.encode(text)) == text


def test_make_tokenizer_bad_vocab_size(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="vocab_size=100"):
        make_test_tokenizer(tmp_path, vocab_size=100)
