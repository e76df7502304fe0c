"""Static-shape steps compiled ahead of time: ``torch.export`` of a step, an AOTInductor package, a loaded runner.

A step (``graphs.py``) is a function of explicit tensors that reads its weights from the model. Exported, it takes
the weights (:class:`~.step_weights.StepWeights`, bound to the exporter's inputs) and then its own arguments, and
writes its state arguments in place (export records the mutation, the package performs it on the caller's
tensors). Nothing else may be read: a tensor the exporter would bake in as a constant (a weight reached some other
way) fails the export, so a package never carries one checkpoint's numbers into another's. Packed oneDNN weights
(``packed_linear``) are not used inside an export: a package computes ``F.linear`` and Inductor plans the kernel.
The cache directory and its keys are ``compiled_store.py``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from .compiled_store import CompiledStore, Entry, full_key
from .step_weights import StepWeights


class _Exported(nn.Module):
    """``fn`` as a module of (weights..., args...) for ``torch.export``."""

    def __init__(self, fn: Callable, weights: StepWeights, num_weights: int) -> None:
        super().__init__()
        self.fn, self.weights, self.num_weights = fn, weights, num_weights

    def forward(self, *flat: torch.Tensor):
        with self.weights.bind(flat[:self.num_weights]):
            return self.fn(*flat[self.num_weights:])


def signature(names: Sequence[str], tensors: Sequence[torch.Tensor]) -> list[list]:
    """Name, shape, stride, storage offset and dtype of each input: part of a compiled step's key."""
    return [[n, list(t.shape), list(t.stride()), t.storage_offset(), str(t.dtype)]
            for n, t in zip(names, tensors, strict=True)]


def step_key(spec: dict, weights: StepWeights, args: Sequence[torch.Tensor], options: dict) -> dict:
    """The cache key of a step: its ``spec``, its inputs' signature, the Inductor options and :func:`full_key`'s."""
    arg_names = [f"arg{i}" for i in range(len(args))]
    return full_key({**spec, "device": args[0].device.type,
                     "inputs": signature([*weights.names(), *arg_names], [*weights.tensors(), *args]),
                     "options": dict(sorted(options.items()))})


def export_step(fn: Callable, weights: StepWeights, args: Sequence[torch.Tensor]) -> torch.export.ExportedProgram:
    """``fn(*args)`` exported with the weights as leading inputs. Raises ``RuntimeError`` when the step reads a
    tensor that is neither a weight nor an argument (it would be baked into the package)."""
    w = weights.tensors()
    with torch.no_grad():
        ep = torch.export.export(_Exported(fn, weights, len(w)), (*w, *args), strict=False)
    if ep.constants:
        found = ", ".join(f"{k} {tuple(v.shape)}" for k, v in list(ep.constants.items())[:8])
        raise RuntimeError(f"a step reads tensors that are neither its weights nor its arguments: {found}")
    return ep


def build_package(fn: Callable, weights: StepWeights, args: Sequence[torch.Tensor], path: Path,
                  options: dict) -> None:
    """Export ``fn`` and compile it into an AOTInductor package at ``path``."""
    ep = export_step(fn, weights, args)
    torch._inductor.aoti_compile_and_package(ep, package_path=str(path), inductor_configs=dict(options))


class LoadedStep:
    """A compiled package bound to its live inputs (the weights, then the step's persistent arguments): ``step()``
    runs it and returns its output (a tuple when the step returns several)."""

    def __init__(self, path: Path, inputs: list[torch.Tensor], tuple_out: bool) -> None:
        self.package = torch._inductor.aoti_load_package(str(path))
        self.runner = self.package.loader
        self.inputs, self.tuple_out = inputs, tuple_out

    def __call__(self):
        out = self.runner.run(self.inputs)
        return tuple(out) if self.tuple_out else out[0]


def load_or_build(store: CompiledStore, name: str, spec: dict, fn: Callable, weights: StepWeights,
                  args: Sequence[torch.Tensor], tuple_out: bool, options: dict | None = None) -> Entry:
    """The step ``fn(*args)`` from ``store`` (built there first when absent, stale or corrupt), bound to the live
    weights and ``args``."""
    options = dict(options or {})
    key = step_key(spec, weights, args, options)
    inputs = [*weights.tensors(), *args]
    return store.get(name, key, lambda path: build_package(fn, weights, args, path, options),
                     lambda path: LoadedStep(path, inputs, tuple_out))
