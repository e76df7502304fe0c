"""LeRobot async inference's payloads written (:func:`dumps`): a list of :class:`~.payloads.TimedAction` for
LeRobot's ``RobotClient``, or the client's own payloads in tests. LeRobot's class names are written as globals without
importing ``lerobot``, tensors with torch's own reduction, so LeRobot's ``pickle.loads`` rebuilds its own classes."""

from __future__ import annotations

import io
import pickle
from dataclasses import fields
from typing import Any

from .payloads import NAMES, FeatureType, Payload

__all__ = ["dumps"]


class _Pickler(pickle._Pickler):  # the Python pickler: its dispatch can write LeRobot's globals by name
    dispatch = dict(pickle._Pickler.dispatch)

    def _save_payload(self, obj: Payload | FeatureType) -> None:
        module, name = NAMES[type(obj)]
        if self.proto >= 4:
            self.save(module)
            self.save(name)
            self.write(pickle.STACK_GLOBAL)
        else:
            self.write(pickle.GLOBAL + f"{module}\n{name}\n".encode())
        if isinstance(obj, FeatureType):
            self.save((obj.value,))
            self.write(pickle.REDUCE)
            self.memoize(obj)
            return
        self.save(())
        self.write(pickle.NEWOBJ)
        self.memoize(obj)
        self.save({f.name: getattr(obj, f.name) for f in fields(obj)})  # type: ignore[arg-type]
        self.write(pickle.BUILD)

    for _cls in NAMES:
        dispatch[_cls] = _save_payload


def dumps(obj: Any, protocol: int = 4) -> bytes:
    """``obj`` (LeRobot payloads of this module's classes, containers, numpy arrays, torch tensors) as the pickle
    LeRobot's ``pickle.loads`` rebuilds with its own classes (protocol 4: LeRobot's ``pickle.dumps`` on Python
    3.12 / 3.13; 2 to 5 accepted)."""
    if not 2 <= protocol <= 5:
        raise ValueError(f"protocol {protocol}: 2 to 5")
    f = io.BytesIO()
    _Pickler(f, protocol=protocol).dump(obj)
    return f.getvalue()
