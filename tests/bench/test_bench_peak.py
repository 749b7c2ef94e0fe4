"""bench/bench_peak.py still runs end to end (tiny sizes) and prints the peak, every role's share of it and the
padded / packed comparison; bench/readme_run.py turns a run directory into its record."""

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_peak_smoke(tmp_path):
    out = subprocess.run([sys.executable, "-m", "bench.bench_peak", "--smoke", "--json", str(tmp_path / "peak.json")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert re.search(r"matmul peak fp32, 1 thread\(s\): \d+\.\d GFLOP per CPU second", out.stdout), out.stdout
    for role in ("warm start SFT step", "policy_trainer step", "value_trainer critic step", "evaluator scoring",
                 "inference generation"):
        for layout in ("padded", "packed"):
            assert re.search(rf"{re.escape(role)}[^\n]* {layout} +\d+\.\d+ +\d+\.\d+ +\d+\.\d%", out.stdout), \
                (role, layout, out.stdout)
    result = json.loads((tmp_path / "peak.json").read_text())
    roles = result["roles"]
    assert len(roles) == 10 and all(0 < r["padding_factor"] <= 1 and r["seconds"] > 0 for r in roles)
    for r in roles:  # the achieved fraction is the product of its three measured parts
        if r["gemm_share_of_time"] < 1:
            parts = r["padding_factor"] * r["gemm_efficiency"] * r["gemm_share_of_time"]
            assert abs(parts - r["fraction_of_peak"]) < 1e-6 * max(1.0, parts)
