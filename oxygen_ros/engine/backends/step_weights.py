"""The weights a static-shape step reads, as one flat list of named tensors, and a way to make the step read others.

A step (``graphs.py``) reads its weights from the model: module parameters (the vision tower, the embeddings, the
action projections) and the fused matrices of its Gemma stacks (``fusion.py``; the stacks' own layer parameters are
views into those and are not read). Exported with ``torch.export``, a step must take them as inputs rather than bake
them in: :meth:`StepWeights.bind` points every one of them at given tensors (the exporter's traced inputs) for the
duration of a call, and :meth:`StepWeights.tensors` lists the live ones in the same order (what a loaded step is
called with). A compiled step is then a function of shapes only: one package serves every checkpoint of a size.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch
from torch import nn

from ..layers import GemmaStack
from .fusion import fused_stack

# (holder, attribute) of one place a weight is read from: a module's _parameters / _buffers dict, or a fused object
_Slot = tuple[object, str, str]  # (holder, "param" | "buffer" | "attr", name)


class StepWeights:
    """The weights of ``modules`` (by name prefix) and the fused matrices of ``stacks``, in a fixed order."""

    def __init__(self, modules: Mapping[str, nn.Module], stacks: Sequence[GemmaStack]) -> None:
        self.modules, self.stacks = dict(modules), list(stacks)

    def _entries(self) -> list[tuple[str, torch.Tensor, list[_Slot]]]:
        # the layers' parameters are views into the fused matrices (the final norm's are read through its module)
        fused_params = {id(p) for s in self.stacks for p in s.layers.parameters()}
        entries: dict[int, tuple[str, torch.Tensor, list[_Slot]]] = {}

        def add(name: str, t: torch.Tensor, slot: _Slot) -> None:
            if id(t) not in entries:
                entries[id(t)] = (name, t, [])
            entries[id(t)][2].append(slot)

        for prefix, root in self.modules.items():
            for mod_name, mod in root.named_modules(prefix=prefix):
                for kind, store in (("param", mod._parameters), ("buffer", mod._buffers)):
                    for name, t in store.items():
                        if t is not None and id(t) not in fused_params:
                            add(f"{mod_name}.{name}", t, (mod, kind, name))
        for i, stack in enumerate(self.stacks):
            fs = fused_stack(stack)
            for part in ("qkv", "gate_up", "o", "down"):
                for j, f in enumerate(getattr(fs, part)):
                    for attr in ("weight", "bias"):
                        t = getattr(f, attr)
                        if t is not None:
                            add(f"stack{i}.{part}.{j}.{attr}", t, (f, "attr", attr))
            if fs.norm_weight is not None:
                add(f"stack{i}.norm_weight", fs.norm_weight, (fs, "attr", "norm_weight"))
        return list(entries.values())

    def names(self) -> list[str]:
        """The weights' names, in call order."""
        return [name for name, _, _ in self._entries()]

    def tensors(self) -> list[torch.Tensor]:
        """The live weights, in call order (take them again after fusing or packing anew)."""
        return [t for _, t, _ in self._entries()]

    @contextmanager
    def bind(self, tensors: Sequence[torch.Tensor]) -> Iterator[None]:
        """Within the context the step reads ``tensors`` (in :meth:`tensors` order) instead of the live weights."""
        entries = self._entries()
        if len(tensors) != len(entries):
            raise ValueError(f"expected {len(entries)} weights, got {len(tensors)}")
        saved: list[tuple[_Slot, torch.Tensor]] = []
        try:
            for (_, old, slots), new in zip(entries, tensors, strict=True):
                for slot in slots:
                    saved.append((slot, old))
                    _set(slot, new)
            yield
        finally:
            for slot, old in reversed(saved):
                _set(slot, old)


def _set(slot: _Slot, t: torch.Tensor) -> None:
    holder, kind, name = slot
    if kind == "param":
        holder._parameters[name] = t
    elif kind == "buffer":
        holder._buffers[name] = t
    else:
        setattr(holder, name, t)

