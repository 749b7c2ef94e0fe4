"""Atomic-publication functions shared by the log and the weights store (stdlib only).

Every file other roles may read is written under a hidden temporary name in the same directory,
fsync'd, renamed into place, and the directory fsync'd: after a crash a reader sees the old version or
the new one, never a torn file.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make a rename/unlink in `path` durable (the entry lives in the directory, not the file)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    """fsync every file and directory under `path` (a directory about to be renamed into place whole)."""
    for dirpath, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def io_error(e: OSError, path: Path, action: str) -> OSError:
    """One sentence naming the file and the fix, keeping the errno so callers can still branch on it."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        hint = f"free disk space on {path.parent} (or tighten log retention / weights pruning) and retry"
    else:
        hint = f"check that {path.parent} exists and is writable, then retry"
    return OSError(e.errno, f"could not {action} {path} ({e.strerror or e}); {hint}")


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data` atomically (small files: cursors, LATEST pointers, reasons)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise io_error(e, path, "write") from e
