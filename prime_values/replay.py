"""The value trainer's intake: a bounded, never-blocking ingest queue and a rollout-granular replay buffer.

Rules (the value trainer's loop owns the buffer; only ``IngestQueue`` is thread-safe):

* **Ingest queue.** ``IngestQueue(maxsize)`` is a FIFO whose ``put`` never blocks: when it already holds
  ``maxsize`` items, the OLDEST is dropped and counted in ``dropped``. The value trainer must never hold anyone
  up (docs/design.md §1).
* **Identity.** A rollout is keyed by ``row["rollout_id"]`` when it is a mapping, otherwise by the item
  itself; keys must be ``str`` or ``int`` to survive a snapshot. Adding a rollout whose key is already held
  does nothing except count it in ``duplicates``.
* **Capacity.** The buffer holds at most ``capacity`` rollouts; adding one more evicts the oldest held
  (insertion order), counted as a ``capacity`` eviction.
* **Max reuse.** Every time a rollout is put in a sampled batch its use count grows by 1; once it reaches
  ``max_reuse`` the rollout is evicted right after that batch is drawn (a ``reuse`` eviction).
  ``max_reuse <= 0`` means unlimited.
* **Max age.** ``newest`` is the largest policy version seen: the largest ``row["policy_version"]`` ever added,
  or a larger one passed to ``set_policy_version`` (it never goes down). A rollout's age is
  ``newest - row["policy_version"]``; a rollout with ``age > max_age`` is evicted at once (an ``age`` eviction),
  so ``age == max_age`` is still sampled and ``age == max_age + 1`` never is. ``max_age = 0`` means unlimited.
  Rollouts without a policy version (non-mapping items) are never evicted for age and are left out of age
  statistics.
* **Sampling.** ``sample(n)`` returns ``min(n, len(buffer))`` distinct rollouts (never one twice in a batch):

  - ``uniform``: every held rollout is equally likely; draws are without replacement
    (``random.Random(seed).sample``), so each rollout is in a batch with probability ``n / len``.
  - ``fifo``: a cursor walks the held rollouts oldest to newest; a batch takes the next ``n`` after the cursor,
    wrapping to the oldest held when it passes the newest (a new pass), and leaves the cursor on its last pick.
    Each held rollout is therefore used once per pass; rollouts added mid-pass join the current pass.
  - ``recent``: recency-weighted. Rank the held rollouts by insertion, newest ``rank = 0``; a rollout's weight is
    ``w = 2 ** (-rank / recent_half_life)`` (the weight halves every ``recent_half_life`` rollouts back). A batch
    is drawn one rollout at a time, each with probability ``w / sum(w of those not yet in the batch)``.
    ``recent_half_life = 0`` is the limit: strictly newest first.
* **Restart.** ``snapshot()`` is a JSON-able record of the buffer (held rollout keys in order with their use
  counts, the newest policy version, the fifo cursor, the sampler's RNG state and the counters), small enough to
  persist atomically next to every critic version (``dump_snapshot`` / ``load_snapshot`` turn it into bytes and
  back; the caller owns the file). After a crash, a freshly constructed buffer's ``rebuild(rows, snapshot)``
  reads the log tail: rows held at the snapshot come back with their use counts, rows logged after the
  snapshot's last added rollout are added fresh through ``add``, everything else (evicted, or dropped by the
  queue, before the snapshot) is skipped, and then capacity, max reuse and max age are applied with the
  current settings. With the same settings, the rebuilt buffer equals the one at the crash, except that uses
  from samples drawn after the snapshot are forgotten, and rows logged after the snapshot's last added rollout
  that the buffer never held (dropped by the queue, or still queued at the crash) are added too. The log tail
  must still hold the rows the buffer held (log retention may delete them); ``rebuild`` counts those it cannot
  find as ``missing``.
"""

from __future__ import annotations

import json
import math
import random
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

SAMPLING_RULES = ("uniform", "fifo", "recent")
EVICTION_CAUSES = ("capacity", "reuse", "age")
SNAPSHOT_FORMAT = 1


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


def rollout_key(item: Any) -> Any:
    """``item["rollout_id"]`` for a row (mapping), else the item itself."""
    return item["rollout_id"] if isinstance(item, Mapping) else item


def _policy_version(item: Any) -> int | None:
    return item.get("policy_version") if isinstance(item, Mapping) else None


def dump_snapshot(snapshot: dict) -> bytes:
    """``ReplayBuffer.snapshot()`` as UTF-8 JSON bytes, for the caller to write atomically."""
    return json.dumps(snapshot, separators=(",", ":")).encode()


def load_snapshot(data: bytes | str) -> dict:
    """Inverse of ``dump_snapshot``; rejects a snapshot of another format."""
    snapshot = json.loads(data)
    if snapshot.get("format") != SNAPSHOT_FORMAT:
        raise ValueError(f"replay snapshot format {snapshot.get('format')!r} is not {SNAPSHOT_FORMAT}; rebuild "
                         "without a snapshot (rebuild(rows, None)) to start the buffer afresh from the log tail")
    return snapshot


class _Entry:
    __slots__ = ("item", "key", "version", "seq", "uses")

    def __init__(self, item: Any, seq: int, uses: int = 0):
        self.item, self.key, self.version = item, rollout_key(item), _policy_version(item)
        self.seq = seq  # insertion number; orders entries and places the fifo cursor
        self.uses = uses


class ReplayBuffer:
    """Rollout-granular replay buffer (not thread-safe: the value trainer's loop owns it).

    The rules are in this module's docstring.

    Args:
        capacity: most rollouts held; adding beyond it evicts the oldest.
        max_reuse: a rollout is evicted once it has been sampled this many times; <= 0 means unlimited.
        sampling: "uniform", "fifo" or "recent".
        seed: seeds the sampler; the same seed and calls give the same samples.
        max_age: evict rollouts more than this many policy versions behind the newest; 0 means unlimited.
        recent_half_life: for "recent", the weight halves every this many rollouts back; 0 = newest first.
    """

    def __init__(self, capacity: int, max_reuse: int, sampling: str = "uniform", seed: int = 0, *,
                 max_age: int = 0, recent_half_life: float = 256.0):
        if sampling not in SAMPLING_RULES:
            raise ValueError(
                f"replay sampling {sampling!r} is unknown; set replay.sampling to one of {', '.join(SAMPLING_RULES)}"
            )
        if capacity < 1:
            raise ValueError(f"replay capacity must be >= 1, got {capacity}; set replay.capacity to a positive count")
        if max_age < 0:
            raise ValueError(f"replay max_age must be >= 0 (0 = unlimited), got {max_age}; set replay.max_age")
        if recent_half_life < 0:
            raise ValueError(f"replay recent_half_life must be >= 0, got {recent_half_life}; "
                             "set replay.recent_half_life")
        self.capacity = capacity
        self.max_reuse = max_reuse
        self.sampling = sampling
        self.max_age = max_age
        self.recent_half_life = recent_half_life
        self._rng = random.Random(seed)
        self._entries: list[_Entry] = []  # oldest first
        self._keys: set[Any] = set()
        self._seq = 0
        self._fifo_cursor = 0  # seq of the last rollout fifo served; 0 = before the oldest
        self._last_added: Any = None
        self.newest_policy_version: int | None = None
        self.added = 0
        self.duplicates = 0
        self.sampled = 0
        self.evictions = dict.fromkeys(EVICTION_CAUSES, 0)
        self._evicted_uses = 0  # total use count of every evicted rollout, for mean_reuse_of_evicted

    def __len__(self) -> int:
        return len(self._entries)

    # -- adding and evicting ------------------------------------------------------------------------------------

    def add(self, item: Any) -> None:
        """Hold ``item`` as the newest rollout, then apply max age and capacity."""
        if rollout_key(item) in self._keys:
            self.duplicates += 1
            return
        self.added += 1
        self._last_added = rollout_key(item)
        self._insert(_Entry(item, self._next_seq()))
        version = _policy_version(item)
        if version is not None and (self.newest_policy_version is None or version > self.newest_policy_version):
            self.newest_policy_version = version
            self._evict_stale()
        elif self._too_old(self._entries[-1]):
            self._evict_stale()
        self._evict_over_capacity()

    def set_policy_version(self, version: int) -> None:
        """Tell the buffer the newest policy version (ignored if not newer) and evict what became too old."""
        if self.newest_policy_version is None or version > self.newest_policy_version:
            self.newest_policy_version = version
            self._evict_stale()

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _insert(self, entry: _Entry) -> None:
        self._entries.append(entry)
        self._keys.add(entry.key)

    def _too_old(self, entry: _Entry) -> bool:
        return bool(self.max_age) and entry.version is not None and \
            self.newest_policy_version - entry.version > self.max_age

    def _evict(self, entry: _Entry, cause: str) -> None:
        self._keys.discard(entry.key)
        self.evictions[cause] += 1
        self._evicted_uses += entry.uses

    def _evict_where(self, doomed, cause: str) -> None:
        kept = []
        for entry in self._entries:
            if doomed(entry):
                self._evict(entry, cause)
            else:
                kept.append(entry)
        self._entries = kept

    def _evict_stale(self) -> None:
        if self.max_age:
            self._evict_where(self._too_old, "age")

    def _evict_over_capacity(self) -> None:
        excess = len(self._entries) - self.capacity
        if excess > 0:
            for entry in self._entries[:excess]:
                self._evict(entry, "capacity")
            del self._entries[:excess]

    def _evict_used_up(self) -> None:
        if self.max_reuse > 0:
            self._evict_where(lambda entry: entry.uses >= self.max_reuse, "reuse")

    # -- sampling -----------------------------------------------------------------------------------------------

    def sample(self, n: int) -> list[Any]:
        """Up to ``n`` distinct rollouts (capped at ``len``); each use counts toward ``max_reuse``."""
        n = max(0, min(n, len(self._entries)))
        if self.sampling == "uniform":
            picks = self._rng.sample(range(len(self._entries)), n)
        elif self.sampling == "fifo":
            picks = self._fifo_picks(n)
        else:
            picks = self._recent_picks(n)
        chosen = [self._entries[i] for i in picks]
        for entry in chosen:
            entry.uses += 1
        self.sampled += n
        self._evict_used_up()
        return [entry.item for entry in chosen]

    def _fifo_picks(self, n: int) -> list[int]:
        size = len(self._entries)
        start = next((i for i, entry in enumerate(self._entries) if entry.seq > self._fifo_cursor), 0)
        picks = [(start + k) % size for k in range(n)]
        if picks:
            self._fifo_cursor = self._entries[picks[-1]].seq
        return picks

    def _recent_picks(self, n: int) -> list[int]:
        size = len(self._entries)
        if self.recent_half_life == 0:
            return list(range(size - 1, size - 1 - n, -1))
        # Exponential race: entry i finishes at E_i / w_i with E_i ~ Exp(1); the n first finishers are exactly
        # n successive draws without replacement, each with probability proportional to w. Compared in logs,
        # log(E_i / w_i) = log(E_i) + rank * ln2 / half_life, so tiny weights never underflow.
        keys = []
        for i in range(size):
            rank = size - 1 - i
            e = self._rng.expovariate(1.0)
            keys.append((math.log(e) if e > 0 else -math.inf) + rank * math.log(2) / self.recent_half_life)
        return sorted(range(size), key=keys.__getitem__)[:n]

    # -- restart ------------------------------------------------------------------------------------------------

    def reuse_counts(self) -> dict[Any, int]:
        """Use count of every held rollout, keyed by rollout key, oldest first."""
        return {entry.key: entry.uses for entry in self._entries}

    def snapshot(self) -> dict:
        """A JSON-able record of the buffer for ``rebuild``; persist it (``dump_snapshot``) with each critic."""
        version, state, gauss = self._rng.getstate()
        return {
            "format": SNAPSHOT_FORMAT,
            "held": [[entry.key, entry.uses] for entry in self._entries],  # oldest first
            "last_added": self._last_added,
            "fifo_served": sum(entry.seq <= self._fifo_cursor for entry in self._entries),
            "newest_policy_version": self.newest_policy_version,
            "counters": {"added": self.added, "duplicates": self.duplicates, "sampled": self.sampled,
                         "evicted_uses": self._evicted_uses, **self.evictions},
            "rng": [version, list(state), gauss],
        }

    def rebuild(self, rows: Iterable[Any], snapshot: dict | None) -> dict[str, int]:
        """Refill a freshly constructed buffer from the log tail after a restart.

        ``rows`` is the log tail in log order, from at or before the oldest rollout held at the snapshot up to
        the ingest cursor. Rows held at the snapshot return with their use counts and the snapshot's counters,
        fifo cursor, RNG state and newest policy version are restored; rows after the last occurrence of the
        snapshot's last added rollout (all rows if it is not in ``rows``) are added fresh with ``add``; the
        rest were evicted or dropped before the snapshot and are skipped. Then capacity, max reuse and max age
        are applied. Without a snapshot every row is added fresh. Returns how many rows were ``restored``,
        added ``fresh`` and ``skipped``, and how many held rollouts were ``missing`` from ``rows``.
        """
        if self.added or self._entries:
            raise ValueError("rebuild needs a freshly constructed ReplayBuffer")
        rows = list(rows)
        if snapshot is None:
            for row in rows:
                self.add(row)
            return {"restored": 0, "fresh": len(rows), "skipped": 0, "missing": 0}
        held = {key: uses for key, uses in snapshot["held"]}
        last = max((i for i, row in enumerate(rows) if rollout_key(row) == snapshot["last_added"]), default=-1)
        by_key = {rollout_key(row): row for row in rows if rollout_key(row) in held}
        fresh = [row for row in rows[last + 1:] if rollout_key(row) not in held]

        counters = snapshot["counters"]
        self.added, self.duplicates, self.sampled = counters["added"], counters["duplicates"], counters["sampled"]
        self._evicted_uses = counters["evicted_uses"]
        self.evictions = {cause: counters[cause] for cause in EVICTION_CAUSES}
        self.newest_policy_version = snapshot["newest_policy_version"]
        self._last_added = snapshot["last_added"]
        version, state, gauss = snapshot["rng"]
        self._rng.setstate((version, tuple(state), gauss))
        for position, (key, uses) in enumerate(snapshot["held"]):
            if key in by_key:
                self._insert(_Entry(by_key[key], self._next_seq(), uses))
                if position < snapshot["fifo_served"]:
                    self._fifo_cursor = self._seq
        self._evict_stale()
        self._evict_used_up()
        self._evict_over_capacity()
        for row in fresh:
            self.add(row)
        return {"restored": len(by_key), "fresh": len(fresh), "skipped": len(rows) - len(by_key) - len(fresh),
                "missing": len(held) - len(by_key)}

    # -- metrics ------------------------------------------------------------------------------------------------

    def stats(self) -> dict[str, float]:
        """Flat numbers for critic-health metrics.

        ``size``/``capacity``; ``added``, ``duplicates`` and ``sampled`` (rollout draws) since the start;
        ``evicted_capacity``/``evicted_reuse``/``evicted_age`` by cause and ``mean_reuse_of_evicted`` (0.0 until
        something was evicted); ``newest_policy_version`` (-1 until one is known); ``age_mean``/``age_max`` of
        the held rollouts in policy versions behind the newest; ``reuse_mean``/``reuse_max`` and the histogram
        ``reuse_0``/``reuse_1``/``reuse_2``/``reuse_3plus`` (held rollouts by use count). Means are 0.0 when
        empty.
        """
        evicted = sum(self.evictions.values())
        ages = [self.newest_policy_version - e.version for e in self._entries if e.version is not None]
        uses = [entry.uses for entry in self._entries]
        return {
            "size": len(self._entries),
            "capacity": self.capacity,
            "added": self.added,
            "duplicates": self.duplicates,
            "sampled": self.sampled,
            **{f"evicted_{cause}": count for cause, count in self.evictions.items()},
            "mean_reuse_of_evicted": self._evicted_uses / evicted if evicted else 0.0,
            "newest_policy_version": -1 if self.newest_policy_version is None else self.newest_policy_version,
            "age_mean": sum(ages) / len(ages) if ages else 0.0,
            "age_max": max(ages, default=0),
            "reuse_mean": sum(uses) / len(uses) if uses else 0.0,
            "reuse_max": max(uses, default=0),
            "reuse_0": uses.count(0),
            "reuse_1": uses.count(1),
            "reuse_2": uses.count(2),
            "reuse_3plus": sum(u >= 3 for u in uses),
        }
