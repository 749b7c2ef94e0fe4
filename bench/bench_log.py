"""Rollout-log benchmark: is the Arrow IPC log fast enough to be the bus? (docs/benchmarks.md)

Measured side by side in one run, methods alternating within each repetition, on the same disk:
  raw       the segment bytes written to files with fsync, then read back: the ceiling
  arrow     the log itself: SegmentWriter.append (rows -> Arrow, crc32, fsync, rename) + LogReader.poll
            (read, verify crc32, decode) and the per-token columns as numpy arrays
  jsonl     json.dumps per record + fsync, json.loads per line: the naive baseline
  parquet   the same tables as Parquet (snappy, page checksums written and verified)
and the publish-to-consumer latency of a writer process and a polling LogReader in another process.

    python bench/bench_log.py            # full run (~1 min)
    python bench/bench_log.py --smoke    # tiny sizes, a few seconds (tests/test_bench_smoke.py)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from prime_values.log import LogReader, SegmentWriter, to_table  # noqa: E402


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
                               cut=False, scored_at=time.time()))
        segs.append((rollouts, values))
    return segs


def fsync_write(path, data):
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def run_raw(d, segs, sizes):
    blobs = [os.urandom(n) for n in sizes]
    t0 = time.perf_counter()
    for i, b in enumerate(blobs):
        fsync_write(d / f"{i}.bin", b)
    t1 = time.perf_counter()
    n = sum(len((d / f"{i}.bin").read_bytes()) for i in range(len(blobs)))
    return t1 - t0, time.perf_counter() - t1, n


def run_arrow(d, segs, sizes=None):
    t0 = time.perf_counter()
    with SegmentWriter(d / "rollouts", "w0", "rollouts") as wr, SegmentWriter(d / "values", "w0", "values") as wv:
        for rollouts, values in segs:
            wr.append(rollouts)
            wv.append(values)
    t1 = time.perf_counter()
    n_rows = 0
    for kind in ("rollouts", "values"):
        for seg in LogReader(d / kind, "bench", d / "cursors", kind).poll():
            for col in ("token_ids", "policy_mask", "sampling_logprobs", "values"):
                if col in seg.table.column_names:  # flat numpy per-token arrays, ready for the consumer
                    seg.table.column(col).combine_chunks().values.to_numpy()
            n_rows += seg.table.num_rows
    assert n_rows == 2 * sum(len(r) for r, _ in segs), "arrow bench lost rows"
    n = sum(p.stat().st_size for p in d.rglob("*.arrow"))
    return t1 - t0, time.perf_counter() - t1, n


def run_jsonl(d, segs, sizes=None):
    t0 = time.perf_counter()
    for i, (rollouts, values) in enumerate(segs):
        fsync_write(d / f"{i}.jsonl", "\n".join(json.dumps(r) for r in rollouts + values).encode())
    t1 = time.perf_counter()
    n_rows = sum(len([json.loads(line) for line in (d / f"{i}.jsonl").read_text().splitlines()]) for i in range(len(segs)))
    assert n_rows == 2 * sum(len(r) for r, _ in segs), "jsonl bench lost rows"
    return t1 - t0, time.perf_counter() - t1, sum(p.stat().st_size for p in d.glob("*.jsonl"))


def run_parquet(d, segs, sizes=None):
    t0 = time.perf_counter()
    for i, (rollouts, values) in enumerate(segs):
        for kind, rows in (("rollouts", rollouts), ("values", values)):
            path = d / f"{kind}-{i}.parquet"
            pq.write_table(to_table(kind, rows), path, write_page_checksum=True)
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    t1 = time.perf_counter()
    for p in sorted(d.glob("*.parquet")):
        t = pq.read_table(p, page_checksum_verification=True)
        for col in ("token_ids", "policy_mask", "sampling_logprobs", "values"):
            if col in t.column_names:
                t.column(col).combine_chunks().values.to_numpy()
    return t1 - t0, time.perf_counter() - t1, sum(p.stat().st_size for p in d.glob("*.parquet"))


def throughput(args, base):
    segs = make_segments(args.segments, args.per_segment, args.tokens)
    probe = base / "probe"
    run_arrow(probe, segs)  # warm-up, and the segment sizes the raw run writes
    sizes = sorted(p.stat().st_size for p in probe.rglob("*.arrow"))
    shutil.rmtree(probe)
    methods = {"raw": run_raw, "arrow": run_arrow, "jsonl": run_jsonl, "parquet": run_parquet}
    res = {m: [] for m in methods}
    for rep in range(args.reps):
        order = list(methods) if rep % 2 == 0 else list(methods)[::-1]  # alternate, no method always first
        for m in order:
            d = base / f"{m}-{rep}"
            d.mkdir()
            res[m].append(methods[m](d, segs, sizes))
            shutil.rmtree(d)
    return segs, res


def writer_proc(stream_dir, n, interval_s, per_segment, n_tokens):
    segs = make_segments(1, per_segment, n_tokens, seed=1)[0][0]
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds")
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir; put it on the run's filesystem)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--segments", type=int, default=24)
    ap.add_argument("--per-segment", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--lat-segments", type=int, default=200)
    ap.add_argument("--lat-interval", type=float, default=0.05)
    args = ap.parse_args()
    if args.smoke:
        args.reps, args.segments, args.per_segment, args.tokens = 2, 3, 8, 128
        args.lat_segments, args.lat_interval = 5, 0.02
    base = Path(tempfile.mkdtemp(prefix="bench_log_", dir=args.dir))
    try:
        segs, res = throughput(args, base)
        lat = latency(args, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    n_rec = 2 * args.segments * args.per_segment
    arrow_mb = res["arrow"][0][2] / 1e6
    print(f"rollout log bench: {args.segments} segments x {args.per_segment} rollouts x {args.tokens} tokens "
          f"(+ a values segment each), {args.reps} alternating reps, {arrow_mb:.1f} MB of segments, dir {base.parent}")
    print("median [min-max] over reps; MB/s of each method's own bytes")
    print(f"{'method':<10} {'size MB':>8} {'write MB/s':>22} {'read MB/s':>22} {'write+read MB/s':>22} {'krecords/s':>22}")
    for m, runs in res.items():
        size = runs[0][2] / 1e6
        w = [r[2] / 1e6 / r[0] for r in runs]
        rd = [r[2] / 1e6 / r[1] for r in runs]
        wr = [r[2] / 1e6 / (r[0] + r[1]) for r in runs]
        krec = [n_rec / 1e3 / (r[0] + r[1]) for r in runs]
        print(f"{m:<10} {size:8.2f} {med(w):>22} {med(rd):>22} {med(wr):>22} {med(krec):>22}")
    t = {m: [r[0] + r[1] for r in runs] for m, runs in res.items()}
    # same bytes for raw and arrow, same records for all: paired per-rep ratios of write+read time
    vs_raw = [r / a for r, a in zip(t["raw"], t["arrow"])]
    vs_json = [j / a for j, a in zip(t["jsonl"], t["arrow"])]
    vs_pq = [p / a for p, a in zip(t["parquet"], t["arrow"])]
    ok = lambda c: "PASS" if c else "MISS"  # noqa: E731
    print(f"ratio arrow log / raw fsync'd disk (write+read throughput): {med(vs_raw)}  goal >= 0.5  "
          f"{ok(statistics.median(vs_raw) >= 0.5)}")
    print(f"ratio arrow log / jsonl (records per second, write+read):   {med(vs_json)}  goal >= 10  "
          f"{ok(statistics.median(vs_json) >= 10)}")
    print(f"ratio arrow log / parquet (records per second, write+read): {med(vs_pq)}  "
          f"(parquet is {res['parquet'][0][2] / res['arrow'][0][2]:.2f}x the bytes)")
    p50, p99 = np.percentile(lat, 50), np.percentile(lat, 99)
    print(f"latency publish->seen: p50 {p50:.1f} ms  p99 {p99:.1f} ms  max {lat.max():.1f} ms  (n={len(lat)}, "
          f"writer every {args.lat_interval * 1e3:.0f} ms in another process, reader sleeps 5 ms when idle)  "
          f"goal p50 <= 50 ms  {ok(p50 <= 50)}")


if __name__ == "__main__":
    main()
