"""Rollout-log benchmark: is the Arrow IPC log fast enough to be the bus? (docs/benchmarks.md)

Measured side by side in one run, methods alternating within each repetition, on the same disk:
  raw         the arrow segments' bytes written to as many files with fsync, then read back: the ceiling
  raw-atomic  the same bytes through the publication protocol alone (temp file, fsync, rename):
              what any format pays for "visible whole or not at all"
  arrow       the log itself: SegmentWriter.append (rows -> Arrow, xxh3 hash, fsync, rename) and
              LogReader.poll (list, read, verify the hash, decode) + per-token columns as flat numpy arrays
              (`per_token`: zero-copy views of the read buffer);
              records hold per-token fields as numpy arrays (hf backend, evaluator: torch -> numpy)
  arrow-list  the same with per-token fields as Python lists (vLLM hands over lists): adds conversion
  arrow-durable  arrow with log.durable_rename=true: the directory is fsync'd after every rename too
  jsonl       the Python-list records, json.dumps per record + fsync, json.loads per line
  parquet     the numpy records as Parquet (snappy, page checksums written and verified)
and the publish-to-consumer latency of a writer process and a polling LogReader in another process.

    python -m bench.bench_log            # full run (~1 min)
    python -m bench.bench_log --smoke    # tiny sizes, a few seconds (tests/bench/test_bench_smoke.py)
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing as mp
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from prime_values.log import LogReader, SegmentWriter, per_token, to_table
from prime_values.log.records import token_digest


def make_segments(n_segments, per_segment, n_tokens, seed=0):
    """Realistic records as an inference worker / evaluator hands them over: Python lists per rollout."""
    rng = np.random.default_rng(seed)
    prompt = n_tokens // 4
    segs = []
    for s in range(n_segments):
        rollouts, values = [], []
        for i in range(per_segment):
            rid = f"w0-{s}-{i}"
            mask = np.r_[np.zeros(prompt, np.int8), np.ones(n_tokens - prompt, np.int8)]
            rollouts.append(dict(
                rollout_id=rid, prompt_id=f"p{s}-{i // 8}", group_id=f"g{s}-{i // 8}", shard="w0", policy_version=s,
                token_ids=rng.integers(0, 151_000, n_tokens).tolist(), policy_mask=mask.tolist(),
                sampling_logprobs=(np.log(rng.random(n_tokens, np.float32)) * mask).tolist(),
                reward=float(rng.integers(0, 2)), stop_reason="eos", privileged="reference answer: 42",
                task=json.dumps({"task": "math", "idx": i}), created_at=time.time()))
            values.append(dict(rollout_id=rid, critic_version=s, values=rng.random(n_tokens, np.float32).tolist(),
                               cut=False, valued_tokens=n_tokens, bootstrap_value=0.0, scored_at=time.time(),
                               token_digest=token_digest(rollouts[-1]["token_ids"])))
        segs.append((rollouts, values))
    return segs


def fsync_write(path, data):
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def as_numpy(segs):
    def conv(row):
        return {k: np.asarray(v, dtype=DTYPES[k]) if k in DTYPES else v for k, v in row.items()}
    return [([conv(r) for r in rollouts], [conv(v) for v in values]) for rollouts, values in segs]


PER_TOKEN = ("token_ids", "policy_mask", "sampling_logprobs", "values")
DTYPES = {"token_ids": np.int32, "policy_mask": np.int8, "sampling_logprobs": np.float32, "values": np.float32}


def _tick():
    return time.perf_counter(), time.process_time()


def _spans(t0, t1, t2, n):
    """(write s, read s, bytes, CPU s of this process over both): wall clock is what the goals compare; CPU
    time tells the format's own cost apart from a disk that other jobs slow down."""
    return t1[0] - t0[0], t2[0] - t1[0], n, t2[1] - t0[1]


def run_raw(d, segs, sizes):
    blobs = [os.urandom(n) for n in sizes]
    t0 = _tick()
    for i, b in enumerate(blobs):
        fsync_write(d / f"{i}.bin", b)
    t1 = _tick()
    n = sum(len((d / f"{i}.bin").read_bytes()) for i in range(len(blobs)))
    return _spans(t0, t1, _tick(), n)


def run_raw_atomic(d, segs, sizes):
    blobs = [os.urandom(n) for n in sizes]
    t0 = _tick()
    for i, b in enumerate(blobs):
        fsync_write(d / f".{i}.tmp", b)
        os.replace(d / f".{i}.tmp", d / f"{i}.bin")
    t1 = _tick()
    n = sum(len((d / f"{i}.bin").read_bytes()) for i in range(len(blobs)))
    return _spans(t0, t1, _tick(), n)


def run_arrow(d, segs, sizes=None, durable=False):
    t0 = _tick()
    with SegmentWriter(d / "rollouts", "w0", "rollouts", durable) as wr, \
            SegmentWriter(d / "values", "w0", "values", durable) as wv:
        for rollouts, values in segs:
            wr.append(rollouts)
            wv.append(values)
    t1 = _tick()
    n_rows = 0
    for kind in ("rollouts", "values"):
        for seg in LogReader(d / kind, "bench", d / "cursors", kind).poll():
            for col in PER_TOKEN:
                if col in seg.table.column_names:  # flat numpy per-token arrays, ready for the consumer
                    per_token(seg.table, col)
            n_rows += seg.table.num_rows
    t2 = _tick()
    assert n_rows == 2 * sum(len(r) for r, _ in segs), "arrow bench lost rows"
    return _spans(t0, t1, t2, sum(p.stat().st_size for p in d.rglob("*.arrow")))


def run_jsonl(d, segs, sizes=None):
    t0 = _tick()
    for i, (rollouts, values) in enumerate(segs):
        fsync_write(d / f"{i}.jsonl", "\n".join(json.dumps(r) for r in rollouts + values).encode())
    t1 = _tick()
    n_rows = 0
    for i in range(len(segs)):
        n_rows += len([json.loads(line) for line in (d / f"{i}.jsonl").read_text().splitlines()])
    assert n_rows == 2 * sum(len(r) for r, _ in segs), "jsonl bench lost rows"
    return _spans(t0, t1, _tick(), sum(p.stat().st_size for p in d.glob("*.jsonl")))


def run_parquet(d, segs, sizes=None):
    t0 = _tick()
    for i, (rollouts, values) in enumerate(segs):
        for kind, rows in (("rollouts", rollouts), ("values", values)):
            path = d / f"{kind}-{i}.parquet"
            pq.write_table(to_table(kind, rows), path, write_page_checksum=True)
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    t1 = _tick()
    for p in sorted(d.glob("*.parquet")):
        t = pq.read_table(p, page_checksum_verification=True)
        for col in PER_TOKEN:
            if col in t.column_names:
                per_token(t, col)
    t2 = _tick()
    return _spans(t0, t1, t2, sum(p.stat().st_size for p in d.glob("*.parquet")))


def throughput(args, base):
    lists = make_segments(args.segments, args.per_segment, args.tokens)
    arrays = as_numpy(lists)
    probe = base / "probe"
    run_arrow(probe, arrays)  # warm-up, and the segment sizes the raw run writes
    sizes = sorted(p.stat().st_size for p in probe.rglob("*.arrow"))
    shutil.rmtree(probe)
    methods = {"raw": (run_raw, arrays), "raw-atomic": (run_raw_atomic, arrays), "arrow": (run_arrow, arrays),
               "arrow-list": (run_arrow, lists), "jsonl": (run_jsonl, lists), "parquet": (run_parquet, arrays),
               "arrow-durable": (functools.partial(run_arrow, durable=True), arrays)}
    res = {m: [] for m in methods}
    for rep in range(args.reps):
        order = list(methods) if rep % 2 == 0 else list(methods)[::-1]  # alternate, no method always first
        for m in order:
            d = base / f"{m}-{rep}"
            d.mkdir()
            fn, segs = methods[m]
            res[m].append(fn(d, segs, sizes))
            shutil.rmtree(d)
    return res


def writer_proc(stream_dir, n, interval_s, per_segment, n_tokens):
    segs = as_numpy(make_segments(1, per_segment, n_tokens, seed=1))[0][0]
    with SegmentWriter(Path(stream_dir), "w0", "rollouts") as w:
        for _ in range(n):
            t = time.time()
            w.append(segs)
            time.sleep(max(0.0, interval_s - (time.time() - t)))


def latency(args, base):
    """created_at (stamped when append starts) -> returned by poll() in another process."""
    stream = base / "lat" / "rollouts"
    stream.mkdir(parents=True)
    reader = LogReader(stream, "bench", base / "lat" / "cursors", "rollouts")
    proc = mp.get_context("spawn").Process(
        target=writer_proc, args=(str(stream), args.lat_segments, args.lat_interval, args.per_segment, args.tokens))
    proc.start()
    lat, deadline = [], time.time() + 60
    while len(lat) < args.lat_segments and time.time() < deadline:
        segs = reader.poll()
        now = time.time()
        lat += [now - s.created_at for s in segs]
        if not segs:
            time.sleep(0.005)
    proc.join()
    assert proc.exitcode == 0 and len(lat) == args.lat_segments, f"writer exit {proc.exitcode}, saw {len(lat)}"
    return np.array(lat) * 1e3


def med(xs):
    return f"{statistics.median(xs):8.2f} [{min(xs):.2f}-{max(xs):.2f}]"


def measure(argv: list[str] | None = None):
    """Parse `argv`, run the throughput and latency measurements; returns (args, res, lat)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds")
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir; put it on the run's filesystem)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--segments", type=int, default=24)
    ap.add_argument("--per-segment", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--lat-segments", type=int, default=200)
    ap.add_argument("--lat-interval", type=float, default=0.05)
    args = ap.parse_args(argv)
    if args.smoke:
        args.reps, args.segments, args.per_segment, args.tokens = 2, 3, 8, 128
        args.lat_segments, args.lat_interval = 5, 0.02
    base = Path(tempfile.mkdtemp(prefix="bench_log_", dir=args.dir))
    try:
        res = throughput(args, base)
        lat = latency(args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    args.base = base
    return args, res, lat


def paired(res, a: str, b: str) -> list[float]:
    """Per repetition: time(b) / time(a) of write+read (how many times faster a is than b)."""
    t = {m: [r[0] + r[1] for r in runs] for m, runs in res.items()}
    return [x / y for x, y in zip(t[b], t[a])]


def bench_rows(smoke: bool = False) -> list[dict]:
    """The rows of `python -m bench` (bench/run_all.py): log vs raw disk, vs JSONL, and publish latency."""
    args, res, lat = measure(["--smoke"] if smoke else [])
    rows = []
    for method, base, goal in (("arrow", "raw", 0.5), ("arrow", "jsonl", 10.0), ("arrow-list", "jsonl", 10.0)):
        xs = paired(res, method, base)
        n_rec = 2 * args.segments * args.per_segment

        def rate(m):  # MB/s of the method's own bytes against raw disk, krecords/s against another format
            return statistics.median((r[2] / 1e6 if base == "raw" else n_rec / 1e3) / (r[0] + r[1]) for r in res[m])
        rows.append({"measure": f"log: {method} vs {base} (write+read {'MB' if base == 'raw' else 'krecords'}/s)",
                     "ours": rate(method), "baseline": rate(base), "unit": "MB/s" if base == "raw" else "krec/s",
                     "ratio": statistics.median(xs),
                     "spread": [min(xs), max(xs)], "goal": f">= {goal:g}", "met": statistics.median(xs) >= goal,
                     "reps": len(xs)})
    p50 = float(np.percentile(lat, 50))
    rows.append({"measure": "log: publish -> seen latency p50 (ms)", "ours": p50, "baseline": None, "unit": "ms",
                 "ratio": None, "spread": [float(lat.min()), float(lat.max())], "goal": "p50 <= 50 ms",
                 "met": p50 <= 50, "reps": len(lat)})
    return rows


def main():
    args, res, lat = measure()
    base = args.base

    n_rec = 2 * args.segments * args.per_segment
    arrow_mb = res["arrow"][0][2] / 1e6
    print(f"rollout log bench: {args.segments} segments x {args.per_segment} rollouts x {args.tokens} tokens "
          f"(+ a values segment each), {args.reps} alternating reps, {arrow_mb:.1f} MB of segments, dir {base.parent}")
    print("median [min-max] over reps; MB/s of each method's own bytes; CPU ms: this process's CPU time over the "
          "timed write+read (the format's own cost; the rest of the wall time is waiting on the disk)")
    cols = ("write MB/s", "read MB/s", "write+read MB/s", "krecords/s", "CPU ms (w+r)")
    print(f"{'method':<10} {'size MB':>8} " + " ".join(f"{c:>22}" for c in cols))
    for m, runs in res.items():
        size = runs[0][2] / 1e6
        w = [r[2] / 1e6 / r[0] for r in runs]
        rd = [r[2] / 1e6 / r[1] for r in runs]
        wr = [r[2] / 1e6 / (r[0] + r[1]) for r in runs]
        krec = [n_rec / 1e3 / (r[0] + r[1]) for r in runs]
        cpu = [r[3] * 1e3 for r in runs]
        print(f"{m:<10} {size:8.2f} {med(w):>22} {med(rd):>22} {med(wr):>22} {med(krec):>22} {med(cpu):>22}")
    t = {m: [r[0] + r[1] for r in runs] for m, runs in res.items()}
    ratio = lambda a, b: [x / y for x, y in zip(t[b], t[a])]  # paired per rep: time(b) / time(a)
    ok = lambda xs, goal: f"goal >= {goal}  {'PASS' if statistics.median(xs) >= goal else 'MISS'}"
    # raw and arrow move the same bytes, all methods the same records: ratios of write+read time
    for a in ("arrow", "arrow-list", "arrow-durable"):
        print(f"ratio {a:<10} / raw fsync'd disk (write+read throughput): {med(ratio(a, 'raw'))}  "
              f"{ok(ratio(a, 'raw'), 0.5)}")
        print(f"ratio {a:<10} / raw-atomic (same bytes, protocol only):   {med(ratio(a, 'raw-atomic'))}")
        print(f"ratio {a:<10} / jsonl (records per second, write+read):   {med(ratio(a, 'jsonl'))}  "
              f"{ok(ratio(a, 'jsonl'), 10)}")
    print(f"ratio arrow      / parquet (records per second, write+read): {med(ratio('arrow', 'parquet'))}  "
          f"(parquet: {res['parquet'][0][2] / res['arrow'][0][2]:.2f}x the bytes)")
    p50, p99 = np.percentile(lat, 50), np.percentile(lat, 99)
    print(f"latency publish->seen: p50 {p50:.1f} ms  p99 {p99:.1f} ms  max {lat.max():.1f} ms  (n={len(lat)}, "
          f"writer every {args.lat_interval * 1e3:.0f} ms in another process, reader sleeps 5 ms when idle)  "
          f"goal p50 <= 50 ms  {'PASS' if p50 <= 50 else 'MISS'}")


if __name__ == "__main__":
    main()
