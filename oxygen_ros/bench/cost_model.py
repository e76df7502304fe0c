"""The cost model: an engine's frame time predicted from profiled stage costs and the work it must do per frame.

A profile is ``profile_stages``' result: ``prefill_s``, ``denoise_s`` (all S steps) and ``decode_step_s``
(seconds of one decode step per batch size).
"""

from __future__ import annotations


def decode_cost(profile: dict, batch: float) -> float:
    """Profiled seconds of one decode step at ``batch`` rows (linear interpolation between measured sizes)."""
    table = sorted(profile["decode_step_s"].items())
    b = max(batch, table[0][0])
    for (b0, t0), (b1, t1) in zip(table, table[1:], strict=False):
        if b0 <= b <= b1:
            return t0 + (t1 - t0) * (b - b0) / (b1 - b0)
    (b0, t0), (b1, t1) = table[-2], table[-1]
    return t1 + (t1 - t0) * (b - b1) / (b1 - b0)


def predict_frame_s(point: dict, profile: dict) -> float:
    """Frame time the measured stage costs predict for the work this engine must do per frame.

    ``point`` is a measured record (runner.summarize): ``engine``, ``N`` and, for oxygen, the decode steps per
    frame and the mean decode batch it ran."""
    p, d, n = profile["prefill_s"], profile["denoise_s"], point["N"]
    if point["engine"] in ("isolated", "parallel"):
        language = p + (n - 1) * decode_cost(profile, 1)
        return max(p + d, language) if point["engine"] == "parallel" else p + d + language
    if point["engine"] == "shared_kv":
        return p + d + (n - 1) * decode_cost(profile, 1)
    steps = point["decode_steps_per_frame"]
    return p + d + steps * decode_cost(profile, point["batch_mean"])


def denoise_at(profile: dict, steps: int) -> float:
    """Seconds of a full denoise with ``steps`` steps (the profile records its model's ``num_steps``)."""
    return profile["denoise_s"] / profile["num_steps"] * steps


def profile_at(profile: dict, steps: int) -> dict:
    """The profile as if its model denoised with ``steps`` steps."""
    return {**profile, "denoise_s": denoise_at(profile, steps)}


def normalized_profile(prof: dict) -> dict:
    """A profile read back from JSON: integer batch sizes again."""
    return {**prof, "decode_step_s": {int(b): t for b, t in prof["decode_step_s"].items()}}
