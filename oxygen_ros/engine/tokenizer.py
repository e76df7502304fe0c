"""Prompt tokenisation for pi0.5 (openpi's ``PaligemmaTokenizer`` format) and language requests.

The action prompt is exactly openpi's pi0.5 format::

    BOS + "Task: {instruction}, State: {s_1 ... s_d};\\nAction: "

where each normalised state value in [-1, 1] is bucketed into one of 256 bins. With a subtask
(``tokenize_action_prompt(..., subtask=...)``, staged inference after openpi PR #942: the subtask a
"Subtask: " request generated conditions the next frames' actions) the prompt is::

    BOS + "Task: {instruction}, State: {s_1 ... s_d};\nSubtask: {subtask};\nAction: "

and without one (None or empty) exactly upstream's format above. Language requests (memory, narration,
subtask, questions or custom text) continue after that shared prefix, so their own prompts carry no BOS;
a question's prompt is :data:`QUESTION_TEMPLATE` (:meth:`PromptTokenizer.tokenize_question`, request
task "answer").
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import sentencepiece as spm

logger = logging.getLogger(__name__)

# File names looked up when the tokenizer path is a directory, in order.
MODEL_FILENAMES: tuple[str, ...] = ("tokenizer.model", "paligemma_tokenizer.model")

# PaliGemma's special ids (openpi relies on them: padding is 0, BOS is prepended).
PAD_ID = 0
EOS_ID = 1
BOS_ID = 2

DEFAULT_MAX_TOKEN_LEN = 200  # pi0.5's max_token_len
NUM_STATE_BINS = 256
_STATE_BIN_EDGES = np.linspace(-1.0, 1.0, NUM_STATE_BINS + 1)[:-1]

# Prompts of the language requests; each continues after the shared action prefix (no BOS).
LANGUAGE_TEMPLATES: dict[str, str] = {
    "memory": "Memory: ",
    "narration": "Narration: ",
    "subtask": "Subtask: ",
}
CUSTOM_TASK = "custom"
# Prompt of a question request (task "answer"): the question carries its own text, so it has no template entry.
QUESTION_TEMPLATE = "Question: {question}\nAnswer: "


@dataclass(frozen=True)
class TokenizedPrompt:
    """A padded action prompt.

    Attributes:
        ids: int64 token ids, shape [max_token_len], padded with PAD (0).
        mask: bool, shape [max_token_len]; True for the first ``num_tokens`` entries.
        truncated: True when the prompt was longer than max_token_len and was cut.
        num_tokens: Number of valid tokens in ``ids`` (at most max_token_len).
        instruction_cut: True when the instruction was cut so that the state fits (``keep_state``).
    """

    ids: np.ndarray
    mask: np.ndarray
    truncated: bool
    num_tokens: int
    instruction_cut: bool = False


def discretize_state(state: np.ndarray | Iterable[float], clip: bool = False) -> np.ndarray:
    """Bucket normalised state values into 256 bins, as openpi's pi0.5 tokenizer and LeRobot do.

    ``bin = digitize(s, linspace(-1, 1, 257)[:-1]) - 1``: -1 -> 0, 0 -> 128, >= 0.9921875 -> 255, and values below
    -1 give bin -1 (upstream does not clip). ``clip=True`` clips to [-1, 1] first (bins 0..255), the convention
    the package's own toy checkpoints were trained with.

    Raises:
        ValueError: If any value is NaN or infinite (upstream would silently give bin 255 for NaN).
    """
    values = np.asarray(state)
    if not np.all(np.isfinite(values)):
        raise ValueError(f"state has non-finite values: {values}")
    if clip:
        values = np.clip(values.astype(np.float64), -1.0, 1.0)
    bins = np.digitize(values, bins=_STATE_BIN_EDGES) - 1
    return bins.astype(np.int64)


def _clean(text: str) -> str:
    """Prompt text as openpi cleans the instruction: stripped, "_" and newlines replaced by spaces."""
    return text.strip().replace("_", " ").replace("\n", " ")


def _resolve_model_path(path: str | os.PathLike[str]) -> Path:
    """Return the model file for ``path`` (a ``.model`` file or a directory containing one)."""
    p = Path(path).expanduser()
    if p.is_dir():
        for name in MODEL_FILENAMES:
            if (p / name).is_file():
                return p / name
        tried = ", ".join(str(p / name) for name in MODEL_FILENAMES)
        raise FileNotFoundError(f"no SentencePiece tokenizer in directory {p} (tried {tried})")
    if not p.is_file():
        raise FileNotFoundError(f"SentencePiece tokenizer model not found: {p}")
    return p


class PromptTokenizer:
    """PaliGemma SentencePiece tokenizer producing pi0.5 action prompts and language-request prompts.

    In production this wraps PaliGemma's tokenizer (256000 text pieces + 1024 ``<loc>`` + 128 ``<seg>``,
    PAD 0, EOS 1, BOS 2); tests use a small model from ``oxygen_ros.engine.small_tokenizer``.

    Attributes:
        model_path: The SentencePiece model file in use.
        vocab_size: Number of pieces in the model (257152 for PaliGemma).
        pad_id: Padding id (0).
        eos_id: End-of-sequence id (1).
        bos_id: Beginning-of-sequence id (2).
        max_token_len: Length of padded action prompts.
    """

    def __init__(self, path: str | os.PathLike[str], max_token_len: int = DEFAULT_MAX_TOKEN_LEN) -> None:
        """Load the tokenizer.

        Args:
            path: A SentencePiece ``.model`` file, or a directory containing ``tokenizer.model`` or
                ``paligemma_tokenizer.model``.
            max_token_len: Length of padded action prompts (pi0.5 uses 200).

        Raises:
            FileNotFoundError: If no model file is found (the message names the paths tried).
            ValueError: If max_token_len < 1, or the model's PAD/EOS/BOS ids are not 0/1/2.
        """
        if max_token_len < 1:
            raise ValueError(f"max_token_len must be >= 1, got {max_token_len}")
        self.model_path: Path = _resolve_model_path(path)
        self._sp = spm.SentencePieceProcessor(model_file=str(self.model_path))
        self.max_token_len = int(max_token_len)
        expected = {"pad": (self._sp.pad_id(), PAD_ID), "eos": (self._sp.eos_id(), EOS_ID),
                    "bos": (self._sp.bos_id(), BOS_ID)}
        wrong = {k: got for k, (got, want) in expected.items() if got != want}
        if wrong:
            raise ValueError(
                f"tokenizer {self.model_path} has special ids {wrong}; expected PaliGemma's pad=0, eos=1, bos=2"
            )
        self.pad_id, self.eos_id, self.bos_id = PAD_ID, EOS_ID, BOS_ID  # the model's own: checked just above
        self.vocab_size = int(self._sp.get_piece_size())
        self._warned_truncation = False

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        """Encode ``text`` with SentencePiece (no normalisation beyond the model's own)."""
        return list(self._sp.encode(text, add_bos=add_bos))

    def tokenize_action_prompt(self, instruction: str, state: np.ndarray | None,
                               clip_state: bool = False, keep_state: bool = False,
                               subtask: str | None = None) -> TokenizedPrompt:
        """Tokenise a pi0.5 action prompt exactly as openpi's ``PaligemmaTokenizer.tokenize``.

        Args:
            instruction: Task instruction; stripped, with "_" and newlines replaced by spaces.
            state: 1-D normalised state (already normalised to about [-1, 1], before padding to
                action_dim), or None for the pi0 format (no state in the prompt).
            clip_state: clip the state to [-1, 1] before discretising (see :func:`discretize_state`).
            keep_state: when the prompt is too long, cut the instruction (at a token boundary) so that the state
                and the ``Action:`` suffix still fit (``instruction_cut`` is set), instead of cutting the prompt's
                end as openpi and LeRobot do. Prompts that fit are identical either way. The subtask is kept too.
            subtask: the current subtask (cleaned like the instruction): adds ``"Subtask: {subtask};\n"`` before
                ``"Action: "``. None or empty: upstream's prompt, unchanged. Needs a state (pi0.5 format).

        Returns:
            The padded prompt. When it is still longer than max_token_len it is cut to max_token_len
            (``truncated`` is set; a warning is logged the first time per tokenizer instance).

        Raises:
            ValueError: a subtask without a state (the pi0 format has no place for it), a state that is not 1-D
                or not finite.
        """
        cleaned = instruction.strip().replace("_", " ").replace("\n", " ")
        sub = _clean(subtask) if subtask else ""
        tail = f"Subtask: {sub};\nAction: " if sub else "Action: "
        instruction_cut = False
        if state is not None:
            bins = discretize_state(state, clip=clip_state)
            if bins.ndim != 1:
                raise ValueError(f"state must be 1-D, got shape {bins.shape}")
            state_str = " ".join(map(str, bins.tolist()))
            tokens = self.encode(f"Task: {cleaned}, State: {state_str};\n{tail}", add_bos=True)
            if keep_state and len(tokens) > self.max_token_len:
                tokens, instruction_cut = self._cut_instruction(cleaned, state_str, len(tokens), tail), True
        elif sub:
            raise ValueError("a subtask needs the pi0.5 prompt format (a state in the prompt)")
        else:
            # pi0 format: "\n" is tokenised separately as the start-of-answer token.
            tokens = self.encode(cleaned, add_bos=True) + self.encode("\n")

        n = len(tokens)
        truncated = n > self.max_token_len
        if truncated:
            # Warn once per instance: the same prompt usually repeats every control step.
            if not self._warned_truncation:
                logger.warning(
                    "action prompt has %d tokens, truncating to max_token_len=%d "
                    "(the end of the prompt is lost; further truncations are logged at debug level)",
                    n,
                    self.max_token_len,
                )
                self._warned_truncation = True
            else:
                logger.debug("action prompt truncated from %d to %d tokens", n, self.max_token_len)
            tokens = tokens[: self.max_token_len]
        num = len(tokens)
        ids = np.full(self.max_token_len, PAD_ID, dtype=np.int64)
        ids[:num] = tokens
        mask = np.zeros(self.max_token_len, dtype=bool)
        mask[:num] = True
        return TokenizedPrompt(ids=ids, mask=mask, truncated=truncated, num_tokens=num, instruction_cut=instruction_cut)

    def _cut_instruction(self, cleaned: str, state_str: str, n_tokens: int, tail: str = "Action: ") -> list[int]:
        """The action prompt with the instruction cut to the longest token prefix that lets the whole fit
        (``tail``: what follows the state line, ``"Action: "`` or the subtask line and ``"Action: "``)."""
        ids = self.encode(cleaned)
        keep = max(0, len(ids) - (n_tokens - self.max_token_len))
        while True:
            cut = self._sp.decode(ids[:keep]).strip()
            tokens = self.encode(f"Task: {cut}, State: {state_str};\n{tail}", add_bos=True)
            if len(tokens) <= self.max_token_len or keep == 0:  # re-encoding a prefix can merge differently
                return tokens
            keep -= 1

    def tokenize_request(self, task: str, text: str | None = None, max_len: int = 32) -> list[int]:
        """Tokenise a language-request prompt (no BOS: it continues after the action prefix).

        Args:
            task: A key of ``LANGUAGE_TEMPLATES`` ("memory", "narration", "subtask") or "custom".
            text: The prompt text for task "custom"; must be None or empty for the other tasks.
            max_len: Maximum number of tokens; longer prompts are cut (with a warning).

        Raises:
            ValueError: For an unknown task, text given with a template task, an empty prompt, or
                max_len < 1.
        """
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        if task == CUSTOM_TASK:
            prompt = text or ""
        elif task in LANGUAGE_TEMPLATES:
            if text:
                raise ValueError(f"text is only used with task={CUSTOM_TASK!r}, got task={task!r}")
            prompt = LANGUAGE_TEMPLATES[task]
        else:
            known = sorted([*LANGUAGE_TEMPLATES, CUSTOM_TASK])
            raise ValueError(f"unknown language task {task!r}; expected one of {known}")
        tokens = self.encode(prompt, add_bos=False)
        if not tokens:
            raise ValueError(f"empty prompt for language task {task!r}")
        if len(tokens) > max_len:
            logger.warning("%s request prompt has %d tokens, truncating to %d", task, len(tokens), max_len)
            tokens = tokens[:max_len]
        return tokens

    def tokenize_question(self, question: str, max_len: int = 48) -> list[int]:
        """Tokenise a question request's prompt, :data:`QUESTION_TEMPLATE` (no BOS: it continues after the action
        prefix; request task "answer").

        Raises:
            ValueError: For an empty (or blank) question or max_len < 1. Longer prompts are cut (with a warning).
        """
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        cleaned = _clean(question or "")
        if not cleaned:
            raise ValueError("empty question")
        tokens = self.encode(QUESTION_TEMPLATE.format(question=cleaned), add_bos=False)
        if len(tokens) > max_len:
            logger.warning("question prompt has %d tokens, truncating to %d", len(tokens), max_len)
            tokens = tokens[:max_len]
        return tokens

    def decode(self, ids: Iterable[int]) -> str:
        """Decode token ids to text, stopping at the first EOS and dropping PAD.

        Raises:
            IndexError: For an id outside [0, vocab_size).
        """
        out: list[int] = []
        for token in ids:
            t = int(token)
            if t == EOS_ID:
                break
            if t != PAD_ID:
                out.append(t)
        return self._sp.decode(out)
