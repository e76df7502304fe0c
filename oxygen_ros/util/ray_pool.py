"""Ray for a batch of bags: joined at an address or started here (:func:`ray_session`), and a pool of actors that
runs one job per bag and reports the bags whose actor died (:func:`pool_results`). The fleet evaluation and the
dataset export share it; ``ray`` is imported only when called."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = ["pool_results", "ray_session"]


@contextlib.contextmanager
def ray_session(address: str | None, object_store_bytes: int) -> Iterator[Any]:
    """The ``ray`` module, initialised: joined at ``address``, else a local Ray (no dashboard, an object store of
    ``object_store_bytes``) unless one runs already; shut down on exit only when started here."""
    import ray

    started = not ray.is_initialized()
    if started:
        if address:
            ray.init(address=address, log_to_driver=True)
        else:
            ray.init(include_dashboard=False, object_store_memory=object_store_bytes)
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def pool_results(actors: Sequence[Any], jobs: Sequence[tuple[str, Any]], call: Callable[[Any, Any], Any],
                 failed: Callable[[str, str], dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Each job ``(bag, value)`` as ``call(actor, value)`` on the next free actor; the results (dicts naming their
    ``bag``) as they finish, then ``failed(bag, error)`` for each bag whose actor died (error: the last death's first
    line, 'unknown' if none was seen). The actors are killed at the end."""
    import ray
    from ray.exceptions import RayError
    from ray.util import ActorPool

    try:
        pool = ActorPool(list(actors))
        for _, value in jobs:
            pool.submit(call, value)
        returned: set[str] = set()
        errors: list[str] = []
        while pool.has_next():
            try:
                result = pool.get_next_unordered()
            except RayError as e:  # the actor died (crash, out of memory): its bag is reported below
                errors.append(f"{type(e).__name__}: {e}".splitlines()[0])
                continue
            returned.add(result["bag"])
            yield result
        for bag, _ in jobs:
            if bag not in returned:
                yield failed(bag, errors[-1] if errors else "unknown")
    finally:
        for a in actors:
            ray.kill(a)
