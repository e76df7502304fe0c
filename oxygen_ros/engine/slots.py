"""Slot allocation for the KV pool: a slot is one sequence of the preallocated ``KVCache``."""

from __future__ import annotations

import heapq


class SlotAllocator:
    """Free list of cache slots; always hands out the lowest free slot so live slots stay packed."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = num_slots
        self._free = list(range(num_slots))
        heapq.heapify(self._free)

    def alloc(self) -> int:
        """The lowest free slot (``RuntimeError`` when none is free)."""
        if not self._free:
            raise RuntimeError("KV pool exhausted (admission control should prevent this)")
        return heapq.heappop(self._free)

    def free(self, slot: int) -> None:
        """Return ``slot`` to the pool."""
        heapq.heappush(self._free, slot)

    @property
    def num_free(self) -> int:
        """Slots not held by anyone."""
        return len(self._free)
