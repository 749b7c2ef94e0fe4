"""Segments: the unit of publication of the rollout log (docs/design.md §2, "Rules of the log").

A stream (`<run>/log/<stream>/`) has one directory per shard, each with exactly one writer. A segment is
one Arrow IPC file (Feather v2) named `<seq:012d>.arrow`: columnar, zero-copy to read, and loadable by
pyarrow / pandas / `pyarrow.dataset` without Prime Values. It is written under a hidden temp name,
fsync'd and renamed, so readers see it whole or not at all. Its schema metadata makes it self-describing
and checkable: schema version, stream kind, row count, writer, creation time and an XXH3-64 hash of the
record batch messages (`pv.xxh3_64`: the bytes between the schema message and the footer, i.e. all data
and its layout), verified on every read. Segments written before the hash changed carry `pv.crc32` over the
same bytes instead and still verify (`verify_checksum`).

Readers keep a cursor (next seq per shard). Seqs only grow, so "seq >= cursor" identifies unread
segments even when quarantine or retention leave gaps.
"""

from __future__ import annotations

import errno
import fcntl
import heapq
import json
import logging
import os
import socket
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pyarrow as pa
import xxhash

from .fsutil import fsync_dir, io_error, write_atomic
from .records import SCHEMA_VERSION, SCHEMAS, schema_for, to_batch, upgrade, written_by

log = logging.getLogger(__name__)

SUFFIX = ".arrow"
_MAGIC = b"ARROW1"
HASH_KEY = "pv.xxh3_64"  # 16 hex digits; ~28 GB/s here against zlib.crc32's ~4 GB/s
_LEGACY_CRC_KEY = "pv.crc32"  # segments written before 2026-11-30: zlib.crc32 of the same bytes, 8 hex digits
_PENDING = b"~" * 16  # written in place of the hash, then patched: same length, so every offset stays valid


class CorruptSegment(Exception):
    """A segment that cannot be decoded or fails verification; readers quarantine it."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"corrupt segment {path}: {reason}")
        self.path, self.reason = Path(path), reason


class NewerSchemaVersion(CorruptSegment):
    """Written by a newer Prime Values. Not damaged, so readers skip it (one warning, counted in
    `LogReader.skipped_newer`) instead of quarantining it: moving it aside would lose good data because of a
    version skew between roles; `read_segment` raises it."""


def segment_name(seq: int) -> str:
    return f"{seq:012d}{SUFFIX}"


def parse_seq(name: str) -> int | None:
    """Seq of a published segment file name; None for temp files, reasons, locks and strangers."""
    stem = name[: -len(SUFFIX)]
    return int(stem) if name.endswith(SUFFIX) and stem.isdigit() else None


def list_seqs(shard_dir: Path) -> list[int]:
    try:
        names = os.listdir(shard_dir)
    except FileNotFoundError:
        return []
    return sorted(s for s in map(parse_seq, names) if s is not None)


def quarantine_dir(stream_dir: Path, shard: str) -> Path:
    stream_dir = Path(stream_dir)
    return stream_dir.parent / "quarantine" / stream_dir.name / shard


def data_region(data) -> tuple[int, int]:
    """[start, end) of an Arrow IPC file's record batch messages and end-of-stream marker: the bytes between
    the schema message and the footer, i.e. all data and its layout. ValueError on inconsistent framing."""
    n = len(data)
    if n < 24:
        raise ValueError(f"{n} bytes")
    view = memoryview(data)
    return _region(view[:16], view[n - 10:], n)


def _region(head, tail, n: int) -> tuple[int, int]:
    """data_region from the file's first 16 and last 10 bytes."""
    cont, schema_len = struct.unpack_from("<Ii", head, 8)
    (footer_len,) = struct.unpack_from("<i", tail, 0)
    start, end = 16 + schema_len, n - 10 - footer_len
    if cont != 0xFFFFFFFF or not 16 < start <= end <= n - 10:
        raise ValueError("inconsistent IPC framing")
    return start, end


def verify_checksum(path: Path, data, meta: dict[str, str]) -> None:
    """Raise CorruptSegment unless the hash recorded in the segment's metadata matches its data region.
    The one verification every reader uses (read_segment, `prime_values.tools.check`)."""
    try:
        start, end = data_region(data)
    except (ValueError, struct.error) as e:
        raise CorruptSegment(path, f"not a complete Arrow IPC file ({e})") from None
    region = memoryview(data)[start:end]
    if HASH_KEY in meta:
        algo, want, got = "xxh3_64", meta[HASH_KEY], f"{xxhash.xxh3_64_intdigest(region):016x}"
    elif _LEGACY_CRC_KEY in meta:
        algo, want, got = "crc32", meta[_LEGACY_CRC_KEY], f"{zlib.crc32(region):08x}"
    else:
        raise CorruptSegment(path, f"no checksum recorded ({HASH_KEY} missing)")
    if got != want:
        raise CorruptSegment(path, f"checksum mismatch ({algo} {got}, recorded {want})")


def _ipc_file(batches: list[pa.RecordBatch], schema: pa.Schema) -> memoryview:
    """The Arrow IPC file, written into one buffer allocated at an upper bound of its size (the batch messages,
    the schema twice: as a message and in the footer, the footer's block index, framing): no reallocations as
    a growing BufferOutputStream makes. (Collecting the writer's output as zero-copy pieces and writev-ing
    them was measured too: the per-write Python callbacks cost as much as this one copy.)"""
    size = sum(pa.ipc.get_record_batch_size(b) for b in batches) + 2 * schema.serialize().size \
        + 32 * len(batches) + 1024
    buf = pa.allocate_buffer(size)
    sink = pa.FixedSizeBufferWriter(buf)
    try:
        with pa.ipc.new_file(sink, schema) as w:
            for b in batches:
                w.write_batch(b)
    except OSError:  # outgrew the bound (should not happen): let the buffer grow instead
        grow = pa.BufferOutputStream()
        with pa.ipc.new_file(grow, schema) as w:
            for b in batches:
                w.write_batch(b)
        return memoryview(bytearray(grow.getvalue()))
    return memoryview(buf).cast("B")[: sink.tell()]


def _serialize(batches: list[pa.RecordBatch], schema: pa.Schema, meta: dict[str, str]) -> memoryview:
    """The segment's bytes. Serialized once with a placeholder for the hash, which is then computed over the
    data region of that same buffer and patched into the schema message and the footer (both carry the schema
    metadata; same length, so no offset moves); the data region does not depend on the metadata."""
    view = _ipc_file(batches, schema.with_metadata({**meta, HASH_KEY: _PENDING.decode()}))
    start, end = data_region(view)
    digest = f"{xxhash.xxh3_64_intdigest(view[start:end]):016x}"
    spots = []
    for lo, hi in ((0, start), (end, len(view))):  # the schema message, the footer
        piece = view[lo:hi].tobytes()
        at = piece.find(_PENDING)
        if at < 0 or piece.find(_PENDING, at + 1) >= 0:  # other metadata holds the placeholder too: serialize again
            return _ipc_file(batches, schema.with_metadata({**meta, HASH_KEY: digest}))
        spots.append(lo + at)
    for at in spots:
        view[at: at + len(_PENDING)] = digest.encode()
    return view


def _write_file(path: Path, data: memoryview) -> None:
    """Create `path` holding `data`, fsync'd. Plain os calls: a Python file object adds an isatty ioctl, an
    fstat and a buffer per segment, and a write may take fewer bytes than asked."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        while data:
            n = os.write(fd, data)
            if n <= 0:
                raise OSError(errno.EIO, "write made no progress")
            data = data[n:]
        os.fsync(fd)
    finally:
        os.close(fd)


class SegmentWriter:
    """The single writer of `<stream_dir>/<shard>/`.

    Restart-safe: continues after the highest seq on disk (including quarantined ones, so a seq a
    reader may have passed is never reused) and removes temp files a crashed predecessor left. An
    advisory lock turns an accidental second writer on the same shard into an error, not interleaved
    seqs.
    """

    def __init__(self, stream_dir: Path, shard: str, kind: str, durable_rename: bool = False):
        """`durable_rename` also fsyncs the directory after each rename, so a published segment survives a
        power loss (a second journal commit per segment, ~2x slower appends). Visibility is atomic either
        way: the data is fsync'd before the rename."""
        schema_for(kind)
        self.durable_rename = durable_rename
        assert shard and "/" not in shard and not shard.startswith("."), f"bad shard name {shard!r}"
        self.kind, self.shard = kind, shard
        self.dir = Path(stream_dir) / shard
        self.dir.mkdir(parents=True, exist_ok=True)
        self._dir = str(self.dir)
        self._lock = open(self.dir / ".writer.lock", "a")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise RuntimeError(f"another process is writing {self.dir}; give each writer its own shard name") from None
        except OSError:  # filesystem without flock support: rely on the one-writer-per-shard contract
            pass
        for tmp in self.dir.glob(".*.arrow.tmp"):
            tmp.unlink(missing_ok=True)
        seqs = list_seqs(self.dir) + list_seqs(quarantine_dir(stream_dir, shard))
        self.next_seq = max(seqs, default=-1) + 1
        self.identity = f"{socket.gethostname()}:{os.getpid()}/{shard}"

    def append(self, rows_or_table: list[dict] | pa.Table, seq: int | None = None) -> int:
        """Publish one segment and return its seq. `seq` may skip ahead (e.g. batch n at seq n), never back."""
        if isinstance(rows_or_table, pa.Table):
            table = rows_or_table
            if not table.schema.equals(SCHEMAS[self.kind]):
                raise ValueError(f"table does not match the {self.kind!r} schema: {table.schema}")
            batches, num_rows = table.combine_chunks().to_batches(), table.num_rows
        else:
            batches = [to_batch(self.kind, rows_or_table)]
            num_rows = batches[0].num_rows
        seq = self.next_seq if seq is None else seq
        if seq < self.next_seq:
            raise ValueError(f"seq {seq} is not after the last seq {self.next_seq - 1} of {self.dir}")
        meta = {
            "pv.schema_version": str(SCHEMA_VERSION),
            "pv.kind": self.kind,
            "pv.rows": str(num_rows),
            "pv.writer": self.identity,
            "pv.created_at": repr(time.time()),
        }
        data = _serialize(batches, SCHEMAS[self.kind], meta)

        name = segment_name(seq)  # str paths: pathlib costs more per segment than the rename
        final, tmp = os.path.join(self._dir, name), os.path.join(self._dir, f".{name}.tmp")
        assert not os.path.exists(final), f"{final} already exists: a second writer on shard {self.shard!r}?"
        try:
            _write_file(tmp, data)
            os.replace(tmp, final)
        except OSError as e:
            Path(tmp).unlink(missing_ok=True)
            raise io_error(e, Path(final), "write segment") from e
        self.next_seq = seq + 1  # visible now: never reuse this seq, even if the dir fsync fails
        if self.durable_rename:
            try:
                fsync_dir(self.dir)
            except OSError as e:
                raise io_error(e, Path(final), "make durable segment") from e
        return seq

    def close(self) -> None:
        self._lock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_segment(path: Path, kind: str | None = None) -> pa.Table:
    """Decode and verify one segment. Raises CorruptSegment (or NewerSchemaVersion) on any failure;
    FileNotFoundError passes through because a vanished segment is not a corrupt one."""
    path = Path(path)
    data = _read_file(path)
    try:
        return _decode(path, data, kind)
    except CorruptSegment:
        raise
    except Exception as e:  # whatever pyarrow/struct raise on garbage: truncated, flipped, not Arrow
        raise CorruptSegment(path, f"cannot decode as Arrow IPC ({type(e).__name__}: {e})") from e


def _read_file(path: Path) -> bytes:
    """The whole file in one read (plain os calls, as `_write_file`)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        n = os.fstat(fd).st_size
        data = os.read(fd, n)
        while len(data) < n:  # a short read: keep going until EOF
            more = os.read(fd, n - len(data))
            if not more:
                break
            data += more
        return data
    finally:
        os.close(fd)


def _decode(path: Path, data: bytes, kind: str | None) -> pa.Table:
    if len(data) < 24 or data[:6] != _MAGIC or data[-6:] != _MAGIC:
        raise CorruptSegment(path, f"not a complete Arrow IPC file ({len(data)} bytes, bad magic)")
    reader = pa.ipc.open_file(pa.py_buffer(data))
    meta = {k.decode(): v.decode() for k, v in (reader.schema.metadata or {}).items()}
    version = int(meta.get("pv.schema_version", "-1"))
    if version > SCHEMA_VERSION:
        raise NewerSchemaVersion(
            path, f"schema_version {version} is newer than this Prime Values' {SCHEMA_VERSION}; upgrade prime_values")
    seg_kind = meta.get("pv.kind")
    expected = written_by(seg_kind, version)  # this version's schema, or an older one it still reads
    if expected is None and seg_kind in SCHEMAS:
        raise CorruptSegment(path, f"unsupported or missing schema_version {version}")
    if kind is not None and seg_kind != kind:
        raise CorruptSegment(path, f"holds kind {seg_kind!r}, expected {kind!r}")
    if expected is None or not reader.schema.equals(expected):
        raise CorruptSegment(path, f"columns do not match the {seg_kind!r} schema")
    verify_checksum(path, data, meta)
    table = reader.read_all()
    if str(table.num_rows) != meta.get("pv.rows"):
        raise CorruptSegment(path, f"{table.num_rows} rows, recorded {meta.get('pv.rows')}")
    return table if version == SCHEMA_VERSION else upgrade(seg_kind, table)


@dataclass
class Segment:
    shard: str
    seq: int
    path: Path
    table: pa.Table

    @property
    def meta(self) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in (self.table.schema.metadata or {}).items()}

    @property
    def created_at(self) -> float:
        return float(self.meta["pv.created_at"])


def load_cursor(path: Path) -> dict[str, dict[str, int]]:
    """{stream: {shard: next_seq}}; a missing file means "nothing read yet"."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return {}
    except ValueError as e:
        raise ValueError(f"cursor file {path} is not valid JSON ({e}); delete it to re-read the log from the start") \
            from e


class LogReader:
    """Tails every shard of one stream for one consumer, with a resumable cursor.

    `poll()` advances an in-memory position; `commit()` persists it. Commit after the polled segments
    are processed and a restarted consumer neither skips nor repeats a committed segment.
    Undecodable segments are quarantined and counted, never raised: one bad file must not stop a run. A segment
    of a newer schema version is skipped and counted (`skipped_newer`), never used and never moved.
    """

    def __init__(self, stream_dir: Path, consumer: str, cursor_dir: Path, kind: str,
                 shards: Callable[[str], bool] | None = None):
        schema_for(kind)
        self.stream_dir, self.kind, self.consumer = Path(stream_dir), kind, consumer
        self.shards = shards  # which shards this consumer reads (None: all), e.g. one evaluator's inference workers
        self.stream = self.stream_dir.name
        self.cursor_path = Path(cursor_dir) / f"{consumer}.json"
        self.next_seq: dict[str, int] = dict(load_cursor(self.cursor_path).get(self.stream, {}))
        self.quarantined = 0  # segments this reader moved to quarantine
        self.vanished = 0  # listed but gone before reading (retention, or another consumer's quarantine)
        self.skipped_newer = 0  # written by a newer schema version: skipped (never used), left in place

    def _unread(self):
        """(mtime, shard, seq) of unread segments: per shard in seq order, merged by publication time."""
        try:
            shards = sorted(e.name for e in os.scandir(self.stream_dir) if e.is_dir() and not e.name.startswith(".")
                            and (self.shards is None or self.shards(e.name)))
        except FileNotFoundError:
            return []
        queues = []
        for shard in shards:
            start, todo = self.next_seq.get(shard, 0), []
            for seq in list_seqs(self.stream_dir / shard):
                if seq >= start:
                    mtime = 0.0
                    if len(shards) > 1:  # publication time only orders segments of different shards
                        try:
                            mtime = os.stat(self.stream_dir / shard / segment_name(seq)).st_mtime
                        except FileNotFoundError:
                            pass
                    todo.append((mtime, shard, seq))
            queues.append(todo)
        return heapq.merge(*queues)  # keeps each shard's seq order, interleaves shards fairly by time

    def poll(self, max_segments: int | None = None) -> list[Segment]:
        """Next unread segments (at most `max_segments`); [] when nothing is new."""
        out: list[Segment] = []
        for _, shard, seq in self._unread():
            if max_segments is not None and len(out) >= max_segments:
                break
            path = self.stream_dir / shard / segment_name(seq)
            try:
                out.append(Segment(shard, seq, path, read_segment(path, self.kind)))
            except FileNotFoundError:
                self.vanished += 1
            except NewerSchemaVersion as e:  # version skew, not damage: skip it, leave it in place, count it
                self.skipped_newer += 1
                log.warning("skipped %s: %s (left in place for a newer reader)", path, e.reason)
            except CorruptSegment as e:
                self._quarantine(shard, e)
            self.next_seq[shard] = seq + 1
        return out

    def _quarantine(self, shard: str, e: CorruptSegment) -> None:
        dst = quarantine_dir(self.stream_dir, shard) / e.path.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(e.path, dst)
        except FileNotFoundError:  # another consumer moved it first
            return
        write_atomic(dst.with_name(dst.name + ".reason"),
                     f"{e.reason}\nquarantined by consumer {self.consumer!r} at {time.time():.3f}\n".encode())
        self.quarantined += 1
        log.warning("quarantined %s to %s: %s", e.path, dst, e.reason)

    def committer(self) -> Callable[[], None]:
        """`commit` of the position as it is now, to run later (on another thread: `trainer.Trainer.publish` in
        the background): segments polled in between stay uncommitted."""
        position = dict(self.next_seq)
        return lambda: self.commit(hold=position)

    def commit(self, hold: dict[str, int] | None = None) -> None:
        """Atomically persist the position; other streams in the same cursor file are kept.

        `hold` {shard: seq}: persist at most that seq for a shard, for a consumer that still holds rows of
        segment `seq` in memory: a restart re-reads from there instead of losing them."""
        cursor = load_cursor(self.cursor_path)
        hold = hold or {}
        position = dict(self.next_seq)  # a copy: another thread may poll meanwhile (`committer`)
        cursor[self.stream] = {shard: min(seq, hold.get(shard, seq)) for shard, seq in sorted(position.items())}
        self.cursor_path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.cursor_path, json.dumps(cursor, indent=1, sort_keys=True).encode())
