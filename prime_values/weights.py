"""Versioned weights: publish complete directories, adopt only complete versions (docs/design.md §2).

Layout: `<root>/<v>/` (e.g. `<run>/weights/policy/3/`) holds whatever `save(dir)` writes (safetensors,
config, tokenizer), plus `<root>/LATEST`, a text file with the newest complete version. A version dir
is built under a temp name (`.tmp-<v>-<pid>`, not parseable as a version), fsync'd, renamed into place,
and only then is LATEST atomically replaced: a reader following LATEST never sees a partial model.

No torch here: callers pass `save` / `load` callables, so the log and the trainers share one mechanism.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Callable, Generic, TypeVar

from prime_values.log.fsutil import fsync_dir, fsync_tree, io_error, write_atomic
from prime_values.rundir import process_alive

log = logging.getLogger(__name__)
T = TypeVar("T")


def version_dir(root: Path, v: int) -> Path:
    return Path(root) / str(v)


_warned: set[tuple[str, str]] = set()


def _warn_once(path: Path, text: str, message: str) -> None:
    if (str(path), text) not in _warned:
        _warned.add((str(path), text))
        log.warning(message)


def latest_version(root: Path) -> int | None:
    """Version LATEST points to; None before the first publication.

    A damaged LATEST (not a number, or naming a version directory that does not exist) is never trusted: the
    newest complete version directory stands in for it, with one warning; the next publish rewrites it."""
    path = Path(root) / "LATEST"
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    if text.isdigit() and version_dir(root, int(text)).is_dir():
        return int(text)
    have = versions(root)
    fallback = have[-1] if have else None
    _warn_once(path, text, f"{path} holds {text!r}, which names no version directory; using the newest complete "
                           f"version {fallback} instead (the next publication rewrites LATEST)")
    return fallback


def versions(root: Path) -> list[int]:
    """Complete versions on disk, ascending (temp dirs never parse as versions)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and p.is_dir())


def publish(root: Path, version: int, save: Callable[[Path], None]) -> Path:
    """Write version `version` with `save(dir)` and point LATEST at it; returns the version dir.

    Versions must increase across restarts (a consumer holding v must never be offered an older or a
    different v), so a version <= LATEST is refused.
    """
    return stage(root, version, save).finish()


def stage(root: Path, version: int, save: Callable[[Path], None]) -> "Staged":
    """The first half of `publish`: version `version` written by `save(dir)` into a temporary directory no
    consumer reads; `Staged.finish()` (which a trainer may run on another thread while it computes the next
    step: `trainer.Trainer.publish`) makes it durable and visible. The weights are read here, so the model may
    change as soon as this returns."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    current = latest_version(root)
    if current is not None and version <= current:
        raise ValueError(f"refusing to publish version {version} to {root}: LATEST is already {current} "
                         f"and versions must increase")
    for stale in [*root.glob(".tmp-*-*"), *root.glob(".del-*-*")]:  # left by a crashed publish / prune
        pid = stale.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not process_alive(int(pid)):  # a reused pid only keeps a dead writer's dir
            shutil.rmtree(stale, ignore_errors=True)
    staged = Staged(root, version)
    shutil.rmtree(staged.tmp, ignore_errors=True)
    with staged.cleanup_on_error():
        staged.tmp.mkdir()
        save(staged.tmp)
    return staged


class Staged:
    """A version in its temporary directory (`stage`); `finish()`: fsync it, rename it into place, point LATEST
    at it. A crash before the rename leaves only the temporary directory, which the next `stage` removes."""

    def __init__(self, root: Path, version: int) -> None:
        self.root, self.version = root, version
        self.final, self.tmp = version_dir(root, version), root / f".tmp-{version}-{os.getpid()}"

    @contextlib.contextmanager
    def cleanup_on_error(self):
        try:
            yield
        except OSError as e:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise io_error(e, self.final, "publish weights") from e
        except BaseException:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise

    def finish(self) -> Path:
        with self.cleanup_on_error():
            fsync_tree(self.tmp)
            if self.final.exists():  # renamed by a publisher that crashed before LATEST: never adopted, replace it
                shutil.rmtree(self.final)
            os.rename(self.tmp, self.final)
            fsync_dir(self.root)
        write_atomic(self.root / "LATEST", f"{self.version}\n".encode())
        return self.final


def prune(root: Path, keep: int, protect: tuple[int, ...] = (0,)) -> list[int]:
    """Remove all but the newest `keep` versions, never LATEST's nor `protect`ed ones; returns removed.

    A version is renamed away before deletion so it disappears at once instead of being visible half
    deleted; an Adopter loading it at that moment retries with the new LATEST.
    """
    assert keep >= 1, f"keep must be >= 1, got {keep}"
    root = Path(root)
    have = versions(root)
    spared = set(have[-keep:]) | set(protect) | {latest_version(root)}
    removed = []
    for v in have:
        if v in spared:
            continue
        doomed = root / f".del-{v}-{os.getpid()}"
        try:
            os.rename(version_dir(root, v), doomed)
        except FileNotFoundError:
            continue
        shutil.rmtree(doomed, ignore_errors=True)
        removed.append(v)
    return removed


class Adopter(Generic[T]):
    """Holds the newest published version of some weights, loading a new one when LATEST moves.

    `version` is None until the first adoption; `value` is what `load(dir)` returned for it.
    """

    def __init__(self, root: Path, load: Callable[[Path], T]):
        self.root, self.load = Path(root), load
        self.version: int | None = None
        self.value: T | None = None
        self.skipped: set[int] = set()  # versions that exist but do not load (missing or damaged files)

    def poll(self) -> bool:
        """Adopt LATEST if it is newer than the held version; True when a new version was adopted.

        A version that exists but does not load is skipped for good, with one warning (`skipped` counts them):
        the holder keeps its current weights and adopts the next good version."""
        while True:
            v = latest_version(self.root)
            if v is None or (self.version is not None and v <= self.version) or v in self.skipped:
                return False
            try:
                value = self.load(version_dir(self.root, v))
            except Exception as error:  # noqa: BLE001 - a version that does not load, for any reason, is skipped
                if version_dir(self.root, v).exists() or latest_version(self.root) == v:
                    self.skipped.add(v)
                    log.warning("skipping version %d in %s: it does not load (%s: %s); keeping version %s",
                                v, self.root, type(error).__name__, error, self.version)
                    return False
                log.info("version %d in %s was pruned while loading; retrying with the new LATEST", v, self.root)
                continue
            self.version, self.value = v, value
            return True

    def wait(self, timeout_s: float, stop: Callable[[], bool] | None = None, interval_s: float = 0.1) -> bool:
        """Poll until some version is held. False if `stop()` turned true first; TimeoutError after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while not (self.poll() or self.version is not None):
            if stop is not None and stop():
                return False
            if time.monotonic() > deadline:
                raise TimeoutError(f"no weights published under {self.root} within {timeout_s:.0f} s "
                                   f"(is the publishing role running?)")
            time.sleep(interval_s)
        return True


def resume(root: Path, load: Callable[[Path], T]) -> tuple[int | None, T | None]:
    """For a trainer (re)starting: the newest version that loads, and its loaded value. A newer version that
    does not load (its files missing or damaged) is moved aside to `<root>/.damaged-<v>-<time>` with one warning
    and LATEST is pointed back, so the trainer redoes that version instead of crashing on every restart. No
    consumer can hold such a version: it never loaded."""
    root = Path(root)
    while (v := latest_version(root)) is not None:
        try:
            return v, load(version_dir(root, v))
        except Exception as error:
            older = [x for x in versions(root) if x < v]
            if not older:
                raise  # nothing to fall back to: the warm start's version 0 itself is broken
            aside = root / f".damaged-{v}-{int(time.time())}"
            os.rename(version_dir(root, v), aside)
            write_atomic(root / "LATEST", f"{older[-1]}\n".encode())
            log.warning("version %d in %s does not load (%s: %s); moved it to %s and resuming from version %d",
                        v, root, type(error).__name__, error, aside, older[-1])
    return None, None
