"""docs/rollouts.md cannot rot: its Python blocks run as they stand (only the `run = ...` line points at a real
small run directory), and what pyarrow computed must agree with what Hugging Face `datasets` computed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "rollouts.md"
def doc_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def test_the_doc_has_the_examples():
    blocks = doc_blocks()
    assert len(blocks) == 3
    assert sum(line.startswith("run = ") for block in blocks for line in block.splitlines()) == 1
    text = "".join(blocks)
    assert 'ds.dataset(f"{run}/log/rollouts", format="arrow")' in text
    assert 'load_dataset("arrow", data_files=f"{run}/log/rollouts/*/*.arrow", split="train")' in text


@pytest.mark.slow
def test_documented_code_runs_and_agrees(small_run, tmp_path_factory, monkeypatch, capsys):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("hf_datasets_cache")))
    run = small_run
    namespace: dict = {}
    for block in doc_blocks():
        code = re.sub(r"^run = .*$", f"run = {str(run)!r}", block, flags=re.M)
        exec(compile(code, str(DOC), "exec"), namespace)
    printed = capsys.readouterr().out
    ns = namespace

    table, hf = ns["table"], ns["hf"]
    assert table.num_rows == len(hf) >= 3 * 16, "the run logged fewer rollouts than its 3 batches need"
    assert sorted(table["rollout_id"].to_pylist()) == sorted(hf["rollout_id"])
    assert f"{table.num_rows} rollouts;" in printed

    # the reward filter: same rollouts both ways, and there is something on each side of it
    solved_ids = sorted(ns["solved"]["rollout_id"].to_pylist())
    assert solved_ids == sorted(ns["hf_solved"]["rollout_id"])
    assert 0 < len(solved_ids) < table.num_rows, "the run should have solved some rollouts and failed others"
    assert all(r >= 1.0 for r in ns["solved"]["reward"].to_pylist())
    assert len(ns["sft"]) == len(solved_ids) and ns["sft"].column_names == ["prompt", "completion"]

    # per-prompt pass rates: pyarrow's group_by == pandas' groupby over the datasets rows
    pa_rates = dict(zip(ns["pass_rates"]["prompt_id"].to_pylist(), ns["pass_rates"]["passed_mean"].to_pylist()))
    hf_rates = ns["hf_pass_rates"].to_dict()
    assert pa_rates.keys() == hf_rates.keys()
    assert all(abs(pa_rates[p] - hf_rates[p]) < 1e-12 for p in pa_rates)  # float64 means of a few 0/1 values
    assert sum(ns["pass_rates"]["passed_count"].to_pylist()) == table.num_rows
    assert sum(rate * n for rate, n in zip(ns["pass_rates"]["passed_mean"].to_pylist(),
                                           ns["pass_rates"]["passed_count"].to_pylist())) == \
        pytest.approx(len(solved_ids))

    # the batch join and the tokenizer
    batched = set(ns["batches"]["rollout_id"].to_pylist())
    assert ns["trained"].num_rows == len(batched) == 3 * 16  # 3 steps x 4 prompts x 4 completions
    assert ns["tokenizer"].decode(ns["first"]["token_ids"]).startswith(
        __import__("json").loads(ns["first"]["task"])["prompt"])
