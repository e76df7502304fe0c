"""Camera images to model input, with each framework's resize convention and missing-camera rule.

openpi (``openpi_client.image_tools.resize_with_pad``): the uint8 image is resized with PIL bilinear (antialiased
when shrinking) to fit, pasted on black at offset ``int((S - size) / 2)``, then ``x / 255 * 2 - 1``.
LeRobot (``resize_with_pad_torch``): ``x / 255`` in float32, ``F.interpolate(bilinear, align_corners=False)``
without antialias, ``clamp(0, 1)``, centred padding with 0 (remainder bottom/right), then ``x * 2 - 1``.
Both skip the resize when the image already has the model size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

__all__ = ["as_hwc_uint8", "assemble_slots", "image_to_model", "pixels_to_model"]


def as_hwc_uint8(image: np.ndarray, name: str = "image", keep_float: bool = False) -> np.ndarray:
    """An RGB image as uint8 [H, W, 3]: CHW is transposed, float images in [0, 1] are scaled to uint8 (openpi's
    rule), or kept as float32 with ``keep_float`` (LeRobot feeds float images to its resize unquantised).

    Raises:
        ValueError: not an RGB image.
    """
    img = np.asarray(image)
    if img.ndim == 3 and img.shape[0] == 3 and img.shape[-1] != 3:
        img = img.transpose(1, 2, 0)
    if img.ndim != 3 or img.shape[-1] != 3 or 0 in img.shape:
        raise ValueError(f"{name}: expected an RGB image [H, W, 3] or [3, H, W], got shape {img.shape}")
    if np.issubdtype(img.dtype, np.floating):
        if not np.all(np.isfinite(img)):
            raise ValueError(f"{name}: image contains NaN or Inf")
        img = img.astype(np.float32) if keep_float else (255 * img).astype(np.uint8)
    elif img.dtype != np.uint8:
        raise ValueError(f"{name}: expected uint8 or float pixels, got {img.dtype}")
    return np.ascontiguousarray(img)


def _pil_resize_with_pad(img: np.ndarray, size: int) -> np.ndarray:
    h, w = img.shape[:2]
    if (h, w) == (size, size):
        return img
    ratio = max(w / size, h / size)
    rh, rw = int(h / ratio), int(w / ratio)
    resized = Image.fromarray(img).resize((rw, rh), resample=Image.BILINEAR)
    canvas = Image.new(resized.mode, (size, size), 0)
    canvas.paste(resized, (max(0, int((size - rw) / 2)), max(0, int((size - rh) / 2))))
    return np.asarray(canvas)


def _torch_resize_with_pad(x: torch.Tensor, size: int) -> torch.Tensor:
    """float [1, 3, H, W] in [0, 1] -> [1, 3, size, size]."""
    h, w = x.shape[-2:]
    if (h, w) == (size, size):
        return x
    ratio = max(w / size, h / size)
    rh, rw = int(h / ratio), int(w / ratio)
    x = F.interpolate(x, size=(rh, rw), mode="bilinear", align_corners=False).clamp(0.0, 1.0)
    top, rem_h = divmod(size - rh, 2)
    left, rem_w = divmod(size - rw, 2)
    return F.pad(x, (left, left + rem_w, top, top + rem_h), mode="constant", value=0.0)


def pixels_to_model(images: np.ndarray) -> torch.Tensor:
    """uint8 [..., H, W, 3] -> float32 [..., 3, H, W] in [-1, 1]: openpi's ``x / 255 * 2 - 1`` (also what the toy
    models are trained on)."""
    x = torch.from_numpy(np.array(images, copy=True)).to(torch.float32) / 255.0 * 2.0 - 1.0
    return x.movedim(-1, -3).contiguous()


def image_to_model(image: np.ndarray, size: int, resize: str) -> np.ndarray:
    """RGB [H, W, 3] (uint8; float32 in [0, 1] for torch_bilinear) -> float32 [3, size, size] in [-1, 1] per the
    ``resize`` convention.

    Raises:
        ValueError: an image so elongated that one side would shrink to 0 pixels.
    """
    h, w = image.shape[:2]
    ratio = max(w / size, h / size)
    if int(h / ratio) < 1 or int(w / ratio) < 1:
        raise ValueError(f"image of {w}x{h} pixels cannot be fitted into {size}x{size} (a side would be 0 pixels)")
    if resize == "pil_bilinear":
        return pixels_to_model(_pil_resize_with_pad(image, size)).numpy()
    if resize == "torch_bilinear":
        x = torch.from_numpy(np.array(image, copy=True))
        x = x.to(torch.float32) / 255 if x.dtype == torch.uint8 else x.to(torch.float32)
        x = _torch_resize_with_pad(x.permute(2, 0, 1)[None], size)
        return (x * 2.0 - 1.0)[0].contiguous().numpy()
    raise ValueError(f"unknown image resize convention {resize!r}")


def assemble_slots(images: Mapping[str, np.ndarray], slots: Sequence[str], size: int,
                   missing: str) -> tuple[np.ndarray, np.ndarray]:
    """Model images float32 [C, 3, S, S] and masks bool [C] from already converted images by slot name.

    ``missing`` in_place: an absent slot is a -1 image, masked, in its place (openpi); append: the present slots
    in order, then one -1 placeholder per absent slot, masked (LeRobot).

    Raises:
        ValueError: no camera at all, or an image for a slot the model does not have.
    """
    unknown = sorted(set(images) - set(slots))
    if unknown:
        raise ValueError(f"images for unknown camera slot(s) {unknown}; the model's slots are {list(slots)}")
    if not images:
        raise ValueError(f"no camera image at all (the model's slots are {list(slots)})")
    pixels = np.full((len(slots), 3, size, size), -1.0, dtype=np.float32)
    masks = np.zeros(len(slots), dtype=bool)
    order = [s for s in slots if s in images] if missing == "append" else list(slots)
    for i, slot in enumerate(order):
        if slot in images:
            pixels[i] = images[slot]
            masks[i] = True
    return pixels, masks
