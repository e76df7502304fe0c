"""A toy tabletop world for closed-loop evaluation of pi0.5: numpy simulation, rendering and a scripted expert."""

from .expert import expert_action, expert_chunk, expert_subtask, run_expert
from .language import QUESTION_FORMS, answer, answers, cell_text, narration_text, questions, sample_questions
from .tabletop import CAMERAS, JOINT_NAMES, TabletopWorld, WorldConfig, WorldObservation, WorldState

__all__ = [
    "CAMERAS",
    "JOINT_NAMES",
    "QUESTION_FORMS",
    "TabletopWorld",
    "WorldConfig",
    "WorldObservation",
    "WorldState",
    "answer",
    "answers",
    "cell_text",
    "expert_action",
    "expert_chunk",
    "expert_subtask",
    "narration_text",
    "questions",
    "run_expert",
    "sample_questions",
]
