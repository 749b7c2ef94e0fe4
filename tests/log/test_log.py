"""The filesystem rollout log: real files in tmp_path, failures injected where a crash would happen."""

import errno
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.feather as feather
import pytest

import prime_values.log.segments as segments
from prime_values.log import (
    SCHEMA_VERSION,
    CorruptSegment,
    LogReader,
    NewerSchemaVersion,
    SegmentWriter,
    apply_retention,
    per_token,
    read_segment,
    to_rows,
    to_table,
)
from prime_values.log.segments import list_seqs
from tests import log_rows


def rollout(i, n_tokens=8, shard="s0"):
    rng = np.random.default_rng(i)
    mask = (np.arange(n_tokens) >= n_tokens // 2).astype(np.int8)
    return log_rows.row(
        "rollouts", rollout_id=f"{shard}-{i}", prompt_id=f"p{i // 2}", group_id=f"g{i // 2}", shard=shard,
        policy_version=i // 4, token_ids=rng.integers(0, 1000, n_tokens).astype(np.int32).tolist(),
        policy_mask=mask.tolist(), sampling_logprobs=(-rng.random(n_tokens) * mask).astype(np.float32).tolist(),
        reward=float(i % 2), stop_reason="eos", privileged="answer: 42", task=json.dumps({"i": i}),
        created_at=1.7e9 + i)


def rows(start, n=3, shard="s0"):
    return [rollout(i, shard=shard) for i in range(start, start + n)]


def ids(segs):
    return [r for s in segs for r in s.table.column("rollout_id").to_pylist()]


@pytest.fixture
def log(tmp_path):
    return tmp_path / "log"


def test_to_table_validates_keys_and_roundtrips():
    r = rollout(0)
    with pytest.raises(ValueError, match="missing key 'reward'.*'rollouts'"):
        to_table("rollouts", [{k: v for k, v in r.items() if k != "reward"}])
    with pytest.raises(ValueError, match="unexpected key 'rewrad'.*'rollouts'"):
        to_table("rollouts", [{**r, "rewrad": 1.0}])
    with pytest.raises(ValueError, match="unknown stream kind 'rollout'"):
        to_table("rollout", [r])
    back = to_rows(to_table("rollouts", [r]))[0]
    assert back.keys() == r.keys() and back["token_ids"] == r["token_ids"]
    # stored as float32: a Python float comes back within half an ulp, 2^-24 = 6e-8 relative
    np.testing.assert_allclose(back["sampling_logprobs"], r["sampling_logprobs"], rtol=1e-6)
    # numpy arrays are accepted as per-token fields
    row = dict(rollout_id="a", critic_version=3, values=np.ones(4, np.float32), cut=False, scored_at=1.0,
               valued_tokens=4, bootstrap_value=0.0, token_digest=0)
    t = to_table("values", [row])
    assert t.column("values").to_pylist() == [[1.0] * 4]


def test_numpy_fast_path_builds_the_same_columns_as_lists():
    rng = np.random.default_rng(0)
    rows = [rollout(i) for i in range(5)]
    lengths = [7, 0, 3, 1, 12]  # an empty rollout too
    for r, n in zip(rows, lengths):
        r.update(token_ids=rng.integers(0, 500, n).tolist(), policy_mask=rng.integers(0, 2, n).tolist(),
                 sampling_logprobs=rng.normal(size=n).astype(np.float32).tolist())
    as_numpy = [{**r, "token_ids": np.asarray(r["token_ids"], np.int64),  # wider dtypes are cast to the schema's
                 "policy_mask": np.asarray(r["policy_mask"], np.int8),
                 "sampling_logprobs": np.asarray(r["sampling_logprobs"], np.float64)} for r in rows]
    assert to_table("rollouts", as_numpy).equals(to_table("rollouts", rows))
    mixed = [as_numpy[0], rows[1]]  # lists and arrays in one column: the generic path, same result
    assert to_table("rollouts", mixed).equals(to_table("rollouts", rows[:2]))


def test_per_token_gives_flat_values_and_offsets_without_copying(log):
    rs = rows(0, n=4)
    with SegmentWriter(log / "rollouts", "s0", "rollouts") as w:
        w.append(rs)
    table = read_segment(log / "rollouts" / "s0" / "000000000000.arrow", "rollouts")
    values, offsets = per_token(table, "token_ids")
    assert values.dtype == np.int32 and offsets.tolist() == [0, 8, 16, 24, 32]
    assert [values[offsets[i]: offsets[i + 1]].tolist() for i in range(4)] == [r["token_ids"] for r in rs]
    assert values.ctypes.data == table.column("token_ids").chunk(0).values.buffers()[1].address  # a view
    sliced = table.slice(1, 2)  # offsets index the same values, still row by row
    values, offsets = per_token(sliced, "sampling_logprobs")
    np.testing.assert_allclose(values[offsets[1]: offsets[2]], rs[2]["sampling_logprobs"])
    two = pa.concat_tables([table, table])  # several chunks: combined
    values, offsets = per_token(two, "policy_mask")
    assert len(offsets) == 9 and values[offsets[5]: offsets[6]].tolist() == rs[1]["policy_mask"]

def test_segment_roundtrip_metadata_and_ecosystem_readability(log):
    with SegmentWriter(log / "rollouts", "s0", "rollouts") as w:
        assert [w.append(rows(0)), w.append(rows(3))] == [0, 1]
    shard = log / "rollouts" / "s0"
    (shard / ".000000000002.arrow.tmp").write_bytes(b"a crashed writer's partial segment")
    assert sorted(p.name for p in shard.glob("*.arrow")) == ["000000000000.arrow", "000000000001.arrow"]
    t = read_segment(shard / "000000000001.arrow", "rollouts")
    assert to_rows(t)[0]["rollout_id"] == "s0-3"
    meta = t.schema.metadata
    assert meta[b"pv.schema_version"] == str(SCHEMA_VERSION).encode() and meta[b"pv.kind"] == b"rollouts"
    assert len(meta[b"pv.xxh3_64"]) == 16 and b"pv.writer" in meta and float(meta[b"pv.created_at"]) > 1.6e9
    # readable without Prime Values
    assert ds.dataset(shard, format="arrow").to_table().num_rows == 6
    assert feather.read_table(shard / "000000000000.arrow").column("reward").to_pylist() == [0.0, 1.0, 0.0]
    assert pa.ipc.open_file(shard / "000000000000.arrow").read_all().num_rows == 3


def test_segment_loads_into_pandas(log):
    import pandas as pd  # a test extra (setup.cfg): missing, this fails rather than skips
    with SegmentWriter(log / "rollouts", "s0", "rollouts") as w:
        w.append(rows(0))
    df = feather.read_feather(log / "rollouts" / "s0" / "000000000000.arrow")
    assert isinstance(df, pd.DataFrame) and list(df["rollout_id"]) == ["s0-0", "s0-1", "s0-2"]


def test_append_rejects_wrong_schema_and_backward_seq(log):
    w = SegmentWriter(log / "values", "s0", "values")
    with pytest.raises(ValueError, match="does not match the 'values' schema"):
        w.append(to_table("rollouts", rows(0)))
    assert w.append([], seq=5) == 5  # skipping ahead is fine (batch n at seq n)
    with pytest.raises(ValueError, match="seq 5 is not after the last seq 5"):
        w.append([], seq=5)
    assert read_segment(log / "values" / "s0" / "000000000005.arrow").num_rows == 0


def test_seq_continues_across_writer_restarts_and_single_writer_enforced(log):
    w = SegmentWriter(log / "rollouts", "s0", "rollouts")
    for i in range(3):
        w.append(rows(i))
    with pytest.raises(RuntimeError, match="another process is writing"):
        SegmentWriter(log / "rollouts", "s0", "rollouts")
    w.close()
    stale = log / "rollouts" / "s0" / ".000000000003.arrow.tmp"
    stale.write_bytes(b"half a segment")  # a crashed writer's leftover
    w = SegmentWriter(log / "rollouts", "s0", "rollouts")
    assert not stale.exists() and w.append(rows(9)) == 3
    w.close()
    assert list_seqs(log / "rollouts" / "s0") == [0, 1, 2, 3]


@pytest.mark.parametrize("fail", ["fsync", "replace"])
def test_crash_mid_write_leaves_no_visible_segment(log, monkeypatch, fail):
    w = SegmentWriter(log / "rollouts", "s0", "rollouts")
    w.append(rows(0))
    reader = LogReader(log / "rollouts", "c", log / "cursors", "rollouts")
    assert len(reader.poll()) == 1

    def boom(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, fail, boom)
    with pytest.raises(OSError, match=r"000000000001\.arrow \(No space left on device\); free disk space") as e:
        w.append(rows(3))
    assert e.value.errno == errno.ENOSPC
    monkeypatch.undo()
    shard = log / "rollouts" / "s0"
    assert sorted(os.listdir(shard)) == [".writer.lock", "000000000000.arrow"]  # no temp, no torn segment
    assert reader.poll() == []
    assert w.append(rows(3)) == 1  # the next write works and takes the seq that was never published
    assert ids(reader.poll()) == ["s0-3", "s0-4", "s0-5"]


def test_readers_never_list_temp_files(log):
    with SegmentWriter(log / "rollouts", "s0", "rollouts") as w:
        w.append(rows(0))
    shard = log / "rollouts" / "s0"
    (shard / ".000000000001.arrow.tmp").write_bytes(b"partial")
    (shard / "notes.txt").write_text("not a segment")
    reader = LogReader(log / "rollouts", "c", log / "cursors", "rollouts")
    assert [s.seq for s in reader.poll()] == [0] and reader.poll() == [] and reader.quarantined == 0


def test_cursor_resume_neither_skips_nor_repeats(log):
    w = SegmentWriter(log / "rollouts", "s0", "rollouts")
    for i in range(4):
        w.append(rows(3 * i))
    a = LogReader(log / "rollouts", "evaluator", log / "cursors", "rollouts")
    assert [s.seq for s in a.poll(max_segments=2)] == [0, 1]
    a.commit()
    assert [s.seq for s in a.poll(max_segments=1)] == [2]  # polled, processing interrupted before commit
    a = LogReader(log / "rollouts", "evaluator", log / "cursors", "rollouts")  # restart
    w.append(rows(12))
    assert [s.seq for s in a.poll()] == [2, 3, 4]  # resumes at the committed position: no skip, no repeat
    a.commit()
    assert LogReader(log / "rollouts", "evaluator", log / "cursors", "rollouts").poll() == []
    # a second consumer has its own cursor
    b = LogReader(log / "rollouts", "orchestrator", log / "cursors", "rollouts")
    assert [s.seq for s in b.poll()] == [0, 1, 2, 3, 4]
    assert json.loads((log / "cursors" / "evaluator.json").read_text()) == {"rollouts": {"s0": 5}}


def test_one_cursor_file_holds_several_streams(log):
    SegmentWriter(log / "rollouts", "s0", "rollouts").append(rows(0))
    vw = SegmentWriter(log / "values", "s0", "values")
    vw.append([dict(rollout_id="s0-0", critic_version=1, values=[0.5] * 8, cut=False, scored_at=1.0,
                    valued_tokens=8, bootstrap_value=0.0, token_digest=0)])
    vw.append([dict(rollout_id="s0-1", critic_version=1, values=[0.5] * 8, cut=True, scored_at=2.0,
                    valued_tokens=6, bootstrap_value=0.5, token_digest=0)])
    r, v = (LogReader(log / k, "orch", log / "cursors", k) for k in ("rollouts", "values"))
    assert len(r.poll()) == 1 and len(v.poll()) == 2
    r.commit()
    v.commit()
    assert json.loads((log / "cursors" / "orch.json").read_text()) == {"rollouts": {"s0": 1}, "values": {"s0": 2}}


def test_tails_shards_that_appear_later_in_time_order(log):
    a = SegmentWriter(log / "rollouts", "a", "rollouts")
    reader = LogReader(log / "rollouts", "c", log / "cursors", "rollouts")
    assert reader.poll() == []  # no shards yet is fine
    a.append(rows(0, shard="a"))
    assert [(s.shard, s.seq) for s in reader.poll()] == [("a", 0)]
    b = SegmentWriter(log / "rollouts", "b", "rollouts")
    b.append(rows(0, shard="b"))
    a.append(rows(3, shard="a"))
    a.append(rows(6, shard="a"))
    b.append(rows(3, shard="b"))
    for shard, seq, t in [("b", 0, 1), ("a", 1, 10), ("a", 2, 20), ("b", 1, 11)]:  # pin publication times
        os.utime(log / "rollouts" / shard / f"{seq:012d}.arrow", (1e9 + t, 1e9 + t))
    got = [(s.shard, s.seq) for s in reader.poll()]
    assert got == [("b", 0), ("a", 1), ("b", 1), ("a", 2)]  # by time, each shard in seq order
    assert reader.poll() == []


def test_poll_is_cheap_when_nothing_is_new(log, monkeypatch):
    with SegmentWriter(log / "rollouts", "s0", "rollouts") as w:
        for i in range(5):
            w.append(rows(i))
    reader = LogReader(log / "rollouts", "c", log / "cursors", "rollouts")
    assert len(reader.poll()) == 5
    opened = []
    monkeypatch.setattr(segments, "read_segment", lambda *a: opened.append(a))
    assert reader.poll() == [] and opened == []  # a listing, no file opened



def test_integrity_check_catches_any_flipped_data_byte_and_any_truncation(log):
    """Every byte between the schema message and the footer (all batch data and its layout) is hashed: a flip
    anywhere there, or a cut anywhere in the file, is a CorruptSegment, never a silently different table."""
    with SegmentWriter(log / "rollouts", "s0", "rollouts") as w:
        w.append(rows(0, n=2))
    path = log / "rollouts" / "s0" / "000000000000.arrow"
    good = path.read_bytes()
    start, end = segments.data_region(good)
    assert 16 < start < end < len(good) - 10 and end - start > 500
    for at in range(start, end):
        damaged = bytearray(good)
        damaged[at] ^= 0x10
        with pytest.raises(CorruptSegment):
            segments._decode(path, bytes(damaged), "rollouts")
    for n in range(len(good)):
        with pytest.raises(CorruptSegment):
            segments._decode(path, good[:n], "rollouts")
    assert read_segment(path, "rollouts").num_rows == 2


def test_segments_with_the_earlier_crc32_still_verify(log):
    """Segments written before the hash became xxh3 carry pv.crc32 over the same bytes: read, and checked."""
    import zlib
    table = to_table("rollouts", rows(0))
    meta = {"pv.schema_version": str(SCHEMA_VERSION), "pv.kind": "rollouts", "pv.rows": "3", "pv.writer": "old",
            "pv.created_at": "1.7e9"}

    def ipc(crc):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema.with_metadata({**meta, "pv.crc32": crc})) as w:
            w.write_table(table)
        return sink.getvalue().to_pybytes()

    draft = ipc("00000000")
    start, end = segments.data_region(draft)
    data = ipc(f"{zlib.crc32(draft[start:end]):08x}")
    path = log / "old.arrow"
    path.parent.mkdir(parents=True)
    path.write_bytes(data)
    assert read_segment(path, "rollouts").equals(table)
    damaged = bytearray(data)
    damaged[(start + end) // 2] ^= 0x01
    path.write_bytes(bytes(damaged))
    with pytest.raises(CorruptSegment, match="checksum mismatch \\(crc32"):
        read_segment(path, "rollouts")


def test_hash_placeholder_in_other_metadata_falls_back_to_a_second_serialization(log):
    shard = "x" + segments._PENDING.decode()  # the writer identity (metadata) now holds the placeholder too
    with SegmentWriter(log / "rollouts", shard, "rollouts") as w:
        w.append(rows(0))
    t = read_segment(log / "rollouts" / shard / "000000000000.arrow", "rollouts")
    assert t.num_rows == 3 and segments._PENDING not in t.schema.metadata[segments.HASH_KEY.encode()]


@pytest.mark.parametrize("bound", ["exact", "too_small"])
def test_large_metadata_and_an_outgrown_size_bound_still_give_a_verified_segment(tmp_path, monkeypatch, bound):
    if bound == "too_small":  # the preallocated buffer overflows: the writer falls back to a growing one
        monkeypatch.setattr(pa.ipc, "get_record_batch_size", lambda b: 0)
    batch = segments.to_batch("rollouts", rows(0))
    data = bytes(segments._serialize([batch], batch.schema, {"pv.writer": "w" * 200_000}))
    reader = pa.ipc.open_file(pa.py_buffer(data))
    meta = {k.decode(): v.decode() for k, v in reader.schema.metadata.items()}
    segments.verify_checksum(tmp_path / "x.arrow", data, meta)
    assert reader.read_all().num_rows == 3 and len(meta["pv.writer"]) == 200_000

def _flip_in_token_data(path, token):
    data = bytearray(path.read_bytes())
    at = data.find(np.int32(token).tobytes())
    assert at > 0, "marker token not found in the segment"
    data[at] ^= 0x01  # still a perfectly decodable Arrow file: only the checksum can tell
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["truncated", "flipped_byte", "garbage", "wrong_kind"])
def test_undecodable_segments_are_quarantined_and_reading_continues(log, damage, caplog):
    w = SegmentWriter(log / "rollouts", "s0", "rollouts")
    marked = rows(3)
    marked[1]["token_ids"][2] = 987654321
    for r in (rows(0), marked, rows(6)):
        w.append(r)
    bad = log / "rollouts" / "s0" / "000000000001.arrow"
    if damage == "truncated":
        bad.write_bytes(bad.read_bytes()[: bad.stat().st_size // 2])
    elif damage == "flipped_byte":
        _flip_in_token_data(bad, 987654321)
        assert pa.ipc.open_file(bad).read_all().num_rows == 3
    elif damage == "garbage":
        bad.write_bytes(os.urandom(2000))
    else:
        vt = to_table("values", [dict(rollout_id="x", critic_version=1, values=[0.0], cut=False,
                                           scored_at=0.0, valued_tokens=1, bootstrap_value=0.0, token_digest=0)])
        SegmentWriter(log / "values", "s0", "values").append(vt)
        os.replace(log / "values" / "s0" / "000000000000.arrow", bad)
    with pytest.raises(CorruptSegment) as e:
        read_segment(bad, "rollouts")
    assert e.value.path == bad and e.value.reason
    reader = LogReader(log / "rollouts", "c", log / "cursors", "rollouts")
    assert [s.seq for s in reader.poll()] == [0, 2]
    assert reader.quarantined == 1 and "quarantined" in caplog.text
    moved = log / "quarantine" / "rollouts" / "s0" / bad.name
    assert moved.exists() and not bad.exists()
    assert (moved.parent / (bad.name + ".reason")).read_text().startswith(e.value.reason)
    # another consumer that listed it before it moved just skips it
    other = LogReader(log / "rollouts", "d", log / "cursors", "rollouts")
    other._quarantine("s0", CorruptSegment(bad, "late"))
    assert other.quarantined == 0 and [s.seq for s in other.poll()] == [0, 2]
    # a restarted writer never reuses the quarantined seq, even if it was the newest
    for p in (log / "rollouts" / "s0").glob("00000000000[02].arrow"):
        p.unlink()
    w.close()
    assert SegmentWriter(log / "rollouts", "s0", "rollouts").next_seq == 2


def test_newer_schema_version_is_skipped_not_quarantined(log, monkeypatch, caplog):
    monkeypatch.setattr(segments, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    with SegmentWriter(log / "rollouts", "s0", "rollouts") as w:
        w.append(rows(0))
    monkeypatch.undo()
    with SegmentWriter(log / "rollouts", "s0", "rollouts") as w:
        w.append(rows(1))  # a current segment after it is still read
    path = log / "rollouts" / "s0" / "000000000000.arrow"
    with pytest.raises(NewerSchemaVersion, match=f"schema_version {SCHEMA_VERSION + 1} is newer.*upgrade"):
        read_segment(path)
    reader = LogReader(log / "rollouts", "c", log / "cursors", "rollouts")
    assert [s.seq for s in reader.poll()] == [1]  # never used, never a crash
    assert reader.skipped_newer == 1 and reader.quarantined == 0 and caplog.text.count("skipped") == 1
    assert path.exists()  # left in place for a newer reader


def test_a_segment_of_schema_version_3_reads_with_the_images_column_added(log, monkeypatch):
    """A run written before rollouts carried images (schema version 3) resumes: its segments read as version 4's
    with `images` []; a version older than that is still quarantined as unsupported."""
    from prime_values.log import records

    version3 = records.written_by("rollouts", 3)
    old = [{k: v for k, v in row.items() if k != "images"} for row in rows(0)]
    monkeypatch.setattr(segments, "SCHEMA_VERSION", 3)  # the version-3 writer knew no images
    monkeypatch.setitem(segments.SCHEMAS, "rollouts", version3)
    monkeypatch.setattr(segments, "to_batch", lambda kind, rows: pa.RecordBatch.from_pylist(rows, schema=version3))
    with SegmentWriter(log / "rollouts", "s0", "rollouts") as w:
        w.append(old)
    monkeypatch.undo()
    table = read_segment(log / "rollouts" / "s0" / "000000000000.arrow", "rollouts")
    assert table.schema.equals(records.SCHEMAS["rollouts"]) and table.column("images").to_pylist() == [[]] * len(old)
    assert table.select([n for n in table.column_names if n != "images"]).to_pylist() == \
        to_table("rollouts", old).select([n for n in table.column_names if n != "images"]).to_pylist()
    assert records.written_by("rollouts", 2) is None


def _cursor(log, consumer, n):
    (log / "cursors").mkdir(exist_ok=True)
    (log / "cursors" / f"{consumer}.json").write_text(json.dumps({"rollouts": {"s0": n}}))


def test_retention_deletes_only_what_every_consumer_passed(log):
    with SegmentWriter(log / "rollouts", "s0", "rollouts") as w:
        for i in range(10):
            w.append(rows(i, n=1))
    stream, cur = log / "rollouts", log / "cursors"
    left = lambda: list_seqs(stream / "s0")
    assert apply_retention(stream, cur, ["a", "b"], keep_last=None, max_age_s=None) == 0
    assert apply_retention(stream, cur, ["a", "b"], keep_last=0, max_age_s=0) == 0  # no cursors: nothing passed
    _cursor(log, "a", 8)
    assert apply_retention(stream, cur, ["a", "b"], keep_last=0, max_age_s=0) == 0  # b has passed nothing
    _cursor(log, "b", 6)
    assert apply_retention(stream, cur, ["a", "b"], keep_last=7, max_age_s=None) == 3  # beyond newest 7: 0..2
    assert left() == list(range(3, 10))
    os.utime(stream / "s0" / "000000000005.arrow", (0, 0))
    os.utime(stream / "s0" / "000000000008.arrow", (0, 0))  # old, but b has not passed it
    assert apply_retention(stream, cur, ["a", "b"], keep_last=None, max_age_s=3600) == 1
    assert left() == [3, 4, 6, 7, 8, 9]
    assert apply_retention(stream, cur, ["a", "b"], keep_last=0, max_age_s=None) == 2  # all b passed: 3, 4
    assert left() == [6, 7, 8, 9]
    _cursor(log, "a", 10)
    _cursor(log, "b", 10)
    assert apply_retention(stream, cur, ["a", "b"], keep_last=0, max_age_s=0) == 3
    assert left() == [9]  # the newest always stays: it anchors a restarted writer's seq
    assert SegmentWriter(stream, "s0", "rollouts").next_seq == 10


def test_fixture_rows_fill_every_field_of_each_schema():
    """tests/log_rows.py: a row with no field given is a valid record of its stream; a misspelt field fails."""
    from prime_values.log.records import SCHEMAS

    for kind in SCHEMAS:
        assert to_table(kind, [log_rows.row(kind)]).schema.names == SCHEMAS[kind].names
    with pytest.raises(KeyError, match="stream 'rollouts' has no field 'rolout_id'"):
        log_rows.row("rollouts", rolout_id="x")
