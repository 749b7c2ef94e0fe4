"""LoRA (prime_values/models/lora.py): adapter-only versions, in-place adoption, merge, resume, and a real run."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import peft  # noqa: F401  (the test extra: missing, the module fails rather than skips)
import pytest
import torch

from prime_values import dist
from prime_values.models import (
    build_critic,
    build_tiny_policy,
    critic_values,
    load_critic,
    load_optimizer_state,
    load_policy,
    lora,
    read_optimizer_state,
    save_model,
    save_optimizer_state,
)
from prime_values.weights import Adopter, publish, version_dir

ARCH = dict(hidden_size=256, num_heads=8, num_kv_heads=4, intermediate_size=768)  # policy.arch's default (3.2M)
LORA = SimpleNamespace(enabled=True, r=8, alpha=16.0, dropout=0.0, target_modules=list(lora.DEFAULT_TARGETS))
# Merged weights (W + s B A) against the adapter path (x W + s (x A) B) are the same math in another association:
# they differ by float32 rounding only. One GEMM of inner dimension K rounds an output by at most K eps32 of the sum
# of its |terms| (768 x 1.19e-7 = 9e-5 for the MLP's down projection; typically sqrt(K) eps32 = 3e-6), and the
# model stacks 4 blocks of them: rtol 1e-3 / atol 1e-4 cover the worst case of each block summed. A wrong merge (an
# adapter dropped or applied twice) is off by the adapter's whole effect, which the tests check is over 1e-2.
RTOL, ATOL = 1e-3, 1e-4


def ids_batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 60, (3, 24), generator=g)
    return ids, torch.ones_like(ids)


def outputs(model, kind: str) -> torch.Tensor:
    ids, mask = ids_batch()
    with torch.no_grad():
        was = model.training
        model.eval()
        out = critic_values(model, ids, mask) if kind == "critic" else model(input_ids=ids, attention_mask=mask).logits
        model.train(was)
    return out


def train_some(model, optimizer, kind: str, steps: int = 3, seed: int = 1) -> None:
    """A few real optimizer steps on an arbitrary objective, so the adapter (and value head) move away from init."""
    model.train()
    for s in range(steps):
        ids, mask = ids_batch(seed * 100 + s)
        if kind == "critic":
            loss = (critic_values(model, ids, mask) - 0.7).pow(2).mean()
        else:
            logits = model(input_ids=ids, attention_mask=mask).logits
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def publish_base(root: Path, tokenizer, kind: str) -> Path:
    model = build_tiny_policy(tokenizer, seed=3, **ARCH) if kind == "policy" else \
        build_critic(None, tokenizer, seed=3, **ARCH)
    return publish(root, 0, lambda path: save_model(model, tokenizer, path))


def test_adapter_versions_are_small_and_trainable_parts_are_right(tmp_path, tokenizer):
    root = tmp_path / "policy"
    base = publish_base(root, tokenizer, "policy")
    model = lora.load_trainable(base, LORA, "policy")
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names), "only adapters train on the policy"
    optimizer = torch.optim.AdamW(lora.trainable(model), lr=1e-2)
    train_some(model, optimizer, "policy")
    began = time.perf_counter()
    v1 = publish(root, 1, lambda path: lora.save_adapter(model, tokenizer, path))
    save_s = time.perf_counter() - began
    assert lora.is_adapter(v1) and not (v1 / "model.safetensors").exists()
    assert lora.base_of(v1) == base and (v1 / lora.BASE_RECORD).is_file()
    weights_ratio = (v1 / lora.ADAPTER_WEIGHTS).stat().st_size / (base / "model.safetensors").stat().st_size
    dir_ratio = dir_bytes(v1) / dir_bytes(base)
    print(f"\nLoRA r=8 on all 7 projections, tiny policy {sum(p.numel() for p in model.parameters()):,} params: "
          f"adapter {(v1 / lora.ADAPTER_WEIGHTS).stat().st_size:,} B vs full "
          f"{(base / 'model.safetensors').stat().st_size:,} B "
          f"(weights {weights_ratio:.3f}, whole dir {dir_ratio:.3f}); publish {save_s * 1000:.0f} ms")
    assert weights_ratio < 0.1 and dir_ratio < 0.1

    critic_root = tmp_path / "critic"
    critic = lora.load_trainable(publish_base(critic_root, tokenizer, "critic"), LORA, "critic")
    trainable = [n for n, p in critic.named_parameters() if p.requires_grad]
    assert any("score" in n for n in trainable), "the critic's value head stays trainable (modules_to_save)"
    assert all("lora_" in n or "score" in n for n in trainable)


@pytest.mark.parametrize("kind", ["policy", "critic"])
def test_adopter_follows_adapter_versions_in_place_and_matches_merged(tmp_path, tokenizer, kind):
    root = tmp_path / kind
    publish_base(root, tokenizer, kind)
    trainer = lora.load_trainable(version_dir(root, 0), LORA, kind, seed=5)
    optimizer = torch.optim.AdamW(lora.trainable(trainer), lr=1e-2)
    load_full = load_critic if kind == "critic" else load_policy
    loader = lora.Adopting(load_full)
    adopter = Adopter(root, loader)
    assert adopter.poll() and adopter.version == 0
    base = outputs(trainer, kind)
    # B = 0: the base's outputs, through the same kernels (x W + 0): equal up to assert_close's float32 defaults
    torch.testing.assert_close(outputs(adopter.value, kind), base)
    held, times = None, []
    for v in (1, 2, 3):
        train_some(trainer, optimizer, kind, seed=v)
        publish(root, v, lambda path: lora.save_adapter(trainer, tokenizer, path))
        began = time.perf_counter()
        assert adopter.poll() and adopter.version == v
        times.append(time.perf_counter() - began)
        if held is not None:
            assert adopter.value is held, "a later adapter version is loaded into the held model, not reloaded"
        held = adopter.value
        expected = outputs(trainer, kind)
        assert (expected - base).abs().max() > 1e-2, "the adapter must change the outputs for the checks to mean much"
        torch.testing.assert_close(outputs(adopter.value, kind), expected, atol=ATOL, rtol=RTOL)
        torch.testing.assert_close(outputs(lora.load_merged(version_dir(root, v)), kind), expected, atol=ATOL,
                                   rtol=RTOL)
    assert loader.in_place == 2
    if kind == "policy":  # sampling (KV cache through the LoRA layers) as the inference role does it
        from prime_values.models import sample

        prompts = [[1, 5, 9, 12], [1, 7, 7]]
        kw = dict(num_samples=2, max_new_tokens=12, temperature=1.0, eos_id=tokenizer.eos_token_id,
                  pad_id=tokenizer.pad_token_id, seed=4)
        got = sample(adopter.value, prompts, **kw)
        want = sample(lora.load_merged(version_dir(root, 3)), prompts, **kw)
        assert [c.response_ids for c in got] == [c.response_ids for c in want]
        # logprobs = log_softmax of those logits: the same rounding argument (RTOL, ATOL)
        torch.testing.assert_close(torch.tensor([x for c in got for x in c.logprobs]),
                                   torch.tensor([x for c in want for x in c.logprobs]), atol=ATOL, rtol=RTOL)
    print(f"\n{kind}: adopt first adapter version {times[0] * 1000:.0f} ms (base load + wrap), later versions "
          f"{times[1] * 1000:.1f} / {times[2] * 1000:.1f} ms (adapter tensors only)")
    # the merged directory is a plain from_pretrained model with the same outputs
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    out = lora.merge(version_dir(root, 3), tmp_path / "merged")
    auto = AutoModelForTokenClassification if kind == "critic" else AutoModelForCausalLM
    plain = auto.from_pretrained(out, dtype=torch.float32)
    assert not any("lora" in n for n, _ in plain.named_parameters())
    torch.testing.assert_close(outputs(plain, kind), expected, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(outputs(load_full(version_dir(root, 3)), kind), expected, atol=ATOL, rtol=RTOL)
    # a full version after adapter ones (LoRA turned off on a restart) is a full load again
    publish(root, 4, lambda path: save_model(plain, tokenizer, path))
    began = time.perf_counter()
    assert adopter.poll() and adopter.value is not held
    print(f"{kind}: adopt a full version {(time.perf_counter() - began) * 1000:.0f} ms")
    assert not any("lora_" in n for n, _ in adopter.value.named_parameters())


def test_merge_command_line(tmp_path, tokenizer, capsys):
    root = tmp_path / "policy"
    publish_base(root, tokenizer, "policy")
    model = lora.load_trainable(version_dir(root, 0), LORA, "policy")
    train_some(model, torch.optim.AdamW(lora.trainable(model), lr=1e-2), "policy")
    publish(root, 1, lambda path: lora.save_adapter(model, tokenizer, path))
    assert lora.main(["merge", str(root / "1"), str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "model.safetensors").is_file() and (tmp_path / "out" / "tokenizer.json").is_file()
    assert lora.main(["merge", str(root / "0"), str(tmp_path / "out2")]) == 2  # a full version: nothing to merge
    assert "not an adapter version" in capsys.readouterr().err


def test_moved_run_directory_finds_its_base(tmp_path, tokenizer):
    root = tmp_path / "a" / "policy"
    publish_base(root, tokenizer, "policy")
    model = lora.load_trainable(version_dir(root, 0), LORA, "policy")
    publish(root, 1, lambda path: lora.save_adapter(model, tokenizer, path))
    moved = tmp_path / "b"
    (tmp_path / "a").rename(moved)
    assert lora.base_of(moved / "policy" / "1") == moved / "policy" / "0"  # the sibling version, not the old path


@pytest.mark.parametrize("kind", ["policy", "critic"])
def test_resume_restores_adapter_and_optimizer_state(tmp_path, tokenizer, kind):
    root = tmp_path / kind
    publish_base(root, tokenizer, kind)
    model = lora.load_trainable(version_dir(root, 0), LORA, kind, seed=5)
    optimizer = torch.optim.AdamW(lora.trainable(model), lr=1e-2)
    train_some(model, optimizer, kind)

    def save(path):  # as the trainers save: the state keyed by parameter name (the adapter's names)
        lora.save_adapter(model, tokenizer, path)
        save_optimizer_state(dist.optimizer_state(model, optimizer), path)
    publish(root, 1, save)
    restored = lora.load_trainable(version_dir(root, 1), LORA, kind, seed=99)  # the seed only matters for new adapters
    assert lora.protected(restored) == (0,)
    restored_optimizer = torch.optim.AdamW(lora.trainable(restored), lr=1e-2)
    assert "restored" in dist.restore_optimizer_state(restored, restored_optimizer,
                                                      lambda: read_optimizer_state(version_dir(root, 1)))
    legacy = tmp_path / "legacy"  # an optimizer's own (index-keyed) state, as older runs saved it
    legacy.mkdir()
    save_optimizer_state(optimizer, legacy)
    assert "restored" in load_optimizer_state(torch.optim.AdamW(lora.trainable(restored), lr=1e-2), legacy)
    assert [n for n, p in restored.named_parameters() if p.requires_grad] == \
        [n for n, p in model.named_parameters() if p.requires_grad]
    torch.testing.assert_close(outputs(restored, kind), outputs(model, kind))
    # the restored trainer takes the same next step as the one that never stopped (Adam moments included)
    train_some(model, optimizer, kind, steps=2, seed=7)
    train_some(restored, restored_optimizer, kind, steps=2, seed=7)
    # the same float32 operations on bit-identical weights and Adam moments (saved and loaded exactly) and the same
    # batches: equal on any machine (CPU kernels are deterministic for a given shape); the tolerance is a margin,
    # while a fresh optimizer (zero moments) moves each weight by ~lr = 1e-2 on its first step instead
    torch.testing.assert_close(outputs(restored, kind), outputs(model, kind), atol=1e-5, rtol=1e-4)


def test_config_checks():
    from prime_values.__main__ import precheck

    assert precheck(["+experiment=arith", "policy.lora.enabled=true", "critic.lora.enabled=true"]) is None
    line = precheck(["+experiment=arith", "policy.lora.enabled=true", "topology.policy_trainer_procs=2"])
    assert line and "topology.policy_trainer_procs=1" in line and "\n" not in line
    line = precheck(["+experiment=arith", "critic.lora.enabled=true", "critic.lora.r=0"])
    assert line and "critic.lora" in line


@pytest.mark.slow
def test_pipeline_with_lora_policy_and_critic(tmp_path):
    """A short real run: every policy version after 0 is an adapter, the evaluator adopts several critic versions."""
    import pyarrow.dataset as ds

    from tests.e2e_helpers import run_pipeline

    run_dir = tmp_path / "run"
    result = run_pipeline(run_dir, "steps=4", "policy.lora.enabled=true", "critic.lora.enabled=true")
    assert result.returncode == 0, result.stderr[-3000:]
    policy, critic = run_dir / "weights" / "policy", run_dir / "weights" / "critic"
    assert (policy / "LATEST").read_text().strip() == "4"
    assert (policy / "0" / "model.safetensors").is_file()
    for v in range(1, 5):
        if (policy / str(v)).exists():  # older versions may be pruned (log.keep_weights)
            assert lora.is_adapter(policy / str(v)) and not (policy / str(v) / "model.safetensors").exists()
    critic_latest = int((critic / "LATEST").read_text())
    assert critic_latest >= 2 and lora.is_adapter(critic / str(critic_latest))
    values = ds.dataset(str(run_dir / "log" / "values"), format="arrow").to_table()
    assert len(set(values.column("critic_version").to_pylist())) >= 2, "the evaluator never adopted a new critic"
    sizes = {"policy adapter": dir_bytes(policy / "4"), "policy base": dir_bytes(policy / "0"),
             "critic adapter": dir_bytes(critic / str(critic_latest)), "critic base": dir_bytes(critic / "0")}
    print("\n" + ", ".join(f"{k} {v:,} B" for k, v in sizes.items()))
    merged = lora.merge(policy / "4", tmp_path / "merged")
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(merged)
