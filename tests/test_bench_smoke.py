"""The log benchmark still runs end to end (tiny sizes) and prints its ratio lines."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_log_smoke():
    out = subprocess.run([sys.executable, "bench/bench_log.py", "--smoke"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for pattern in (r"ratio arrow +/ raw fsync'd disk .*: +\d+\.\d+ \[",
                    r"ratio arrow +/ jsonl .*: +\d+\.\d+ \[",
                    r"ratio arrow +/ parquet .*: +\d+\.\d+ \[",
                    r"latency publish->seen: p50 \d+\.\d+ ms +p99 \d+\.\d+ ms"):
        assert re.search(pattern, out.stdout), f"missing {pattern!r} in:\n{out.stdout}"
