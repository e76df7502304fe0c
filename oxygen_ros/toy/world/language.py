"""The world's language: progress narration, questions about the scene and their true answers, and the coarse
table coordinates that subtasks and answers name.

Every text is a function of the current state that one observation (the two camera images and the joint state)
determines, so a model can learn it and an evaluation can score generated text by exact match:

- positions are named by the centre of their cell of a :data:`LANGUAGE_GRID` x :data:`LANGUAGE_GRID` table grid (one
  cell = one 16 px patch of the 64 px top view), in table percent: ``cell_text(xy)`` -> "13 88" (cells centre at 13,
  38, 63 and 88); objects start near their cell centres, so the text is far from any cell border;
- :func:`narration_text`: the phase of the pick-and-place ("Reaching for the red block.", "Grasping the red block.",
  "Carrying the red block to the blue plate.", "Placing the red block.", "Releasing the green block." when the wrong
  block is held, "Done.");
- :data:`QUESTION_FORMS` and :func:`answer`: "where is the red block?" -> "The red block is on the table." /
  "... is in the gripper." / "... is on the blue plate."; "what is in the gripper?" -> "The green block." /
  "Nothing."; "which block is the target?" -> "The red block."; "which plate is the target?" -> "The blue plate.";
  asked about every block colour in the scene (:func:`questions`, :func:`sample_questions`).
"""

from __future__ import annotations

import numpy as np

from .tabletop import TabletopWorld

__all__ = ["GRASP_NARRATION_RADIUS", "LANGUAGE_GRID", "PLACE_NARRATION_RADIUS", "QUESTION_FORMS", "answer",
           "answers", "cell_text", "narration_text", "questions", "sample_questions"]

LANGUAGE_GRID = 4
GRASP_NARRATION_RADIUS = 0.06  # "Grasping": the gripper is within one step (xy_speed) of the target block
PLACE_NARRATION_RADIUS = 0.06  # "Placing": the held target block is within this of the target plate's centre

QUESTION_FORMS: tuple[str, ...] = (
    "where is the {block} block?",
    "what is in the gripper?",
    "which block is the target?",
    "which plate is the target?",
)


def cell_text(xy: np.ndarray, grid: int = LANGUAGE_GRID) -> str:
    """The centre of the grid cell holding table point ``xy`` in table percent, "x y" (e.g. "13 88")."""
    cells = np.clip(np.floor(np.asarray(xy, np.float64)[:2] * grid), 0, grid - 1)
    x, y = (int(np.floor((c + 0.5) * 100.0 / grid + 0.5)) for c in cells)
    return f"{x} {y}"


def narration_text(world: TabletopWorld) -> str:
    """The current phase of the task in words (see the module docstring)."""
    s = world.state
    block = s.block_colors[s.target_block]
    if world.success:
        return "Done."
    if s.held >= 0 and s.held != s.target_block:
        return f"Releasing the {s.block_colors[s.held]} block."
    if s.held == s.target_block:
        d = float(np.linalg.norm(s.block_xy[s.held] - s.plate_xy[s.target_plate]))
        if d <= PLACE_NARRATION_RADIUS:
            return f"Placing the {block} block."
        return f"Carrying the {block} block to the {s.plate_colors[s.target_plate]} plate."
    if float(np.linalg.norm(s.ee[:2] - s.block_xy[s.target_block])) <= GRASP_NARRATION_RADIUS:
        return f"Grasping the {block} block."
    return f"Reaching for the {block} block."


def _where_block(world: TabletopWorld, i: int) -> str:
    s = world.state
    color = s.block_colors[i]
    if s.held == i:
        return f"The {color} block is in the gripper."
    plate = world.plate_under(i)
    if plate >= 0:
        return f"The {color} block is on the {s.plate_colors[plate]} plate."
    return f"The {color} block is on the table."


def answers(world: TabletopWorld) -> dict[str, str]:
    """Every valid question about the current scene (:data:`QUESTION_FORMS` over the colours present, in a fixed
    order) -> its true answer."""
    s = world.state
    out: dict[str, str] = {}
    for i, color in enumerate(s.block_colors):
        out[QUESTION_FORMS[0].format(block=color)] = _where_block(world, i)
    out[QUESTION_FORMS[1]] = f"The {s.block_colors[s.held]} block." if s.held >= 0 else "Nothing."
    out[QUESTION_FORMS[2]] = f"The {s.block_colors[s.target_block]} block."
    out[QUESTION_FORMS[3]] = f"The {s.plate_colors[s.target_plate]} plate."
    return out


def questions(world: TabletopWorld) -> list[str]:
    """The valid questions about the current scene (fixed order: each block, gripper, target block, target plate)."""
    return list(answers(world))


def answer(world: TabletopWorld, question: str) -> str | None:
    """The true answer to ``question`` (case and surrounding blanks ignored), None when it is not a valid question
    about this scene (unknown form, or a colour that is not present)."""
    return answers(world).get(" ".join(question.strip().lower().split()))


def sample_questions(world: TabletopWorld, rng: np.random.Generator, n: int = 1) -> list[tuple[str, str]]:
    """``n`` (question, true answer) pairs drawn uniformly, with replacement, from :func:`questions`."""
    pairs = list(answers(world).items())
    return [pairs[int(i)] for i in rng.integers(0, len(pairs), n)]
