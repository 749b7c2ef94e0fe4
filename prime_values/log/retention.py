"""Bounded disk: delete segments every consumer has passed (docs/design.md §2)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from .segments import list_seqs, load_cursor, segment_name

log = logging.getLogger(__name__)


def apply_retention(stream_dir: Path, cursor_dir: Path, consumers: list[str],
                    keep_last: int | None, max_age_s: float | None) -> int:
    """Delete segments of every shard of `stream_dir` that all `consumers` have passed and that are
    beyond the newest `keep_last` of their shard or older than `max_age_s` (mtime). Returns the count.

    A consumer without a cursor file has passed nothing (with an empty `consumers` list, everything
    is passed). `None` disables a rule; both None deletes nothing. The newest segment of each shard
    is always kept: it anchors the seq a restarted writer continues from, so cursors stay valid.
    """
    if keep_last is None and max_age_s is None:
        return 0
    assert keep_last is None or keep_last >= 0, f"keep_last must be >= 0, got {keep_last}"
    stream_dir = Path(stream_dir)
    cursors = [load_cursor(Path(cursor_dir) / f"{c}.json").get(stream_dir.name, {}) for c in consumers]
    now, deleted = time.time(), 0
    shards = [p for p in stream_dir.iterdir() if p.is_dir() and not p.name.startswith(".")] if stream_dir.is_dir() \
        else []
    for shard_dir in shards:
        seqs = list_seqs(shard_dir)
        passed = min((c.get(shard_dir.name, 0) for c in cursors), default=float("inf"))
        n_old = len(seqs) - max(keep_last or 0, 1)  # seqs[:n_old] are beyond the newest keep_last (and not the newest)
        for i, seq in enumerate(seqs[:-1]):
            if seq >= passed:
                break
            path = shard_dir / segment_name(seq)
            try:
                too_many = keep_last is not None and i < n_old
                too_old = max_age_s is not None and now - path.stat().st_mtime > max_age_s
                if too_many or too_old:
                    path.unlink()
                    deleted += 1
            except FileNotFoundError:  # quarantined meanwhile
                continue
    if deleted:
        log.info("retention deleted %d segments from %s", deleted, stream_dir)
    return deleted
