"""The committed version 0 of the end-to-end tests (tests/data/version0) still fits the code: the model the
tests' configuration builds has the same tensors and shapes, the tokenizer maps every character the same way, and
the critic is the one that configuration would build on that policy. When this fails, remake it
(`python tests/make_version0.py`) and remeasure the bounds that rest on it. The slow test makes a version 0 the
way the committed one was made, so the recipe keeps working."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from tests.e2e_helpers import CHECKPOINT, VERSION0, compose, make_version0

REMAKE = "remake it with `python tests/make_version0.py` and remeasure the bounds that rest on it"


def _shapes(state: dict) -> dict:
    return {k: tuple(v.shape) for k, v in state.items()}


def _saved_shapes(model) -> dict:
    """The tensors `model` saves (tied weights once), as a version directory holds them."""
    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        return _shapes(load_file(str(Path(tmp) / "model.safetensors")))


def test_the_committed_policy_fits_the_tests_model_and_tokenizer():
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from prime_values.models import build_char_tokenizer, build_tiny_policy

    cfg = compose(CHECKPOINT)
    fresh = build_tiny_policy(build_char_tokenizer(), **dict(cfg.policy.arch))
    committed = load_file(str(VERSION0 / "policy" / "model.safetensors"))
    assert _shapes(committed) == _saved_shapes(fresh), \
        f"tests/data/version0/policy holds another architecture than policy.arch builds now: {REMAKE}"
    ours, theirs = build_char_tokenizer(), AutoTokenizer.from_pretrained(VERSION0 / "policy")
    assert theirs.get_vocab() == ours.get_vocab() and theirs.eos_token_id == ours.eos_token_id, \
        f"tests/data/version0's tokenizer differs from the task's: {REMAKE}"
    AutoModelForCausalLM.from_pretrained(VERSION0 / "policy")  # loads as every role loads it


def test_the_committed_critic_is_the_one_the_configuration_builds():
    from safetensors.torch import load_file

    from prime_values.models import build_char_tokenizer
    from prime_values.roles.warm_start import initial_critic

    cfg = compose(CHECKPOINT)
    fresh = initial_critic(cfg, VERSION0 / "policy", build_char_tokenizer(), seed=0)
    committed = load_file(str(VERSION0 / "critic" / "model.safetensors"))
    assert _shapes(committed) == _saved_shapes(fresh), \
        f"tests/data/version0/critic holds another critic than critic.* builds now: {REMAKE}"


def what_version0_depends_on(overrides: list[str]) -> dict:
    """The composed sections that make version 0 (the same config, however the overrides are written: the tests'
    small run moved from a list to conf/debug/small.yaml); whether it is cached changes nothing in it."""
    from omegaconf import OmegaConf

    cfg = compose(overrides)
    out = {key: OmegaConf.to_container(OmegaConf.select(cfg, key), resolve=True)
           for key in ("policy.arch", "policy.warm_start", "critic", "task")}
    out["policy.model"] = cfg.policy.model
    out["policy.warm_start"].pop("cache")
    return out


def test_the_committed_version0_says_how_it_was_made():
    made = json.loads((VERSION0 / "made.json").read_text())
    assert made["command"] == "python tests/make_version0.py" and \
        what_version0_depends_on(made["overrides"]) == what_version0_depends_on(CHECKPOINT), \
        f"tests/data/version0 was made from another configuration than e2e_helpers.CHECKPOINT: {REMAKE}"
    assert 0.15 <= made["heldout_accuracy"] <= 0.95 and made["commit"] and made["cpu"]


@pytest.mark.slow
def test_version0_is_made_by_the_warm_start_in_band():
    """The recipe the committed weights came from still makes a version 0 that solves some problems and not all
    (make_version0 asserts the band); on another machine its weights differ, which is why they are committed."""
    with tempfile.TemporaryDirectory(prefix="pv-version0-") as tmp:
        accuracy = make_version0(Path(tmp))
        assert (Path(tmp) / "weights" / "critic" / "0" / "model.safetensors").exists()
    assert 0.15 <= accuracy <= 0.95
