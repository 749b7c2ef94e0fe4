"""The value trainer's intake: a bounded, never-blocking ingest queue and a rollout-granular replay buffer.

The value trainer must never hold anyone up (DESIGN.md §1): when it falls behind, ``IngestQueue`` drops
the OLDEST rollouts and counts them, instead of blocking the reader that feeds it. ``ReplayBuffer`` holds
whole rollouts (any object), samples critic batches on the trainer's own schedule and retires a rollout
after ``max_reuse`` uses or when newer rollouts push it out.
"""

from __future__ import annotations

import random
import threading
from collections import deque
from typing import Any

SAMPLING_RULES = ("uniform", "fifo", "recent")


class IngestQueue:
    """Thread-safe bounded FIFO whose ``put`` never blocks: when full, the oldest item is dropped."""

    def __init__(self, maxsize: int):
        if maxsize < 1:
            raise ValueError(
                f"ingest queue size must be >= 1, got {maxsize}; set replay.queue_size to a positive count"
            )
        self.maxsize = maxsize
        self._items: deque[Any] = deque()
        self._lock = threading.Lock()
        self.dropped = 0  # items discarded because the queue was full when a newer one arrived
        self.put_count = 0  # items ever put

    def put(self, item: Any) -> None:
        with self._lock:
            if len(self._items) >= self.maxsize:
                self._items.popleft()
                self.dropped += 1
            self._items.append(item)
            self.put_count += 1

    def drain(self, max_items: int | None = None) -> list[Any]:
        """Take up to ``max_items`` (all if None) in FIFO order, without waiting."""
        with self._lock:
            count = len(self._items) if max_items is None else min(max_items, len(self._items))
            return [self._items.popleft() for _ in range(count)]

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


class _Entry:
    __slots__ = ("item", "uses")

    def __init__(self, item: Any):
        self.item = item
        self.uses = 0


class ReplayBuffer:
    """Rollout-granular replay buffer (not thread-safe: the value trainer's loop owns it).

    Args:
        capacity: most rollouts held; adding beyond it evicts the oldest.
        max_reuse: a rollout is evicted once it has been sampled this many times; <= 0 means unlimited.
        sampling: "uniform" (without replacement within one ``sample`` call), "fifo" (oldest first) or
            "recent" (newest first).
        seed: seeds the uniform sampler; the same seed and calls give the same samples.
    """

    def __init__(self, capacity: int, max_reuse: int, sampling: str = "uniform", seed: int = 0):
        if sampling not in SAMPLING_RULES:
            raise ValueError(
                f"replay sampling {sampling!r} is unknown; set replay.sampling to one of {', '.join(SAMPLING_RULES)}"
            )
        if capacity < 1:
            raise ValueError(f"replay capacity must be >= 1, got {capacity}; set replay.capacity to a positive count")
        self.capacity = capacity
        self.max_reuse = max_reuse
        self.sampling = sampling
        self._rng = random.Random(seed)
        self._entries: list[_Entry] = []  # oldest first
        self.added = 0
        self.sampled = 0
        self.evicted_capacity = 0
        self.evicted_reuse = 0
        self._evicted_uses = 0  # total use count of every evicted rollout, for mean_reuse_of_evicted

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, item: Any) -> None:
        self._entries.append(_Entry(item))
        self.added += 1
        while len(self._entries) > self.capacity:
            self._evicted_uses += self._entries.pop(0).uses
            self.evicted_capacity += 1

    def sample(self, n: int) -> list[Any]:
        """Up to ``n`` distinct rollouts (capped at ``len``); each use counts toward ``max_reuse``."""
        n = max(0, min(n, len(self._entries)))
        if self.sampling == "uniform":
            picks = self._rng.sample(range(len(self._entries)), n)
        elif self.sampling == "fifo":
            picks = list(range(n))
        else:  # "recent"
            picks = list(range(len(self._entries) - 1, len(self._entries) - 1 - n, -1))
        chosen = [self._entries[i] for i in picks]
        for entry in chosen:
            entry.uses += 1
        self.sampled += n
        if self.max_reuse > 0:
            kept = []
            for entry in self._entries:
                if entry.uses >= self.max_reuse:
                    self._evicted_uses += entry.uses
                    self.evicted_reuse += 1
                else:
                    kept.append(entry)
            self._entries = kept
        return [entry.item for entry in chosen]

    def stats(self) -> dict[str, float]:
        """Counters for metrics; ``mean_reuse_of_evicted`` is 0.0 until something has been evicted."""
        evicted = self.evicted_capacity + self.evicted_reuse
        return {
            "size": len(self._entries),
            "added": self.added,
            "sampled": self.sampled,
            "evicted_capacity": self.evicted_capacity,
            "evicted_reuse": self.evicted_reuse,
            "mean_reuse_of_evicted": self._evicted_uses / evicted if evicted else 0.0,
        }
