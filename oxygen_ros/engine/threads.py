"""One OpenMP team per process: heavy torch work off the inference thread runs in a thread that then ends.

libgomp gives every thread that starts a parallel region a team of its own, alive as long as that thread. With two
live teams on a small CPU (a loading thread and an inference thread: 4 threads on 2 cores), libgomp throttles its
spin-waiting, and every parallel region of the inference thread pays a futex wake-up. Measured on the 2-core
benchmark host, `small` at 2 threads: the 10-step denoise took 86 ms on an inference thread against 48 ms when the
thread that loaded the model had ended first (prefill 123 vs 106 ms; `tanh` or `exp` of a [10, 256] tensor 80 us vs
3 us). Loading, engine building and warm-up therefore run in :func:`run_in_scratch_thread`, whose team goes with it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def run_in_scratch_thread(fn: Callable[..., T], *args: object, name: str = "oxygen-setup", **kwargs: object) -> T:
    """``fn(*args, **kwargs)`` on a new thread that ends before this returns (its OpenMP team with it); returns its
    result or raises its exception here."""
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn(*args, **kwargs))
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            error.append(e)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]
