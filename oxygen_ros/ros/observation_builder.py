"""ROS messages -> one prepared policy observation per control frame.

:class:`~.input_store.InputStore` keeps each camera's last few valid images (checked, not decoded:
:mod:`.camera_image`), the joint positions and the instruction. :class:`ObservationBuilder` turns the store's
contents into the policy's model input at each control tick: one image per camera, synchronised
(:mod:`oxygen_ros.robot.camera_sync`), decoded once, then :meth:`oxygen_ros.policy.Policy.prepare` (the checkpoint's
own resize, normalisation and prompt); or it says why the frame must be skipped (missing, stale or unsynchronised
cameras, missing or non-finite state, no instruction): no action is computed from stale data.

Nothing here needs a running node; the builder is unit-tested with plain messages.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from oxygen_ros.policy import Policy, PreparedObservation, RawObservation
from oxygen_ros.robot.camera_sync import best_match

from .camera_image import FUTURE_TOLERANCE_NS, CameraImage
from .image_conversion import ImageError
from .input_store import InputStore

__all__ = ["BuiltObservation", "ObservationBuilder", "Skip"]


@dataclass(frozen=True)
class Skip:
    """Why a control frame produced no observation."""

    reason: str
    detail: str = ""


@dataclass(frozen=True)
class BuiltObservation:
    """Model input of one frame and what it was built from."""

    prepared: PreparedObservation
    stamp_ns: int  # observation time = newest camera stamp used
    received: float  # monotonic arrival of that newest image
    instruction: str
    state: np.ndarray  # robot-unit state in joint_names order (float64)
    prompt_truncated: bool  # the prompt's end (the state) was cut: the state alone overflows the prompt
    instruction_cut: bool = False  # the instruction was cut at a token boundary so that the state fits


class ObservationBuilder:
    """Builds the policy input for a control tick from an :class:`InputStore`.

    Args:
        store: the inputs (its camera names are the policy's camera slots they feed).
        policy: the checkpoint's contract (image conversion, normalisation, prompt).
        max_age_s: images older than this (node clock) make the frame stale.
        max_joint_age_s: joint positions that arrived longer ago than this make the frame stale; 0 = no limit.
        max_camera_skew_s: the images of one observation lie within this many seconds of each other, chosen
            from each camera's buffer as an approximate-time synchroniser does
            (:mod:`oxygen_ros.robot.camera_sync`); 0 = equal stamps (hardware-triggered cameras); negative = no
            synchronisation (each camera's newest image).
    """

    def __init__(self, store: InputStore, policy: Policy, max_age_s: float, max_joint_age_s: float = 0.0,
                 max_camera_skew_s: float = 0.1) -> None:
        unknown = [c for c in store.camera_names if c not in policy.spec.camera_slots]
        if unknown:
            raise ValueError(f"camera_names {unknown} are not camera slots of the model "
                             f"{list(policy.spec.camera_slots)}")
        self.store = store
        self.policy = policy
        self.max_age_ns = int(max_age_s * 1e9)
        self.max_skew_ns = round(max_camera_skew_s * 1e9)  # < 0: no synchronisation (each camera's newest image)
        self._pool: ThreadPoolExecutor | None = None  # decodes a frame's images concurrently
        self.max_joint_age_ns = int(max_joint_age_s * 1e9)
        self.last_stamp_ns = -1  # the newest observation stamp handed out: stamps strictly increase

    def _select_images(self, now_ns: int) -> list[CameraImage] | Skip:
        """One usable image per camera (fresh, not from the future, not known bad), synchronised; or why not."""
        names, usable_per_camera = self.store.camera_names, []
        for index, (name, buffer) in enumerate(zip(names, self.store.camera_buffers(), strict=True)):
            usable, newest_age = [], None
            for image in buffer:
                if image.error is not None:
                    continue
                age = now_ns - image.stamp_ns
                if -age > FUTURE_TOLERANCE_NS:  # only reaches here when the store had no node clock
                    self.store.discard(index, image)
                    self.store.rejected.add("image_from_future", f"{name}: stamped {-age / 1e9:.3f} s ahead of "
                                            "the node clock")
                    continue
                newest_age = age
                if age <= self.max_age_ns:
                    usable.append(image)
            if not usable:
                if newest_age is None:
                    return Skip("missing_camera", f"no image from {name} yet")
                return Skip("stale_camera", f"{name} newest image is {newest_age / 1e9:.3f} s old (max "
                            f"{self.max_age_ns / 1e9:g} s)")
            usable_per_camera.append(usable)
        if self.max_skew_ns < 0:
            return [max(u, key=lambda im: im.stamp_ns) for u in usable_per_camera]
        match = best_match([[im.stamp_ns for im in u] for u in usable_per_camera], self.last_stamp_ns)
        if match is None:  # every camera has a candidate, but no set newer than the last frame's observation
            return Skip("repeated_observation", "no camera image newer than the last frame's observation")
        if not match.within(self.max_skew_ns):
            newest = ", ".join(f"{n} {(now_ns - max(im.stamp_ns for im in u)) / 1e9:.3f} s"
                               for n, u in zip(names, usable_per_camera, strict=True))
            return Skip("camera_skew", f"no image set within max_camera_skew_s={self.max_skew_ns / 1e9:g}: best "
                        f"spread {match.spread_ns / 1e9:.3f} s (newest image ages: {newest})")
        return [u[j] for u, j in zip(usable_per_camera, match.indices, strict=True)]

    def _decode(self, now_ns: int, chosen: list[CameraImage]) -> list[CameraImage] | Skip:
        """Decode (once per image) and convert the chosen images; an image whose data turns out bad is counted as
        a rejected input, dropped, and the set is chosen again without it."""
        while True:
            failed = self._convert(chosen)
            if not failed:
                return chosen
            for index, image, error in failed:
                reason = "image_undecodable" if image.compressed else "image_bad_data"
                self.store.rejected.add(reason, f"{image.camera}: {error} (found when decoding it for a frame)")
                self.store.discard(index, image)
            chosen = self._select_images(now_ns)
            if isinstance(chosen, Skip):
                return chosen

    def _convert(self, chosen: list[CameraImage]) -> list[tuple[int, CameraImage, ImageError]]:
        """Decode + convert the images not converted yet, concurrently (OpenCV releases the GIL); the failures."""
        convert = self.policy.convert_image

        def one(image: CameraImage) -> ImageError | None:
            try:
                image.pixels(convert)
            except ImageError as e:
                return e
            return None

        pending = [i for i, image in enumerate(chosen) if not image.converted]
        if len(pending) > 1:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=min(4, len(chosen)), thread_name_prefix="oxygen-decode")
            errors = list(self._pool.map(lambda i: one(chosen[i]), pending))
        else:
            errors = [one(chosen[i]) for i in pending]
        return [(i, chosen[i], e) for i, e in zip(pending, errors, strict=True) if e is not None]

    def build(self, now_ns: int, subtask: Callable[[str], str] | None = None) -> BuiltObservation | Skip:
        """The observation for a tick at node time ``now_ns``, or why the tick is skipped. ``subtask(instruction)``
        gives the subtask to condition the action prompt on (subtask conditioning; '' or None: none)."""
        images, positions, seen, instruction = self.store.snapshot()
        chosen = self._select_images(now_ns)  # synchronised, not decoded yet
        if isinstance(chosen, Skip):
            return chosen
        stamp = max(im.stamp_ns for im in chosen)
        if stamp <= self.last_stamp_ns:  # each observation is acted on once: never a second chunk from it
            return Skip("repeated_observation", "no camera image newer than the last frame's observation")
        if not seen.all():
            missing = [n for n, s in zip(self.store.joint_names, seen, strict=True) if not s]
            return Skip("no_state", f"no position yet for {', '.join(missing[:5])}")
        if self.max_joint_age_ns > 0:
            ages = now_ns - self.store.joint_arrivals_ns()
            stale = np.flatnonzero(ages > self.max_joint_age_ns)
            if stale.size:
                shown = ", ".join(f"{self.store.joint_names[i]} {ages[i] / 1e9:.2f} s" for i in stale[:5])
                return Skip("stale_joint_state", f"{stale.size} joint(s) not updated within max_joint_age_s="
                            f"{self.max_joint_age_ns / 1e9:g}: {shown}")
        if not np.all(np.isfinite(positions)):
            return Skip("invalid_state", "joint state has NaN/Inf")
        if instruction is None:
            return Skip("no_instruction", "waiting for /instruction")

        images = self._decode(now_ns, chosen)  # only the images this frame uses are decoded
        if isinstance(images, Skip):
            return images
        names = self.store.camera_names
        raw = RawObservation({n: im.rgb for n, im in zip(names, images, strict=True)}, positions, instruction,
                             subtask(instruction) if subtask is not None else "")
        converted = {n: im.pixels(self.policy.convert_image) for n, im in zip(names, images, strict=True)}
        try:
            prepared = self.policy.prepare(raw, converted)
        except ValueError as e:
            return Skip("bad_input", str(e))
        newest = max(images, key=lambda im: im.stamp_ns)  # the observation stamp rule: newest camera stamp used
        if newest.stamp_ns <= self.last_stamp_ns:  # a bad image was replaced by an older one
            return Skip("repeated_observation", "no camera image newer than the last frame's observation")
        self.last_stamp_ns = newest.stamp_ns
        return BuiltObservation(prepared, newest.stamp_ns, newest.received, instruction, positions,
                                prepared.prompt_truncated, prepared.instruction_cut)
