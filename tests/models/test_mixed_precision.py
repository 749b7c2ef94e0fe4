"""policy.dtype=bf16-mixed and activation checkpointing (models/build.py apply_precision / enable_checkpointing,
prime_values/dist.py shard), on the CPU (bf16 autocast runs there): on the same batch the mixed-precision losses and
gradients of both trainers agree with fp32 within what bf16 allows, and the weights stay fp32 (the master copy);
checkpointing gives the same gradients and a lower peak memory; FSDP2 over 2 gloo processes in mixed precision
matches 1 process; the sampling logprobs stay comparable with the trainer's (the first on-policy step's ratio).

The tolerances, from bf16's precision: 8 significant bits, so one rounding to bf16 is off by at most 2^-9 ~ 2e-3
relative (the spacing is 2^-8 ~ 3.9e-3). Autocast rounds every matmul's inputs and output to bf16; the errors of
the ~10 matmuls a token's forward and backward go through per block (and of 2 blocks here) are independent and add
like a random walk, sqrt(10 * 2) * 2e-3 ~ 1e-2, and a gradient sums many such terms, which averages further. So
5e-2 relative (a gradient tensor's norm of difference over its norm) and 2e-2 on the loss leave a margin of ~3-5x
over what bf16 must lose (measured here: 1.4e-2 and 7e-4) and still catch a real bug (a loss scaled or a batch
share dropped by mistake is 100% off). An fp32 value head and fp32 losses are checked exactly (dtype, and the
head's output equals the fp32 computation bit for bit).
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing
import os
import socket
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from prime_values.config import Config
from prime_values.models import build
from tests.policy_batches import ARCH, policy_rows

REPO = Path(__file__).resolve().parents[2]
BF16_REL = 5e-2  # gradients: see the module docstring
BF16_LOSS_REL = 2e-2


def cfg_for(**policy):
    cfg = OmegaConf.structured(Config)
    cfg.policy.max_grad_norm = 0.0  # the raw gradients are compared
    cfg.advantage.lambda_value = 1.0  # the critic regresses on the stored targets
    for key, value in policy.items():
        cfg.policy[key] = value
    return cfg


class Recorder:
    """An optimizer stand-in that keeps the (full) gradients of each step and changes nothing."""

    def __init__(self, model):
        self.model, self.grads = model, None

    def zero_grad(self, set_to_none: bool = True):
        self.model.zero_grad(set_to_none=set_to_none)

    def step(self):
        self.grads = {name: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
                      for name, p in self.model.named_parameters()}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp(min=1e-30)).item()


def policy_grads(mixed: bool, rows=None, checkpointing: bool = False, world_cfg=None):
    from prime_values.models import build_char_tokenizer, build_tiny_policy
    from prime_values.roles.policy_trainer import train_step

    tok = build_char_tokenizer()
    model = build_tiny_policy(tok, seed=0, **ARCH).train()  # fp32 weights in both modes
    reference = rows or policy_rows(model, tok)
    build.apply_precision(model, mixed)
    if checkpointing:
        build.enable_checkpointing(model)
    recorder = Recorder(model)
    stats = train_step(model, recorder, reference, world_cfg or cfg_for(), tok.pad_token_id, "cpu")
    return model, recorder.grads, stats, reference


def test_policy_mixed_loss_and_gradients_agree_with_fp32():
    fp32_model, fp32, fp32_stats, rows = policy_grads(False)
    mixed_model, mixed, mixed_stats, _ = policy_grads(True, rows)
    assert {p.dtype for p in mixed_model.parameters()} == {torch.float32}  # the master copy stays fp32
    seen = []  # the blocks' matmuls really run in bf16 under the mixed forward
    hook = mixed_model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    with torch.no_grad():
        logits = mixed_model(input_ids=torch.tensor([rows[0]["token_ids"]])).logits
    hook.remove()
    assert seen == [torch.bfloat16] and logits.dtype in (torch.bfloat16, torch.float32)
    worst = max(rel(mixed[k], fp32[k]) for k in fp32)
    loss_rel = abs(mixed_stats["loss"] - fp32_stats["loss"]) / abs(fp32_stats["loss"])
    print(f"\nbf16-mixed vs fp32, policy: loss rel {loss_rel:.1e}, worst gradient rel {worst:.1e}, ratio_mean "
          f"{mixed_stats['ratio_mean']:.5f} (fp32 {fp32_stats['ratio_mean']:.7f})")
    assert fp32_stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert 0 < worst < BF16_REL, worst  # > 0: the mixed step did compute in bf16
    assert loss_rel < BF16_LOSS_REL
    assert mixed_stats["clip_fraction"] == 0.0 and abs(mixed_stats["ratio_mean"] - 1) < 1e-2


def critic_grads(mixed: bool, rows, checkpointing: bool = False):
    from prime_values.critic_io import critic_step
    from prime_values.models import build_char_tokenizer, build_critic

    tok = build_char_tokenizer()
    critic = build.apply_precision(build_critic(None, tok, seed=0, **ARCH).train(), mixed)
    if checkpointing:
        build.enable_checkpointing(critic)
    recorder = Recorder(critic)
    stats = critic_step(critic, recorder, rows, tok, cfg_for(), "cpu")
    return critic, recorder.grads, stats


def test_critic_mixed_value_head_in_fp32_and_gradients_agree_with_fp32():
    _, _, _, rows = policy_grads(False)
    _, fp32, fp32_stats = critic_grads(False, rows)
    critic, mixed, mixed_stats = critic_grads(True, rows)
    assert {p.dtype for p in critic.parameters()} == {torch.float32}
    seen = {}
    critic.score.register_forward_hook(lambda m, i, o: seen.update(input=i[0], output=o))
    ids = torch.tensor([rows[0]["token_ids"]])
    values = build.critic_values(critic, ids)
    assert values.dtype == torch.float32 and seen["output"].dtype == torch.float32
    # the head ran in fp32 outside autocast: its output is the fp32 computation, bit for bit
    assert torch.equal(seen["output"], torch.nn.functional.linear(seen["input"].float(), critic.score.weight,
                                                                  critic.score.bias))
    worst = max(rel(mixed[k], fp32[k]) for k in fp32)
    loss_rel = abs(mixed_stats["value_loss"] - fp32_stats["value_loss"]) / abs(fp32_stats["value_loss"])
    print(f"\nbf16-mixed vs fp32, critic: value loss rel {loss_rel:.1e}, worst gradient rel {worst:.1e}")
    assert 0 < worst < BF16_REL and loss_rel < BF16_LOSS_REL, (worst, loss_rel)


def test_auto_dtype_is_mixed_on_cuda_and_fp32_on_cpu_and_logged(caplog, monkeypatch):
    import logging

    assert build.resolve_dtype("auto", "cuda:0") == ("bf16-mixed", "policy.dtype=auto on cuda:0")
    no_bf16 = (False, "the CPU has no avx512_bf16 or amx_bf16")
    assert build.resolve_dtype("auto", "cpu", no_bf16) == ("float32", "policy.dtype=auto on cpu: " + no_bf16[1])
    monkeypatch.setattr(build, "cpu_bf16_native", lambda: no_bf16)  # as on a CPU without bf16 instructions
    log = logging.getLogger("test_mixed")
    with caplog.at_level(logging.INFO, logger="test_mixed"):
        chosen = build.configure_attention(OmegaConf.create({"attn_implementation": "auto", "dtype": "auto"}),
                                           "cpu", log)
    assert chosen.dtype == "float32" and not chosen.mixed
    assert "weights float32 [policy.dtype=auto on cpu" in caplog.text
    on_cuda = build.resolve_attention("auto", "cuda:0", "auto", flash=(True, "flash-attn installed"))
    assert (on_cuda.implementation, on_cuda.dtype) == ("flash_attention_2", "bf16-mixed")
    assert build.resolve_attention("auto", "cuda:0", "auto", flash=(False, "no")).implementation == "sdpa"
    # models built with a bf16-mixed resolution get the autocast forward, fp32 weights
    mixed = build.configure_attention(OmegaConf.create({"attn_implementation": "sdpa", "dtype": "bf16-mixed"}), "cpu")
    from prime_values.models import build_char_tokenizer, build_tiny_policy

    model = build_tiny_policy(build_char_tokenizer(), seed=0, attention=mixed, **ARCH)
    assert model.pv_mixed and {p.dtype for p in model.parameters()} == {torch.float32}


def test_auto_dtype_on_a_cpu_follows_its_bf16_instructions(tmp_path, monkeypatch):
    """A CPU with avx512_bf16 or amx_bf16 gets bf16-mixed from 'auto'; one without gets float32, and an explicit bf16
    mode there is kept but its log line names the ~100x slower matmuls and the fix."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n\n")
    assert build.cpu_bf16_native.__wrapped__(str(cpuinfo)) in (
        (True, "the CPU has avx512_bf16"),  # oneDNN may use it here
        (False, "the CPU has avx512_bf16 but oneDNN may not use it (ONEDNN_MAX_CPU_ISA)"))
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n\n")
    assert build.cpu_bf16_native.__wrapped__(str(cpuinfo)) == (False, "the CPU has no avx512_bf16 or amx_bf16")
    assert build.cpu_bf16_native.__wrapped__(str(tmp_path / "absent"))[0] is False

    has = (True, "the CPU has avx512_bf16")
    assert build.resolve_dtype("auto", "cpu", has) == ("bf16-mixed", f"policy.dtype=auto on cpu: {has[1]}")
    lacks = (False, "the CPU has no avx512_bf16 or amx_bf16")
    assert build.resolve_dtype("float32", "cpu", lacks) == ("float32", "policy.dtype")
    assert build.resolve_dtype("bf16-mixed", "cpu", has) == ("bf16-mixed", "policy.dtype")
    mode, why = build.resolve_dtype("bf16-mixed", "cpu", lacks)
    assert mode == "bf16-mixed" and "~100x slower" in why and "policy.dtype=auto or float32" in why
    monkeypatch.setattr(build, "cpu_bf16_native", lambda: lacks)
    line = build.configure_attention(OmegaConf.create({"attn_implementation": "sdpa", "dtype": "bfloat16"}),
                                     "cpu").line()
    assert "slow here: the CPU has no avx512_bf16 or amx_bf16" in line


def test_first_on_policy_ratio_stays_near_one_in_each_mode():
    """The hf backend's sampling logprobs (KV-cache decode) against the trainer's recomputation (one full forward)
    with the same weights, in each precision mode: the importance ratio of the first on-policy step."""
    from bench.gpu_check import ratio_check

    found = ratio_check("cpu", ARCH, prompts=8, samples=4, new_tokens=12)
    print("\nfirst on-policy ratio, embedded model on the CPU:",
          {k: {s: f"{v:.2e}" for s, v in r.items()} for k, r in found.items()})
    assert found["float32"]["max_abs_log_ratio"] < 1e-4
    # bf16: the same bf16 rounding argument as the gradients, on a logprob of size ~|log 1/100| ~ 4.6
    assert found["bf16-mixed"]["mean_abs_log_ratio"] < 2e-2
    assert found["bfloat16"]["mean_abs_log_ratio"] < 5e-2


# ---------------------------------------------------------------------------------------------- checkpointing
_LIBC = ctypes.CDLL("libc.so.6")


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def peak_rss_growth(fn) -> int:
    """The peak resident memory `fn()` added, in bytes: Linux's high-water mark VmHWM, reset just before
    (/proc/self/clear_refs 5), minus the resident size then. With glibc's mmap threshold fixed at 64 KiB (mallopt
    M_MMAP_THRESHOLD, which also stops its dynamic growth) every tensor above that is its own mapping, returned to
    the system when freed, so the resident size follows the live tensors and a previous run's freed memory is not
    reused unseen."""
    gc.collect()
    _LIBC.malloc_trim(0)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    start = _status_bytes("VmRSS")
    fn()
    return _status_bytes("VmHWM") - start


def checkpointing_peaks() -> dict[bool, int]:
    """The peak memory one forward + backward of the same 4-block model adds, with and without activation
    checkpointing, each measured on a second step: the first pays the one-time costs (lazy kernels, the gradients'
    buffers, which the second reuses)."""
    from prime_values.models import build_char_tokenizer, build_tiny_policy

    assert _LIBC.mallopt(-3, 1 << 16) == 1  # M_MMAP_THRESHOLD = 64 KiB (see peak_rss_growth)
    torch.set_num_threads(1)
    tok = build_char_tokenizer()
    ids = torch.randint(4, len(tok), (12, 64), generator=torch.Generator().manual_seed(0))
    peaks = {}
    for checkpointing in (True, False):
        model = build_tiny_policy(tok, seed=0, hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2,
                                  intermediate_size=384).train()
        if checkpointing:
            build.enable_checkpointing(model)

        def step():
            model(input_ids=ids, use_cache=False).logits.float().logsumexp(-1).mean().backward()
        step()
        peaks[checkpointing] = peak_rss_growth(step)
        model = None  # step() is done with it: freed before the next one is built
    return peaks


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs")
def test_checkpointing_gives_the_same_gradients_and_lowers_peak_memory():
    # the same gradients, policy and critic: recomputing a block's forward is deterministic on the CPU
    _, plain, _, rows = policy_grads(False)
    _, checkpointed, _, _ = policy_grads(False, rows, checkpointing=True)
    assert max(rel(checkpointed[k], plain[k]) for k in plain) < 1e-6
    _, plain, _ = critic_grads(True, rows)
    _, checkpointed, _ = critic_grads(True, rows, checkpointing=True)
    assert max(rel(checkpointed[k], plain[k]) for k in plain) < 1e-6
    # peak memory of one forward + backward whose activations dominate: 4 blocks, 12 sequences of 64 tokens.
    # Without checkpointing every block keeps ~15 tensors of 12 x 64 x (128..384) floats plus its attention
    # weights: ~8 MB a block, ~35 MB in all; with it, a block's inputs (0.4 MB each) and one block's activations
    # at a time. The model itself is 1 MB and its gradients are the same in both. So the expected ratio is ~3x
    # (measured 3.0x here, 39.1 against 13.2 MiB, and at 16 x 96 and 32 x 128 tokens); the test asks for 1.5x,
    # far above the noise of page-granular RSS (4 KiB pages, a few hundred KB of allocator bookkeeping). VmHWM is
    # the whole process's, so the steps run in a fresh process: in a test worker that had run other files first,
    # the checkpointed step's peak once read 32.6 MiB (14.7 alone), whatever else that process held or did then.
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        peaks = pool.submit(checkpointing_peaks).result(timeout=300)
    print(f"\npeak memory of a forward + backward: {peaks[False] / 2**20:.1f} MiB without activation "
          f"checkpointing, {peaks[True] / 2**20:.1f} MiB with it")
    assert peaks[False] > 1.5 * peaks[True], peaks


# ---------------------------------------------------------------------------------------------- FSDP2
def fsdp_worker(world: int, out: str) -> None:
    """One rank of a `world`-process bf16-mixed policy step on the fixed batch (saved by the 1-process run); with
    several processes, activation checkpointing on too."""
    from prime_values import dist

    torch.set_num_threads(1)
    mixed = build.configure_attention(OmegaConf.create({"attn_implementation": "sdpa", "dtype": "bf16-mixed"}), "cpu")
    dist.setup(world, "cpu")
    rows = torch.load(Path(out).parent / "rows.pt") if world > 1 else None
    from prime_values.models import build_char_tokenizer, build_tiny_policy
    from prime_values.roles.policy_trainer import train_step

    tok = build_char_tokenizer()
    model = build_tiny_policy(tok, seed=0, attention=mixed, **ARCH).train()
    assert model.pv_mixed
    if rows is None:
        rows = policy_rows(model, tok)
        torch.save(rows, Path(out) / "rows.pt")
    if world > 1:  # the sharded run also checkpoints every block (before sharding, as the trainers do)
        build.enable_checkpointing(model)
    model = dist.shard(model)
    cfg = cfg_for(micro_batch_rollouts=4)  # micro-batches of 4 and 2 rollouts
    recorder = Recorder(model)
    stats = train_step(model, recorder, rows, cfg, tok.pad_token_id, "cpu")
    kinds = sorted({str(p.dtype) for p in model.parameters()})  # the sharded master copy
    if dist.current().main:
        torch.save({"grads": recorder.grads, "stats": stats, "dtypes": kinds}, Path(out) / f"result-{world}.pt")
    dist.teardown()


def run_ranks(world: int, out: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = ("import tests.models.test_mixed_precision as t; "
            f"t.fsdp_worker({world}, {str(out)!r})")
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO), "MASTER_ADDR": "127.0.0.1",
                                   "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": str(world),
                                   "LOCAL_RANK": str(rank), "OMP_NUM_THREADS": "1"})
             for rank in range(world)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    for p, output in zip(procs, outputs):
        assert p.returncode == 0, output[-3000:]


@pytest.mark.slow
def test_two_process_fsdp_in_mixed_precision_matches_one_process(tmp_path):
    """2 gloo ranks with bf16 all-gathers and fp32 reduce-scatter (dist.shard), checkpointing every block, against
    1 process without: the same bf16
    matmul inputs (a block's fp32 weights rounded to bf16 once, by FSDP or by autocast), so what differs is the
    rounding of each rank's share of the weight gradients to bf16 before the fp32 sum: the bf16 bound again."""
    fsdp_worker(1, str(tmp_path))
    two = tmp_path / "two"
    two.mkdir()
    run_ranks(2, two)
    one, two = (torch.load(p, weights_only=False) for p in (tmp_path / "result-1.pt", two / "result-2.pt"))
    assert two["dtypes"] == ["torch.float32"]
    assert one["grads"].keys() == two["grads"].keys()
    worst = max(rel(two["grads"][k], one["grads"][k]) for k in one["grads"])
    print(f"\nFSDP2 bf16-mixed, 2 ranks vs 1 process: worst gradient rel {worst:.1e}, loss "
          f"{two['stats']['loss']:.6f} vs {one['stats']['loss']:.6f}")
    assert worst < BF16_REL, worst
    assert two["stats"]["loss"] == pytest.approx(one["stats"]["loss"], rel=BF16_LOSS_REL)


# ---------------------------------------------------------------------------------------------- backend choice
def test_inference_auto_picks_hf_without_vllm_and_says_why_in_one_line(caplog, monkeypatch):
    import logging

    from prime_values import backends
    from prime_values.backends.hf import HFBackend
    from prime_values.config import ConfigError, inference as inference_config, validate

    cfg = OmegaConf.structured(Config)
    cfg.inference.backend = "auto"
    monkeypatch.setattr(backends, "installed", lambda module: False)  # a machine without vLLM
    monkeypatch.setattr(inference_config, "vllm_installed", lambda: False)  # ... as the config check sees it
    assert backends.choose(cfg) == ("hf", "vLLM is not installed (pip install 'prime_values[vllm]' to use it)")
    validate(cfg, cuda_count=0)  # auto never strands a run
    with caplog.at_level(logging.INFO, logger="prime_values.backends"):
        backend = backends.make_backend(cfg, "cpu", None)
    assert isinstance(backend, HFBackend)
    lines = [r.getMessage() for r in caplog.records if r.name == "prime_values.backends"]
    assert lines == ["inference backend: hf (inference.backend=auto: vLLM is not installed (pip install "
                     "'prime_values[vllm]' to use it))"]
    cfg.inference.backend = "vllm"  # explicit: one line naming the extra, before any job starts
    with pytest.raises(ConfigError) as error:
        validate(cfg, cuda_count=0)
    assert "\n" not in str(error.value) and "pip install 'prime_values[vllm]'" in str(error.value)
    cfg.inference.backend, cfg.topology.inference_tp = "auto", 2
    with pytest.raises(ConfigError, match="inference_tp=2 needs vLLM, but inference=auto picks hf"):
        validate(cfg, cuda_count=2)


def test_inference_auto_picks_vllm_where_it_imports_and_hf_where_it_does_not(monkeypatch):
    import types as pytypes

    from prime_values import backends

    cfg = OmegaConf.structured(Config)
    monkeypatch.setattr(backends, "installed", lambda module: True)
    monkeypatch.setitem(sys.modules, "vllm", pytypes.SimpleNamespace(__version__="9.9"))
    assert backends.choose(cfg) == ("vllm", "vLLM 9.9 imports")
    cfg.task.name = "verifiers"
    assert backends.choose(cfg)[0] == "hf"
    cfg.task.name = "arith"
    monkeypatch.setitem(sys.modules, "vllm", None)  # installed, but `import vllm` raises
    name, why = backends.choose(cfg)
    assert name == "hf" and why.startswith("vLLM is installed but does not import (ModuleNotFoundError")


def compose_config(overrides):
    from prime_values.config import compose

    return compose(overrides)


def test_gpu_recipes_default_to_auto_backend_mixed_precision_and_checkpointing():
    for overrides in (["topology=gpu1"], ["topology=node8"], ["topology=slurm_gpu"], ["+experiment=math"]):
        cfg = compose_config(overrides)
        assert (cfg.inference.backend, cfg.policy.dtype) == ("auto", "auto"), overrides
        assert cfg.policy.activation_checkpointing and cfg.critic.activation_checkpointing, overrides
    cfg = compose_config(["topology=gpu1", "inference=hf", "policy.dtype=float32"])  # the command line wins
    assert (cfg.inference.backend, cfg.policy.dtype) == ("hf", "float32")
    cpu = compose_config([])
    assert (cpu.inference.backend, cpu.policy.dtype, cpu.policy.activation_checkpointing) == ("hf", "float32", False)


# ---------------------------------------------------------------------------------------------- the GPU check
def test_gpu_check_smoke_runs_every_part_on_the_cpu(tmp_path):
    """bench/gpu_check.py --smoke: tiny shapes, every measured part but the pipeline
    (tests/bench/test_bench_suite.py runs bench_pipeline's smoke path), one table with every row."""
    from bench import gpu_check

    result = gpu_check.main(["--smoke", "--device", "cpu", "--out", str(tmp_path)])
    roles = {(r["role"], r.get("precision"), r.get("checkpointing")) for r in result["rows"]}
    for mode in ("float32", "bf16-mixed"):
        for checkpointing in (False, True):
            assert ("policy trainer", mode, checkpointing) in roles and ("value trainer", mode, checkpointing) in roles
        assert ("inference (hf)", mode, None) in roles and ("scoring / generation", mode, None) in roles
    assert all(r["rate"] > 0 for r in result["rows"] if r["role"] != "first on-policy step: sampling vs trainer "
                                                                     "logprobs")
    table = (tmp_path / "gpu_check.md").read_text()
    assert "| tiny | policy trainer | bf16-mixed | on |" in table and "first on-policy step" in table
    assert "| tiny-llama | value trainer | bf16-mixed | on |" in table  # the SmolLM2 (Llama) architecture too


def test_mixed_lora_critic_trains_its_own_fp32_value_head():
    """PEFT copies the value head it trains (modules_to_save): under bf16-mixed the copy runs in fp32 with its own
    weights, so a LoRA critic's head is the one that learns."""
    from prime_values.models import build_char_tokenizer, build_critic, lora

    tok = build_char_tokenizer()
    critic = build.apply_precision(build_critic(None, tok, seed=0, **ARCH), True)
    settings = OmegaConf.create({"enabled": True, "r": 4, "alpha": 8, "dropout": 0.0,
                                 "target_modules": ["q_proj", "v_proj"]})
    wrapped = lora.wrap(critic, settings, "critic", base="/nonexistent/0")
    ids = torch.tensor([tok.encode("12+3=15", add_special_tokens=False)])
    before = build.critic_values(wrapped, ids)
    heads = [m for n, m in wrapped.named_modules() if n.endswith("score.modules_to_save.default")]
    assert len(heads) == 1 and isinstance(heads[0], build.Fp32Linear)
    with torch.no_grad():
        heads[0].bias.add_(1.0)
    after = build.critic_values(wrapped, ids)
    assert after.dtype == torch.float32 and torch.allclose(after, before + 1.0, atol=1e-5)
