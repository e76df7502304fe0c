"""The toy world's language (narration, questions and answers, coarse subtasks), the subtask-conditioned action
prompt and question prompts, their training batches and (with the committed model) exact match in the closed loop."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from oxygen_ros.engine.tokenizer import QUESTION_TEMPLATE, PromptTokenizer
from oxygen_ros.policy import load_policy
from oxygen_ros.policy.shipped_model import TOY_MODEL_DIR
from oxygen_ros.toy.train.data import collect, make_batch
from oxygen_ros.toy.train.evaluate import ClosedLoop, evaluate, prepare_with_subtask
from oxygen_ros.toy.train.policy import NormStats
from oxygen_ros.toy.train.recipe import make_world_tokenizer, toy_config
from oxygen_ros.toy.world import (
    QUESTION_FORMS,
    TabletopWorld,
    answer,
    answers,
    cell_text,
    expert_chunk,
    expert_subtask,
    narration_text,
    questions,
    sample_questions,
)

CELL_VALUES = {"13", "38", "63", "88"}


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> PromptTokenizer:
    return PromptTokenizer(make_world_tokenizer(tmp_path_factory.mktemp("tok")), toy_config().max_token_len)


def _episode_texts(seed: int) -> list[tuple[str, str, dict[str, str]]]:
    world = TabletopWorld()
    world.reset(seed)
    out = []
    while True:
        out.append((narration_text(world), expert_subtask(world), answers(world)))
        if world.done:
            return out
        world.apply(expert_chunk(world, 1)[0])


# ---------------------------------------------------------------------------------------------- world language
def test_cell_text_names_grid_cell_centres() -> None:
    assert cell_text(np.array([0.12, 0.86])) == "13 88"
    assert cell_text(np.array([0.0, 0.9999])) == "13 88"
    assert cell_text(np.array([0.26, 0.74])) == "38 63"
    assert cell_text(np.array([-0.2, 1.3])) == "13 88"  # clipped to the table


def test_narration_follows_the_pick_and_place_phases() -> None:
    for seed in range(5):
        world = TabletopWorld()
        world.reset(seed)
        block = world.state.block_colors[world.state.target_block]
        plate = world.state.plate_colors[world.state.target_plate]
        phases = []
        for narration, _, _ in _episode_texts(seed):
            if not phases or phases[-1] != narration:
                phases.append(narration)
        assert phases == [f"Reaching for the {block} block.", f"Grasping the {block} block.",
                          f"Carrying the {block} block to the {plate} plate.", f"Placing the {block} block.",
                          "Done."], (seed, phases)


def test_subtasks_name_cell_centres_and_end_with_done() -> None:
    texts = [s for seed in range(5) for _, s, _ in _episode_texts(seed)]
    assert texts[-1] == "done"
    for s in texts:
        if s == "done":
            continue
        assert s.startswith(("pick up the ", "put it on the ")), s
        assert set(s.split(" at ")[1].split()) <= CELL_VALUES, s


def test_questions_and_answers_cover_the_scene() -> None:
    world = TabletopWorld()
    world.reset(3)
    s = world.state
    qa = answers(world)
    assert list(qa) == questions(world) and len(qa) == len(s.block_colors) + 3
    assert qa["which plate is the target?"] == f"The {s.plate_colors[s.target_plate]} plate."
    assert qa["which block is the target?"] == f"The {s.block_colors[s.target_block]} block."
    assert qa["what is in the gripper?"] == "Nothing."
    for color in s.block_colors:
        assert qa[f"where is the {color} block?"] == f"The {color} block is on the table."
    assert answer(world, "  Where is the " + s.block_colors[0] + " block? ") == qa[questions(world)[0]]
    assert answer(world, "where is the purple block?") is None and answer(world, "why?") is None
    assert answer(world, "what is in the gripper?") == "Nothing."
    pairs = sample_questions(world, np.random.default_rng(0), 20)
    assert all(qa[q] == a for q, a in pairs) and len({q for q, _ in pairs}) > 3
    assert all(any(q == f.format(block=c) for f in QUESTION_FORMS for c in s.block_colors) for q in qa)


def test_answers_follow_the_held_and_placed_block() -> None:
    world = TabletopWorld()
    world.reset(2)
    s = world.state
    block, plate = s.block_colors[s.target_block], s.plate_colors[s.target_plate]
    seen = set()
    while not world.done:
        world.apply(expert_chunk(world, 1)[0])
        seen.add(answer(world, f"where is the {block} block?"))
        if s.held == s.target_block:
            assert answer(world, "what is in the gripper?") == f"The {block} block."
    assert {f"The {block} block is in the gripper.", f"The {block} block is on the {plate} plate."} <= seen
    assert answer(world, "what is in the gripper?") == "Nothing."


# ---------------------------------------------------------------------------------------------- prompts
def test_action_prompt_without_subtask_is_unchanged(tok) -> None:
    state = np.array([0.3, -0.7, 1.0, -1.0])
    base = tok.tokenize_action_prompt("put the red block on the blue plate", state, clip_state=True)
    for sub in (None, "", "   "):
        p = tok.tokenize_action_prompt("put the red block on the blue plate", state, clip_state=True, subtask=sub)
        assert np.array_equal(p.ids, base.ids) and np.array_equal(p.mask, base.mask)
        assert p.num_tokens == base.num_tokens and not p.truncated and not p.instruction_cut
    assert tok.decode(base.ids).endswith(";\nAction: ")


def test_action_prompt_with_subtask(tok) -> None:
    state = np.array([0.3, -0.7, 1.0, -1.0])
    p = tok.tokenize_action_prompt("put the red block on the blue plate", state, clip_state=True,
                                   subtask="put it on the yellow plate at 63 88")
    assert p.ids[0] == tok.bos_id and not p.truncated and p.num_tokens <= tok.max_token_len
    text = tok.decode(p.ids[: p.num_tokens])
    assert text.startswith("Task: put the red block on the blue plate, State: ")
    assert text.endswith(";\nSubtask: put it on the yellow plate at 63 88;\nAction: ")
    cleaned = tok.tokenize_action_prompt("put the red block on the blue plate", state, clip_state=True,
                                         subtask=" put_it on\nthe plate ")
    assert tok.decode(cleaned.ids[: cleaned.num_tokens]).endswith("Subtask: put it on the plate;\nAction: ")
    with pytest.raises(ValueError):
        tok.tokenize_action_prompt("put the red block", None, subtask="done")


def test_keep_state_cut_keeps_the_subtask(tok) -> None:
    state = np.array([0.3, -0.7, 1.0, -1.0])
    long = " ".join(["put the red block on the blue plate"] * 6)
    p = tok.tokenize_action_prompt(long, state, clip_state=True, keep_state=True, subtask="done")
    assert p.instruction_cut and not p.truncated and p.num_tokens <= tok.max_token_len
    assert tok.decode(p.ids[: p.num_tokens]).endswith(";\nSubtask: done;\nAction: ")
    plain = tok.tokenize_action_prompt(long, state, clip_state=True, keep_state=True)
    assert tok.decode(plain.ids[: plain.num_tokens]).endswith(";\nAction: ") and plain.instruction_cut


def test_tokenize_question(tok, caplog) -> None:
    ids = tok.tokenize_question("where is the red block?")
    assert ids == tok.encode(QUESTION_TEMPLATE.format(question="where is the red block?"))
    assert tok.bos_id not in ids and tok.decode(ids) == "Question: where is the red block?\nAnswer: "
    for bad in ("", "   "):
        with pytest.raises(ValueError):
            tok.tokenize_question(bad)
    with pytest.raises(ValueError):
        tok.tokenize_question("why?", max_len=0)
    with caplog.at_level(logging.WARNING):
        cut = tok.tokenize_question("where is the red block? " * 10, max_len=20)
    assert len(cut) == 20 and "truncating" in caplog.text


# ---------------------------------------------------------------------------------------------- training data
def test_batches_condition_on_subtasks_and_ask_questions(tok) -> None:
    demos = collect(3, progress=False)
    assert {n.split(" ")[0] for n in demos.narrations} >= {"Reaching", "Grasping", "Carrying", "Placing", "Done."}
    assert demos.questions.shape == demos.answers.shape == (len(demos), 5)
    assert demos.prev_subtasks[0] == "" and set(demos.prev_subtasks[1:]) - {""}
    stats = NormStats.fit(demos.states, demos.actions)
    index = np.arange(0, len(demos), 3)
    rng = np.random.default_rng(0)
    batch = make_batch(demos, index, tok, stats, 4, rng=rng, subtask_prob=1.0)
    assert set(batch.language) == {"memory", "subtask", "narration", "answer"}
    for row, i in enumerate(index):
        text = tok.decode(batch.observation.tokens[row].tolist())
        assert f";\nSubtask: {demos.subtasks[i]};\nAction: " in text
        tokens, target = batch.language["answer"]
        prompt = tokens[row][~target[row] & (tokens[row] != 0)].tolist()
        question = tok.decode(prompt).removeprefix("Question: ").removesuffix("\nAnswer: ")
        k = list(demos.questions[i]).index(question)
        assert tok.decode(tokens[row][target[row]].tolist()) == demos.answers[i, k]
    plain = make_batch(demos, index, tok, stats, 4)
    assert all(";\nSubtask:" not in tok.decode(t.tolist()) for t in plain.observation.tokens)


# ---------------------------------------------------------------------------------------------- committed model
def test_prepare_with_subtask_matches_the_tokenizer() -> None:
    policy = load_policy(TOY_MODEL_DIR)
    world = TabletopWorld()
    raw = ClosedLoop.raw(world.reset(1_000_000))
    plain = policy.prepare(raw)
    same = prepare_with_subtask(policy, raw, "")
    assert torch.equal(same.observation.tokens, plain.observation.tokens)
    cond = prepare_with_subtask(policy, raw, expert_subtask(world))
    want = policy.tokenizer.tokenize_action_prompt(raw.task, plain.normalized_state, clip_state=True,
                                                   subtask=expert_subtask(world))
    assert cond.observation.tokens[0].tolist() == want.ids[: want.num_tokens].tolist()
    assert cond.prompt_tokens == want.num_tokens and torch.equal(cond.observation.images, plain.observation.images)


def test_committed_model_speaks_exactly_in_the_loop() -> None:
    m = evaluate(TOY_MODEL_DIR, episodes=4, mode="oxygen", condition=True, progress=False)
    summary = {k: v for k, v in m.items() if k != "per_episode"}
    assert m["success_rate"] >= 0.75 and m["conditioned_frames"] > 0, summary
    for task in ("memory", "subtask", "narration", "answer"):
        assert m[f"{task}_requests"] > 0 and m[f"{task}_exact_match"] >= 0.75, (task, summary)
