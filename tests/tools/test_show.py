"""`python -m prime_values.tools.show`: a hand-built run directory (log segments written by the real writers, the
run's char tokenizer saved like a policy version) with known values and advantages, so the printed numbers
can be checked exactly; hostile strings check the escaping; one test runs it on a real small run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from prime_values.config import Config
from prime_values.log import SegmentWriter
from prime_values.models.tokenizer import build_char_tokenizer
from prime_values.tools.show import main, token_pieces, value_steps
from tests import log_rows

REPO = Path(__file__).resolve().parents[2]
HOSTILE = "<script>alert(1)</script>\x1b[31mred\u202e"


def rollout(tok, rid, prompt, response, reward, privileged="3", policy_version=3, eos=True):
    p, r = tok.encode(prompt), tok.encode(response) + ([tok.eos_token_id] if eos else [])
    return log_rows.row(
        "rollouts", rollout_id=rid, prompt_id="p-" + rid, group_id="g0", shard="w0", policy_version=policy_version,
        token_ids=p + r, policy_mask=[0] * len(p) + [1] * len(r), sampling_logprobs=[0.0] * len(p) + [-0.5] * len(r),
        reward=reward, stop_reason="eos" if eos else "length", privileged=privileged,
        task='{"prompt": "%s", "answer": "3"}' % prompt, created_at=1.0)


def values_row(r, response_values, critic_version=7, valued=None):
    n_prompt = r["policy_mask"].index(1)
    values = [0.0] * n_prompt + response_values
    return log_rows.row("values", rollout_id=r["rollout_id"], critic_version=critic_version, values=values,
                        cut=valued is not None, valued_tokens=len(values) if valued is None else valued, scored_at=2.0)


def batch_row(r, response_advantages, step=5, critic_version=7):
    n_prompt = r["policy_mask"].index(1)
    same = ("rollout_id", "policy_version", "token_ids", "policy_mask", "sampling_logprobs", "reward")
    return log_rows.row("batches", **{k: r[k] for k in same}, step=step, critic_version=critic_version,
                        advantages=[0.0] * n_prompt + response_advantages)


def make_run(root: Path, with_batches: bool = True) -> Path:
    tok = build_char_tokenizer()
    tok.save_pretrained(root / "weights" / "policy" / "0")
    OmegaConf.save(OmegaConf.structured(Config), root / "config.yaml")
    good = rollout(tok, "w0-000000-0000", "1+2=", "3", 1.0)  # tokens 3, <eos>
    bad = rollout(tok, "w0-000000-0001", "1+2=", "4x", 0.0)  # tokens 4, x, <eos>
    hostile = rollout(tok, "w0-000000-0002", "1+2=", "<b>&\"'", 0.0, privileged=HOSTILE, eos=False)
    unscored = rollout(tok, "w0-000000-0003", "1+2=", "9", 0.0)
    with SegmentWriter(root / "log" / "rollouts", "w0", "rollouts") as w:
        w.append([good, bad])
        w.append([hostile, unscored])
    with SegmentWriter(root / "log" / "values", "e0", "values") as w:
        w.append([values_row(good, [0.5, 0.9]), values_row(bad, [0.5, 0.2, 0.1])])
        w.append([values_row(hostile, [0.4, 0.3, 0.2, 0.1, 0.05, 0.0], valued=8)])  # the critic saw 2 response tokens
    if with_batches:
        with SegmentWriter(root / "log" / "batches", "main", "batches") as w:
            w.append([batch_row(good, [0.5, 0.1]), batch_row(bad, [-0.5, -0.2, -0.1])], seq=4)
    return root


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("show") / "run")


def show(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_plain_markers_and_header(run, capsys):
    code, out, err = show(capsys, run, "--rollout", "w0-000000-0001", "--color", "never")
    assert code == 0, err
    assert "4[v=0.50 a=-0.50] x[v=0.20 a=-0.20] <eos>[v=0.10 a=-0.10]" in out
    assert "reward 0.000   stop eos   policy version 3" in out
    assert "critic version 7" in out and "batch    step 5 (1 step(s) off-policy, critic version 7)" in out
    assert "prompt      1+2=" in out and "privileged  3" in out and "response    4x<eos>" in out
    assert "largest value drop: token 0 '4' took the value from 0.500 to 0.200 (-0.300)" in out
    page = run / "report" / "rollout_w0-000000-0001.html"
    assert f"html        {page}" in out and page.exists()


def test_worst_and_best_by_advantage_sum(run, capsys):
    assert "rollout w0-000000-0001 " in show(capsys, run, "--color", "never")[1]  # --worst is the default
    assert "rollout w0-000000-0001 " in show(capsys, run, "--worst", "--color", "never")[1]  # sum -0.8
    assert "rollout w0-000000-0000 " in show(capsys, run, "--best", "--color", "never")[1]  # sum +0.6


def test_without_batches_worst_is_the_biggest_value_drop(tmp_path, capsys):
    run = make_run(tmp_path / "run", with_batches=False)
    assert "rollout w0-000000-0001 " in show(capsys, run, "--worst", "--color", "never")[1]  # -0.3 at '4'
    assert "rollout w0-000000-0000 " in show(capsys, run, "--best", "--color", "never")[1]  # +0.4 at '3'


def test_missing_batch_and_values_are_said(run, capsys):
    out = show(capsys, run, "--rollout", "w0-000000-0003", "--color", "never")[1]
    assert "never reached a batch" in out and "the evaluator has not scored this rollout" in out
    assert "9[v=- a=-]" in out
    out = show(capsys, run, "--rollout", "w0-000000-0002", "--color", "never")[1]
    assert "cut by the critic's context after 8 tokens" in out  # tokens past the cut have no value
    assert "<[v=0.40 a=-] b[v=0.30 a=-] >[v=0.20 a=-] &[v=0.10 a=-] \"[v=- a=-] '[v=- a=-]" in out


def test_untrusted_text_is_escaped(run, capsys):
    for color in ("never", "always"):
        code, out, _ = show(capsys, run, "--rollout", "w0-000000-0002", "--color", color)
        assert code == 0
        line = next(x for x in out.splitlines() if x.startswith("privileged"))
        assert line == "privileged  <script>alert(1)</script>\\x1b[31mred\\u202e"  # no raw ESC / bidi override
    page = (run / "report" / "rollout_w0-000000-0002.html").read_text()
    assert "<script" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "\x1b" not in page and "\u202e" not in page
    assert "&lt;b&gt;" in "".join(re.findall(r"<span[^>]*>([^<]*)</span>", page))  # the response tokens
    assert "Content-Security-Policy" in page and "default-src 'none'" in page


def test_colours_on_a_terminal(run, capsys):
    out = show(capsys, run, "--rollout", "w0-000000-0000", "--color", "always")[1]
    assert "\x1b[48;2;" in out and "[v=" not in out
    assert "values      0.50 0.90" in out and "advantages  +0.50 +0.10" in out


def test_html_path_option(run, tmp_path, capsys):
    page = tmp_path / "deep" / "page.html"
    assert show(capsys, run, "--rollout", "w0-000000-0000", "--html", page)[0] == 0
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and "w0-000000-0000" in text and "0.9000" in text


def test_errors_are_one_line_with_exit_2(run, tmp_path, capsys):
    code, out, err = show(capsys, run, "--rollout", "nope")
    assert code == 2 and not out and len(err.strip().splitlines()) == 1
    assert f"rollout 'nope' is not in {run}/log/rollouts (4 rollouts" in err
    (tmp_path / "empty").mkdir()
    code, _, err = show(capsys, tmp_path / "empty")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"{tmp_path / 'empty'} has no log/rollouts; give the run directory" in err
    result = subprocess.run([sys.executable, "-m", "prime_values.tools.show", str(tmp_path / "missing")], cwd=REPO,
                            capture_output=True, text=True, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 2 and "does not exist" in result.stderr and "Traceback" not in result.stderr


def test_value_steps():
    # token t's step: V(s_t+1) - V(s_t); the last policy token's next value is the reward (or V(s_cut) when cut)
    assert value_steps([0, 0, 0.5, 0.75, 1.0], [0, 0, 1, 1, 1], valued=5, end=0.0) == [None, None, 0.25, 0.25, -1.0]
    assert value_steps([0, 0, 0.5, 0.75, 1.0], [0, 0, 1, 0, 1], valued=5, end=1.0) == [None, None, 0.5, None, 0.0]
    assert value_steps([0, 0, 0.5, 0.75, 1.0], [0, 0, 1, 1, 1], valued=3, end=0.25) == [None, None, -0.25, None, None]
    assert value_steps([0, 0, 0.5], [0, 0, 1], valued=3) == [None, None, None]


def test_incremental_pieces_with_a_byte_level_bpe():
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(["hello world, the value dropped"] * 20, vocab_size=280, min_frequency=2)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer)
    prompt = tok.encode("hello")
    text = " wörld ✓ dropped"
    ids = prompt + tok.encode(text)
    pieces = token_pieces(tok, ids, len(prompt))
    assert "".join(pieces[len(prompt):]) == text  # nothing lost, no U+FFFD from split characters
    assert "" in pieces[len(prompt):]  # a character's first byte token waits for the rest
    assert len(pieces) == len(ids)


@pytest.mark.slow
def test_on_a_real_run(small_run):
    run = small_run
    result = subprocess.run([sys.executable, "-m", "prime_values.tools.show", str(run), "--worst"], cwd=REPO,
                            capture_output=True, text=True, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert "[v=" in result.stdout and "batch    step" in result.stdout  # not a terminal: plain markers
    rid = re.search(r"^rollout (\S+)", result.stdout, re.M).group(1)
    assert (run / "report" / f"rollout_{rid}.html").exists()
