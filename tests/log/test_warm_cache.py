"""The warm-start cache (prime_values/warm_cache.py, policy.warm_start.cache): what its key depends on, and a
version 0 stored by one run and taken by the next."""

from __future__ import annotations

import json

from omegaconf import OmegaConf

from prime_values.rundir import RunDir
from prime_values.warm_cache import WarmStartCache, cache_key
from prime_values.weights import latest_version, publish, version_dir
from tests.e2e_helpers import compose


def config(*overrides: str):
    return compose(["+experiment=arith", *overrides])


def test_the_key_follows_what_version_0_depends_on_and_not_the_rl_seed():
    base = cache_key(config())
    assert cache_key(config("seed=7")) == base, "runs that differ only in the RL seed share version 0"
    assert cache_key(config("policy.warm_start.seed=7")) != base
    assert cache_key(config("policy.warm_start.target_accuracy=0.6")) != base
    assert cache_key(config("advantage=grpo")) != base  # no critic: its version 0 is not pretrained
    assert cache_key(config(), environ={"ATEN_CPU_CAPABILITY": "avx2"}) != base  # other kernels, other rounding


def test_a_version_0_stored_by_one_run_is_the_next_runs(tmp_path):
    cfg = config(f"policy.cache_dir={tmp_path / 'cache'}")
    first, second = RunDir(tmp_path / "first"), RunDir(tmp_path / "second")
    for name in ("policy", "critic"):
        publish(first.weights(name), 0, lambda path, name=name: (path / "model.safetensors").write_text(name))
    first.metrics("warm_start").parent.mkdir(parents=True, exist_ok=True)
    first.metrics("warm_start").write_text(json.dumps({"time": 1.0, "heldout_accuracy": 0.4}) + "\n")
    cache = WarmStartCache.of(cfg)
    assert cache is not None and not cache.restore(second), "nothing stored yet"
    cache.store(first)
    assert WarmStartCache.of(cfg).restore(second)
    for name in ("policy", "critic"):
        assert latest_version(second.weights(name)) == 0
        assert (version_dir(second.weights(name), 0) / "model.safetensors").read_text() == name
    record = json.loads(second.metrics("warm_start").read_text())
    assert record["heldout_accuracy"] == 0.4 and record["cached_from"] == str(cache.entry)
    assert not WarmStartCache.of(cfg).restore(second), "a run that has its version 0 keeps it"
    assert WarmStartCache.of(OmegaConf.merge(cfg, {"policy": {"warm_start": {"cache": False}}})) is None
