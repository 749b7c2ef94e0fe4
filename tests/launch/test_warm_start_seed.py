"""policy.warm_start.seed: version 0 (the SFT'd policy and the pretrained critic) depends on the warm start's own
seed, not on the RL `seed`, so runs that differ only in `seed` compare RL from one start."""

from __future__ import annotations

import subprocess
import sys

import pytest
from omegaconf import OmegaConf
from safetensors.torch import load_file

from tests.e2e_helpers import REPO, SMALL, compose, env_for_runs

# a few SFT steps and critic pretraining steps of SMALL's 0.15M-parameter model: enough to move every weight
QUICK = [*SMALL, "policy.warm_start.steps=3", "policy.warm_start.target_accuracy=0", "critic.warm_start.steps=2",
         "critic.warm_start.rollouts=16"]


def version_zero(root, *overrides: str) -> dict:
    root.mkdir()
    (root / "config.yaml").write_text(OmegaConf.to_yaml(compose([*QUICK, *overrides])))
    result = subprocess.run([sys.executable, "-c", "import sys; from prime_values.roles.warm_start import main; "
                             "main(sys.argv[1])", str(root)], cwd=REPO, env=env_for_runs(), capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return {model: load_file(root / "weights" / model / "0" / "model.safetensors") for model in ("policy", "critic")}


@pytest.mark.slow
def test_version_zero_follows_the_warm_start_seed_not_the_rl_seed(tmp_path):
    base = version_zero(tmp_path / "a", "seed=0")
    other_rl_seed = version_zero(tmp_path / "b", "seed=5")
    other_warm_seed = version_zero(tmp_path / "c", "seed=0", "policy.warm_start.seed=5")
    for model in ("policy", "critic"):
        assert base[model].keys() == other_rl_seed[model].keys()
        assert all(base[model][k].equal(other_rl_seed[model][k]) for k in base[model]), \
            f"{model} version 0 changed with the RL seed"
        assert any(not base[model][k].equal(other_warm_seed[model][k]) for k in base[model]), \
            f"{model} version 0 ignored policy.warm_start.seed"
