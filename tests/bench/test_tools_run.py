"""bench/tools_run.py on hand-made run directories (no run is started): a record holds the held-out breakdown by kind
at the start and the end, the critic's explained variance, where version 0 came from and its digest, the launch's
command and load; the report pairs two labels by seed with a t-interval."""

from __future__ import annotations

import json
from pathlib import Path

from bench import tools_run
from prime_values.tasks import ToolsTask

TASK = dict(name="tools", kinds="calc,look,both,none", num_keys=50, calc_digits=2, max_arg_digits=4,
            max_call_chars=24, max_turns=4, privileged_fact=False, heldout_size=8, seed=7)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _jsonl(path: Path, rows: list[dict]) -> None:
    _write(path, "".join(json.dumps(r) + "\n" for r in rows))


def _run_dir(root: Path, right: int, estimator: str = "gae", cached: bool = False) -> Path:
    """A finished 50-step run: at step 0 every problem answered wrongly with no call; at step 50 the first `right`
    held-out problems answered by their demonstration (the right tools), the rest as at step 0."""
    task = ToolsTask(**{k: v for k, v in TASK.items() if k != "name"})
    run = root / "seed0"
    _write(run / "config.yaml", json.dumps({"steps": 50, "eval_every": 25, "advantage": {"estimator": estimator},
                                            "inference": {"max_new_tokens": 12}, "task": TASK}))
    wrong = [{"prompt_id": p.prompt_id, "reward": 0.0, "response": "ans(1)"} for p in task.heldout()]
    solved = [{"prompt_id": p.prompt_id, "reward": 1.0,
               "response": "\n".join(t for t, policy in task.demonstration(p) if policy)} for p in task.heldout()]
    _jsonl(run / "metrics" / "heldout" / "step_000000.jsonl", wrong)
    _jsonl(run / "metrics" / "heldout" / "step_000050.jsonl", solved[:right] + wrong[right:])
    _jsonl(run / "metrics" / "policy_trainer.jsonl",
           [{"time": 100.0, "step": 0, "heldout_accuracy": 0.0}]
           + [{"time": 100.0 + 2 * s, "step": s, "train_s": 1.5} for s in range(1, 51)]
           + [{"time": 150.0, "step": 25, "heldout_accuracy": 0.25}, {"time": 201.0, "step": 50,
                                                                         "heldout_accuracy": right / 8}])
    _jsonl(run / "metrics" / "orchestrator.jsonl",
           [{"step": s, "critic_explained_variance": 0.1 if s <= 10 else 0.5} for s in range(1, 51)])
    _jsonl(run / "metrics" / "warm_start.jsonl", [{"sft_s": 10.0, **({"cached_from": "/c"} if cached else {})}])
    _write(run / "weights" / "policy" / "0" / "model.bin", "policy v0")
    _write(run / "weights" / "critic" / "0" / "model.bin", "critic v0")
    _write(run / "report" / "summary.json", json.dumps({
        "status": "finished", "policy_steps": 50, "warm_start_accuracy": 0.0, "first_rl_step_accuracy": 0.0,
        "final_accuracy": right / 8, "final_explained_variance": 0.5, "wall_s": 101.0, "waited": {"rl_s": 101.0}}))
    return run


def test_a_record_of_a_run_by_hand(tmp_path):
    run = _run_dir(tmp_path / "gae", right=6)
    _write(run / tools_run.LAUNCH, json.dumps({"wall_s": 130.0, "load_avg_start": [2.0, 2.5, 3.0],
                                               "command": {"argv": ["python", "-m", "prime_values"]}}))
    rec = tools_run.with_launch(tools_run.record(run, "gae", 0), run)
    assert (rec["advantage"], rec["policy_steps"], rec["warm_start"], rec["heldout_problems"]) == ("gae", 50, "made", 8)
    assert (rec["start_accuracy"], rec["final_accuracy"], rec["gain"]) == (0.0, 0.75, 0.75)
    assert rec["curve"] == [[0, 0.0], [25, 0.25], [50, 0.75]] and rec["endpoint"] is None  # 2 evaluations after 0
    # the first 6 held-out problems: both calc, both look, both both; the none ones stay wrong, without a call
    assert rec["start"]["right_tools"] == 0.0 and rec["final"]["right_tools"] == 1.0
    assert {k: v["accuracy"] for k, v in rec["final"]["kinds"].items()} == {"calc": 1.0, "look": 1.0, "both": 1.0,
                                                                            "none": 0.0}
    assert rec["final"]["kinds"]["none"]["any_tool"] == 0.0 and sorted(rec["heldout"]) == ["0", "50"]
    assert abs(rec["ev_first"] - 0.1) < 1e-12 and rec["ev_final"] == 0.5
    assert rec["wall_s"] == 130.0 and rec["load_avg_start"] == [2.0, 2.5, 3.0] and rec["step_wall_s"] == 2.0
    assert rec["step_s"] == 1.5 and len(rec["v0_sha"]) == 12


def test_the_report_pairs_two_labels_by_seed(tmp_path, capsys):
    records = tmp_path / "records"
    for label, right, estimator, cached in (("gae", 6, "gae", False), ("grpo", 4, "grpo", True)):
        for seed in (0, 1, 2):
            run = _run_dir(tmp_path / f"{label}{seed}", right=right + (seed == 2), estimator=estimator,
                           cached=cached)
            _write(records / label / f"seed{seed}.json", json.dumps({**tools_run.record(run, label, seed),
                                                                     "seed": seed}))
    recs = [json.loads(p.read_text()) for p in sorted(records.glob("*/seed*.json"))]
    assert {r["warm_start"] for r in recs if r["label"] == "grpo"} == {"cache"}
    assert len({r["v0_sha"] for r in recs}) == 1  # the same version 0 bytes
    tools_run.report(records, None, ["gae", "grpo"])
    out = capsys.readouterr().out
    assert "| gae | 0 | gae | 50 | 0.000 -> 0.750 (+0.750) |" in out
    # grpo - gae = (4 - 6) / 8 at every seed: the mean -0.25, SD 0, the interval a point
    assert "final_accuracy: -0.250 -0.250 -0.250 -> mean -0.250 [-0.250, -0.250], SD 0.000, verdict at +-0.02: " \
           "worse" in out
