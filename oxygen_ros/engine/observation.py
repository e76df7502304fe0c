"""Model inputs for one control frame (a batch of observations)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# How the fused prefill lays out the prefix (EngineConfig.prefill_layout, Pi05Model.prefill_layout):
# padded: every camera slot and the prompt as given (openpi's layout: 3 slots, the prompt padded to 200);
# compact: without the cameras masked and the prompt columns padded in every row (Observation.compacted);
# auto: padded where the precision reproduces openpi's bf16 roundings (there the padding sets the attention's
# reduction lengths, so dropping it moves the result), compact otherwise (exact in float32 up to summation order).
PREFILL_LAYOUTS = ("auto", "padded", "compact")


@dataclass
class Observation:
    """A batch of B observations, already preprocessed for pi0.5.

    images:      float [B, C, 3, H, W] in [-1, 1], cameras in ``config.camera_names`` order
    image_masks: bool  [B, C]; a False camera is masked out of attention (missing or stale camera)
    tokens:      int64 [B, L] prompt token ids (BOS + "Task: ..., State: ...;\\nAction: "), padded with 0
    token_mask:  bool  [B, L] True for real prompt tokens
    state:       float [B, S] normalised robot state (pi0.5 reads it through the discretised prompt; kept for
                 bookkeeping and for models that project it)
    """

    images: torch.Tensor
    image_masks: torch.Tensor
    tokens: torch.Tensor
    token_mask: torch.Tensor
    state: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    def validate(self, num_cameras: int, image_size: int) -> None:
        """Raise ValueError with a clear message when shapes, dtypes or values are off."""
        b = self.batch_size
        if self.images.shape != (b, num_cameras, 3, image_size, image_size):
            raise ValueError(
                f"images must be [B={b}, C={num_cameras}, 3, {image_size}, {image_size}], "
                f"got {tuple(self.images.shape)}"
            )
        if self.image_masks.shape != (b, num_cameras) or self.image_masks.dtype != torch.bool:
            raise ValueError(f"image_masks must be bool [{b}, {num_cameras}], got {self.image_masks.dtype} "
                             f"{tuple(self.image_masks.shape)}")
        if self.token_mask.shape != self.tokens.shape or self.token_mask.dtype != torch.bool:
            raise ValueError("token_mask must be a bool tensor shaped like tokens")
        if not bool(self.token_mask.any(dim=1).all()):
            raise ValueError("every observation needs at least one valid prompt token (BOS)")
        if not torch.isfinite(self.images).all():
            raise ValueError("images contain NaN or Inf")
        if self.state is not None and not torch.isfinite(self.state).all():
            raise ValueError("state contains NaN or Inf")

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> Observation:
        return Observation(
            images=self.images.to(device=device, dtype=dtype or self.images.dtype),
            image_masks=self.image_masks.to(device),
            tokens=self.tokens.to(device),
            token_mask=self.token_mask.to(device),
            state=None if self.state is None else self.state.to(device),
        )

    def compacted(self) -> Observation:
        """The same observation without the work it masks out: the cameras masked in every row and the prompt
        columns padded in every row are dropped (``self`` when there are none).

        Exact for pi0.5: a masked token is attended by no one and does not advance the positions (``cumsum`` of
        validity), so the kept tokens see the same keys at the same positions. openpi pads every prompt to
        ``max_token_len`` (200 for pi0.5) and runs every camera slot through SigLIP; this skips that work."""
        cams, cols = self.image_masks.any(0), self.token_mask.any(0)
        keep_cams, keep_cols = bool(cams.all()), bool(cols.all())
        if keep_cams and keep_cols:
            return self
        images, masks = self.images, self.image_masks
        if not keep_cams:
            idx = cams.nonzero().flatten()
            images, masks = images.index_select(1, idx), masks.index_select(1, idx)
        tokens, token_mask = self.tokens, self.token_mask
        if not keep_cols:
            idx = cols.nonzero().flatten()
            tokens, token_mask = tokens.index_select(1, idx), token_mask.index_select(1, idx)
        return Observation(images, masks, tokens, token_mask, self.state)

    def select(self, index: int) -> Observation:
        """Observation ``index`` of the batch, as a batch of one."""
        s = slice(index, index + 1)
        return Observation(
            self.images[s], self.image_masks[s], self.tokens[s], self.token_mask[s],
            None if self.state is None else self.state[s],
        )


def stack_observations(observations: list[Observation]) -> Observation:
    """Batch-of-one observations -> one batch of B: prompts right-padded with token 0 (mask False) to the longest,
    states kept only when every observation has one of the same size. Padding never changes a row's result: its
    padded positions are invalid (masked out of attention, skipped by the positions)."""
    if not observations:
        raise ValueError("no observations to stack")
    longest = max(o.tokens.shape[1] for o in observations)

    def pad(x: torch.Tensor, value: bool | int) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, longest - x.shape[1]), value=value)

    states = [o.state for o in observations]
    same = all(s is not None for s in states) and len({tuple(s.shape) for s in states}) == 1
    return Observation(
        images=torch.cat([o.images for o in observations]),
        image_masks=torch.cat([o.image_masks for o in observations]),
        tokens=torch.cat([pad(o.tokens, 0) for o in observations]),
        token_mask=torch.cat([pad(o.token_mask, False) for o in observations]),
        state=torch.cat(states) if same else None,
    )
