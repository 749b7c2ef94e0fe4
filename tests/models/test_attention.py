"""policy.attn_implementation / policy.dtype (models/build.py): 'auto' resolves once per process to flash_attention_2
only where flash-attn can run (importable, CUDA, bfloat16 weights), else sdpa with the reason; an explicit
flash_attention_2 that cannot run is a one-line config error; built and loaded models really use the resolution.
The CUDA + flash-attn half is tests/e2e/test_gpu.py::test_auto_attention_picks_flash_on_cuda."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from omegaconf import OmegaConf

from prime_values.__main__ import precheck
from prime_values.models import (
    build,
    build_char_tokenizer,
    build_critic,
    build_tiny_policy,
    load_critic,
    load_policy,
    save_model,
)

FLASH_INSTALLED = importlib.util.find_spec("flash_attn") is not None
TINY = dict(hidden_size=64, num_heads=2, num_kv_heads=1, intermediate_size=64, num_layers=1)


def test_the_default_is_sdpa_in_float32_for_a_caller_that_passes_none():
    """A model built without an Attention (tests, tools) gets the default; nothing is process-global."""
    tok = build_char_tokenizer()
    model = build_tiny_policy(tok, seed=0, **TINY)
    assert build.DEFAULT_ATTENTION == build.Attention("sdpa", "float32", "default")
    assert model.config._attn_implementation == "sdpa" and not getattr(model, "pv_mixed", False)
    assert not hasattr(build, "_attention") and not hasattr(build, "current_attention")


def policy(**keys):
    return OmegaConf.create({"attn_implementation": "auto", "dtype": "float32", **keys})


@pytest.mark.skipif(FLASH_INSTALLED, reason="flash-attn is installed here")
def test_auto_is_sdpa_here_with_the_reason(caplog):
    import logging

    log = logging.getLogger("test_attention")
    with caplog.at_level(logging.INFO, logger="test_attention"):
        chosen = build.configure_attention(policy(), "cpu", log)
    assert (chosen.implementation, chosen.reason) == ("sdpa", "flash-attn not installed")
    assert "attention: sdpa (flash-attn not installed); weights float32" in caplog.text
    assert build.resolve_attention("auto", "cuda:0", "bfloat16").implementation == "sdpa"  # no package, no flash


def test_auto_picks_flash_when_importable_on_cuda_in_bfloat16(monkeypatch):
    yes = (True, "flash-attn installed")
    assert build.resolve_attention("auto", "cuda:0", "bfloat16", flash=yes).implementation == "flash_attention_2"
    # the same through the once-per-process configuration, with the importability check patched
    monkeypatch.setattr(build, "flash_attn_importable", lambda: yes)
    chosen = build.configure_attention(policy(dtype="bfloat16"), "cuda:0")
    assert chosen.implementation == "flash_attention_2"
    # where flash cannot run, auto stays on sdpa and says why
    on_cpu = build.resolve_attention("auto", "cpu", "bfloat16", flash=yes)
    assert on_cpu.implementation == "sdpa" and "runs on cpu" in on_cpu.reason
    fp32 = build.resolve_attention("auto", "cuda:0", "float32", flash=yes)
    assert fp32.implementation == "sdpa" and "policy.dtype=float32" in fp32.reason
    assert build.resolve_attention("eager", "cuda:0", "bfloat16", flash=yes).implementation == "eager"


def test_explicit_flash_that_cannot_run_raises_in_the_role():
    with pytest.raises(ValueError, match="pip install flash-attn"):
        build.resolve_attention("flash_attention_2", "cuda:0", "bfloat16", flash=(False, "flash-attn not installed"))
    with pytest.raises(ValueError, match="needs a CUDA device"):
        build.resolve_attention("flash_attention_2", "cpu", "bfloat16", flash=(True, ""))
    with pytest.raises(ValueError, match="policy.dtype=bfloat16"):
        build.resolve_attention("flash_attention_2", "cuda:0", "float32", flash=(True, ""))


@pytest.mark.skipif(FLASH_INSTALLED, reason="flash-attn is installed here")
def test_explicit_flash_without_the_package_is_a_config_error():
    line = precheck(["+experiment=arith", "policy.attn_implementation=flash_attention_2", "policy.dtype=bfloat16"])
    assert line is not None and "\n" not in line
    assert line.startswith("policy.attn_implementation=flash_attention_2") and "pip install flash-attn" in line


def test_bad_values_are_config_errors(monkeypatch):
    line = precheck(["+experiment=arith", "policy.attn_implementation=flash"])
    assert line == ("policy.attn_implementation='flash' is not allowed; choose one of auto, sdpa, eager, "
                    "flash_attention_2")
    assert precheck(["+experiment=arith", "policy.dtype=fp16"]).startswith("policy.dtype='fp16' is not allowed")
    # with the package present: float32 weights and CPU roles are refused before launch too
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "flash_attn"
                        else real(name, *a))
    assert "needs policy.dtype=bfloat16" in precheck(["+experiment=arith",
                                                      "policy.attn_implementation=flash_attention_2"])
    assert "needs CUDA devices, but topology.inference_device=cpu" in precheck(
        ["+experiment=arith", "policy.attn_implementation=flash_attention_2", "policy.dtype=bfloat16"])
    assert precheck(["+experiment=arith", "policy.attn_implementation=eager", "policy.dtype=bfloat16"]) is None


@pytest.mark.parametrize("requested", ["eager", "auto"])
def test_built_and_loaded_models_use_the_resolution(tmp_path, requested):
    expected = "sdpa" if requested == "auto" else requested
    chosen = build.configure_attention(policy(attn_implementation=requested), "cpu")
    assert chosen.implementation == expected
    tok = build_char_tokenizer()
    model = build_tiny_policy(tok, seed=0, attention=chosen, **TINY)
    critic = build_critic(None, tok, seed=0, attention=chosen, **TINY)
    assert model.config._attn_implementation == critic.config._attn_implementation == expected
    save_model(model, tok, tmp_path / "policy")
    save_model(critic, tok, tmp_path / "critic")
    assert load_policy(tmp_path / "policy", chosen).config._attn_implementation == expected
    assert load_critic(tmp_path / "critic", chosen).config._attn_implementation == expected
    from_policy = build_critic(tmp_path / "policy", tok, seed=0, attention=chosen)
    assert from_policy.config._attn_implementation == expected
    assert from_policy.model.layers[0].self_attn.config._attn_implementation == expected


def test_bfloat16_weights_and_float32_values(tmp_path):
    bf16 = build.configure_attention(policy(dtype="bfloat16"), "cpu")
    tok = build_char_tokenizer()
    model = build_tiny_policy(tok, seed=0, attention=bf16, **TINY)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    save_model(model, tok, tmp_path / "policy")
    assert {p.dtype for p in load_policy(tmp_path / "policy", bf16).parameters()} == {torch.bfloat16}
    critic = build_critic(tmp_path / "policy", tok, seed=0, attention=bf16)
    assert {p.dtype for p in critic.parameters()} == {torch.bfloat16}
    ids = torch.tensor([tok.encode("12+3=", add_special_tokens=False)])
    assert build.critic_values(critic, ids).dtype == torch.float32
