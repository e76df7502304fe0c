"""Exact speculative decoding on the resumable request state: drafts, what a row feeds, greedy acceptance.

A row of a batched decode forward may carry several tokens: its next token, the rest of its prompt (known) and up
to ``d`` draft tokens from a :class:`DraftSource` (by default the stream's last finished output). The forward
predicts the token after each of them; a draft is kept while it equals the prediction before it (greedy), so the
text is token-for-token what plain decoding gives. Rejected drafts' K/V stay invalid and are overwritten later.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .requests import RequestState


class DraftSource(Protocol):
    """Proposes continuations for a request and learns from finished ones."""

    def propose(self, state: RequestState, limit: int) -> list[int]:
        """Up to ``limit`` tokens expected to follow ``state.tokens`` (may be empty)."""
        ...

    def observe(self, state: RequestState) -> None:
        """A request finished (not dropped): ``state.tokens`` is its output."""
        ...

    def record(self, state: RequestState, drafted: int, accepted: int) -> None:
        """How a forward's drafts for ``state`` fared (to stop drafting where it does not pay)."""
        ...


def stream_key(state: RequestState) -> tuple[str, str]:
    """The draft stream of a request: its task and optional stream name."""
    return state.request.task, state.request.stream


class LastOutputDrafts:
    """Drafts from the stream's last finished output (a robot's memory or narration changes slowly).

    The continuation is taken where the request's own tokens line up with the previous output: at the same
    position when every token so far agrees, else after the latest occurrence of its last ``ngram`` (.. 1) tokens
    nearest that position (prompt-lookup style), so one changed word does not end the drafting.

    A stream whose drafts were all rejected ``patience`` forwards in a row is drafted for only every ``probe``-th
    time after that (rows then carry one token, as without speculation), until a draft is accepted again.
    """

    def __init__(self, ngram: int = 3, patience: int = 2, probe: int = 8) -> None:
        self.ngram, self.patience, self.probe = ngram, patience, probe
        self.last: dict[tuple[str, str], list[int]] = {}
        self.misses: dict[tuple[str, str], int] = {}

    def observe(self, state: RequestState) -> None:
        self.last[stream_key(state)] = list(state.tokens)

    def record(self, state: RequestState, drafted: int, accepted: int) -> None:
        key = stream_key(state)
        self.misses[key] = 0 if accepted else self.misses.get(key, 0) + 1

    def propose(self, state: RequestState, limit: int) -> list[int]:
        key = stream_key(state)
        prev = self.last.get(key)
        if not prev or limit <= 0:
            return []
        misses = self.misses.get(key, 0)
        if misses >= self.patience:
            self.misses[key] = misses + 1  # skipped forwards count too, so a probe comes every `probe`
            if (misses - self.patience) % self.probe:
                return []
        gen = state.tokens
        g = len(gen)
        if prev[:g] == gen:
            return prev[g:g + limit]
        for n in range(min(self.ngram, g), 0, -1):
            tail = gen[-n:]
            ends = [i + n for i in range(len(prev) - n + 1) if prev[i:i + n] == tail]
            if ends:
                end = min(ends, key=lambda e: (abs(e - g), -e))
                return prev[end:end + limit]
        return []


def acceptance_rate(totals: dict[str, int]) -> float | None:
    """Accepted / drafted tokens of an engine's ``totals`` (None before any draft)."""
    return totals["draft_accepted"] / totals["drafted"] if totals.get("drafted") else None


@dataclass
class Verdict:
    """What one row's multi-token forward established."""

    kept: int  # fed tokens whose K/V stay (the row's next write index advances by this)
    emitted: list[int]  # generated tokens, in order (EOS and max_new_tokens respected)
    drafted: int  # draft tokens fed
    accepted: int  # of which kept


def row_feed(state: RequestState, drafts: DraftSource | None, max_tokens: int) -> tuple[list[int], int]:
    """The tokens a row feeds in one forward (at most ``max_tokens``) and how many of them are known (its next
    token and the rest of its prompt); the others are drafts."""
    prompt = state.request.prompt_tokens
    known = [state.next_token, *prompt[state.fed + 1:]]
    feed = known[:max_tokens]
    room = max_tokens - len(feed)
    if drafts is not None and room > 0 and len(feed) == len(known):
        # each kept draft yields one more token; the forward's last prediction comes on top
        remaining = state.request.max_new_tokens - len(state.tokens) - 1
        feed += drafts.propose(state, min(room, remaining))
    return feed, min(len(known), len(feed))


def verify(state: RequestState, feed: list[int], known: int, preds: list[int], eos_id: int) -> Verdict:
    """Greedy acceptance of one row: ``preds[j]`` is the forward's argmax after ``feed[j]``."""
    prompt_len = len(state.request.prompt_tokens)
    room = state.request.max_new_tokens - len(state.tokens)
    kept, emitted = 0, []
    for j in range(len(feed)):
        kept = j + 1
        if state.fed + kept < prompt_len:
            continue  # still inside the prompt: nothing generated yet, the next feed token is known
        tok = preds[j]
        emitted.append(tok)
        if tok == eos_id or len(emitted) >= room or j + 1 >= len(feed) or feed[j + 1] != tok:
            break
    drafted = len(feed) - known
    return Verdict(kept, emitted, drafted, max(kept - known, 0))
