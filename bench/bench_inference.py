"""Inference backends on the same model: engine start, in-place adoption per version, tokens/s (hf vs vllm).

    python -m bench.bench_inference [--backends hf,vllm] [--rows 128] [--new-tokens 32] [--versions 5]

Builds the embedded tiny policy (policy.arch defaults, 0.85M) with random weights, so every rollout runs to
--new-tokens (eos is rare): tokens/s = rows x new tokens / wall time of one `backend.sample` call (median of 3,
after one warm-up call). The vllm backend needs vLLM (tests/vllm/run.sh builds a venv with it); OMP_NUM_THREADS
sets the threads of both (default 2).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="hf,vllm")
    parser.add_argument("--rows", type=int, default=128, help="rollouts per sample call (prompts x group)")
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--versions", type=int, default=5, help="versions published and adopted in place")
    args = parser.parse_args()
    threads = int(os.environ.setdefault("OMP_NUM_THREADS", "2"))

    import torch
    from omegaconf import OmegaConf

    from prime_values.backends import make_backend
    from prime_values.config import Config
    from prime_values.models import build_char_tokenizer, build_tiny_policy, save_model
    from prime_values.weights import publish

    torch.set_num_threads(threads)
    tokenizer = build_char_tokenizer()
    prompts = [tokenizer.encode(f"{10 + i}+{20 + 3 * i}=", add_special_tokens=False)
               for i in range(args.rows // args.group)]
    for name in args.backends.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp) / "policy"
            publish(root, 0, lambda path: save_model(build_tiny_policy(tokenizer, seed=0), tokenizer, path))
            cfg = OmegaConf.structured(Config)
            cfg.inference.backend, cfg.topology.threads_per_role = name, threads
            backend = make_backend(cfg, "cpu", root, seed=0)
            began = time.perf_counter()
            backend.policy.wait(timeout_s=600)
            start_s = time.perf_counter() - began
            adopt = []
            for v in range(1, args.versions + 1):
                model = build_tiny_policy(tokenizer, seed=v)
                publish(root, v, lambda path: save_model(model, tokenizer, path))
                began = time.perf_counter()
                assert backend.policy.poll()
                adopt.append(time.perf_counter() - began)

            def run(seed):
                began = time.perf_counter()
                out = backend.sample(prompts, num_samples=args.group, max_new_tokens=args.new_tokens,
                                     temperature=1.0, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
                                     seed=seed)
                return sum(len(c.response_ids) for c in out) / (time.perf_counter() - began)

            run(0)
            rates = [run(seed) for seed in (1, 2, 3)]
            print(f"{name:5s} start {start_s:6.1f} s | adopt a version {statistics.median(adopt) * 1000:7.1f} ms "
                  f"(median of {len(adopt)}) | {statistics.median(rates):8.0f} tokens/s "
                  f"({args.rows} x {args.new_tokens}, {threads} threads)", flush=True)
            backend.close()


if __name__ == "__main__":
    main()
