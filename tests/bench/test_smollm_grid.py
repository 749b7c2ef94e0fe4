"""bench/smollm_grid.py: a finished run becomes a record once, and cells compare with the reference paired by seed
and, where per-problem rewards are kept, by (seed, problem): hand-worked numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import smollm_grid as sg


def heldout(run: Path, step: int, correct: list[int]) -> None:
    d = run / "metrics" / "heldout"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"step_{step}.jsonl").write_text("".join(
        json.dumps({"prompt_id": f"p{i}", "reward": float(c), "parsable": True}) + "\n" for i, c in enumerate(correct)))


def finished_run(run: Path, start: list[int], end: list[int]) -> None:
    heldout(run, 0, start)
    heldout(run, 7, end)
    (run / "report").mkdir(parents=True)
    (run / "report" / "summary.json").write_text(json.dumps({"status": "finished", "policy_steps": 7}))


def test_a_finished_run_in_out_is_recorded_once_and_compared_with_the_reference(tmp_path):
    out, records = tmp_path / "out", tmp_path / "records"
    start = [1, 0, 0, 0]
    finished_run(out / "gae_g1" / "seed0", start, [1, 1, 0, 0])   # +1/4
    finished_run(out / "mean_g1" / "seed0", start, [1, 1, 1, 0])  # +2/4
    args = sg.argparse.Namespace(out=str(out), stop_after=None)
    assert sg.run_cells(args, ["gae_g1", "mean_g1"], [0], records) == 0
    rec = json.loads((records / "mean_g1" / "seed0.json").read_text())
    assert rec["paired"]["gain"] == pytest.approx(0.5) and rec["overrides"] == ["advantage=batch_mean"]
    assert rec["rewards_end"] == {"p0": 1.0, "p1": 1.0, "p2": 1.0, "p3": 0.0}
    assert rec["command"] == "python -m prime_values +experiment=smollm seed=0 advantage=batch_mean"

    # seed 1: the reference gains more than the control (the comparison can come out negative)
    finished_run(out / "gae_g1" / "seed1", start, [1, 1, 1, 1])   # +3/4
    finished_run(out / "mean_g1" / "seed1", start, [1, 0, 0, 1])  # +1/4
    (records / "mean_g1" / "seed0.json").write_text(json.dumps({**rec, "note": "kept"}))
    assert sg.run_cells(args, ["gae_g1", "mean_g1"], [0, 1], records) == 0
    assert json.loads((records / "mean_g1" / "seed0.json").read_text())["note"] == "kept"  # not made again

    runs = sg.load_records(records)
    cmp = sg.compare(runs["mean_g1"], runs["gae_g1"])
    # per seed mean_g1 - gae_g1: 0.5 - 0.25 = +0.25, 0.25 - 0.75 = -0.5; mean -0.125
    assert cmp["per_seed"] == pytest.approx([0.25, -0.5]) and cmp["mean"] == pytest.approx(-0.125)
    # by problem, end minus end: seed 0 (0, 0, +1, 0), seed 1 (0, -1, -1, 0): 1 won, 2 lost, mean -1/8
    q = cmp["problems"]
    assert (q["pairs"], q["wins"], q["losses"]) == (8, 1, 2) and q["mean"] == pytest.approx(-0.125)
    assert q["mcnemar_p"] == pytest.approx(1.0)  # 2 * P(X <= 1 | n = 3) = 2 * 4/8, capped at 1
    table = sg.report(records, "gae_g1")
    assert "| mean_g1 | 0,1 |" in table and "-0.125" in table


def test_an_unfinished_run_is_not_recorded_and_an_unknown_cell_is_named(tmp_path):
    with pytest.raises(SystemExit, match="unknown \\['gae_g9'\\]"):
        sg.main(["--out", str(tmp_path), "--cells", "gae_g9", "--records", str(tmp_path / "r")])
    run = tmp_path / "out" / "gae_g1" / "seed0"
    heldout(run, 0, [1, 0])  # no end evaluation, no summary
    assert not sg.finished(run)


def test_a_cell_with_avx2_kernels_records_its_environment_and_no_bf16(tmp_path):
    """mean_g1_avx2 holds oneDNN to AVX2, so its processes may not multiply bf16 even on a CPU that can; the record
    says so and keeps the environment in its command."""
    out, records = tmp_path / "out", tmp_path / "records"
    finished_run(out / "mean_g1_avx2" / "seed0", [0, 0, 1, 0], [1, 0, 1, 0])
    args = sg.argparse.Namespace(out=str(out), stop_after=None)
    assert sg.run_cells(args, ["mean_g1_avx2"], [0], records) == 0
    rec = json.loads((records / "mean_g1_avx2" / "seed0.json").read_text())
    assert rec["cpu_bf16"] is False and rec["env"]["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert rec["command"] == ("ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 "
                              "python -m prime_values +experiment=smollm seed=0 advantage=batch_mean")

    # its SFT'd start differs from the reference's (other kernels round differently): paired by seed, not by problem
    finished_run(out / "mean_g1" / "seed0", [1, 0, 0, 0], [1, 1, 0, 0])
    assert sg.run_cells(args, ["mean_g1"], [0], records) == 0
    runs = sg.load_records(records)
    cmp = sg.compare(runs["mean_g1_avx2"], runs["mean_g1"])
    assert cmp["per_seed"] == pytest.approx([0.25 - 0.25]) and "problems" not in cmp
