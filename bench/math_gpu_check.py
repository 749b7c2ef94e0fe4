"""The Python side of bench/math_gpu_check.sh: a few RL steps of the math recipe on one GPU, offline, and its figures.

    python -m bench.math_gpu_check site [--venv .venv]        # here: pure-Python packages -> .gpu_site
    python -m bench.math_gpu_check probe                      # versions; which optional packages import
    python -m bench.math_gpu_check prepare --size 0.6b --dir W --device cuda:0   # model, tokenizer, data
    python -m bench.math_gpu_check figures <run_dir> [--json f]                # the throughput table

The model is Qwen3-0.6B's shape (28 layers, hidden 1024, GQA 16/8 heads of 128, vocab 151,936, tied embeddings)
with random weights, built from a config: the GPU machine has no network, so no hub download. Throughput figures
are valid for that shape (its responses run to max_new_tokens: a random model almost never samples eos); rewards
and any learning are not. The tokenizer is the project's character tokenizer padded with never-encoded filler
tokens to the model's 151,936 ids (every sampled id decodes), so prompts are ~4x longer in tokens than with
Qwen's BPE.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import platform
import shutil
import statistics
from pathlib import Path

from bench.common import ROOT, write_record

DATA = ROOT / "tests" / "data" / "math_tiny.jsonl"
# Qwen/Qwen3-0.6B-Base config.json (what shapes the compute), max_position_embeddings cut to what RL here uses
QWEN3_0_6B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
                  rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False)
# the CPU dry run: the same plumbing in seconds
TINY = dict(QWEN3_0_6B, vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, head_dim=32)
SIZES = {"0.6b": QWEN3_0_6B, "tiny": TINY}
# pure-Python packages the lent GPU machine lacks (bench/gpu_check.sh found hydra, omegaconf, antlr4, submitit
# missing; the math task adds math-verify and its latex parser)
SITE_PACKAGES = ("hydra", "omegaconf", "antlr4", "submitit", "math_verify", "latex2sympy2_extended")
PROBED = ("torch", "transformers", "vllm", "flash_attn", "pyarrow", "hydra", "omegaconf", "submitit", "math_verify",
          "latex2sympy2_extended", "sympy", "datasets", "peft")


# ---------------------------------------------------------------------------------------------- site / probe
def make_site(venv: Path, site: Path) -> None:
    """Copy the pure-Python packages of SITE_PACKAGES from `venv` into `site` (run on the CPU machine; the run
    call then carries `.gpu_site`). Refuses a package with compiled files: those would not match the GPU
    machine's Python."""
    found = list(venv.glob("lib/python3*/site-packages"))
    if not found:
        raise SystemExit(f"no site-packages under {venv}")
    for name in SITE_PACKAGES:
        src = found[0] / name
        if not src.is_dir():
            raise SystemExit(f"{name} is not installed in {venv}; pip install 'prime_values[math]' hydra-core "
                             "submitit there first")
        compiled = [p for p in src.rglob("*") if p.suffix in (".so", ".pyd")]
        if compiled:
            raise SystemExit(f"{name} has compiled files ({compiled[0]}): it cannot travel as pure Python")
        shutil.rmtree(site / name, ignore_errors=True)
        shutil.copytree(src, site / name, ignore=shutil.ignore_patterns("__pycache__"))
        print(f"{site / name}")


def probe() -> dict:
    """Versions of the packages the run uses and whether the optional ones import; the GPU's name."""
    found = {"python": platform.python_version()}
    for name in PROBED:
        try:
            module = importlib.import_module(name)
            found[name] = str(getattr(module, "__version__", "importable"))
        except Exception as error:  # noqa: BLE001 - missing or broken: either way not usable
            found[name] = f"NO ({type(error).__name__}: {str(error).splitlines()[0][:100] if str(error) else ''})"
    try:
        import torch

        found["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
        found["torch.version.cuda"] = str(torch.version.cuda)
    except Exception as error:  # noqa: BLE001
        found["device"] = f"unknown ({error})"
    return found


# ---------------------------------------------------------------------------------------------- prepare
DATASETS_STANDIN = '''"""A stand-in for HF datasets, written by bench/math_gpu_check.py on a machine without it: only
what the math task's loader calls for one local .jsonl file (load_dataset('json', data_files=...)). Never used where
datasets imports."""
import json
import types

logging = types.SimpleNamespace(set_verbosity_error=lambda: None)


def disable_progress_bars():
    pass


class _Rows:
    def __init__(self, rows):
        self._rows = rows
        self.column_names = list(rows[0]) if rows else []

    def select_columns(self, columns):
        return _Rows([{c: r[c] for c in columns} for r in self._rows])

    def to_list(self):
        return list(self._rows)


def load_dataset(builder, data_files=None, split="train", cache_dir=None, **_):
    if builder != "json" or not isinstance(data_files, str):
        raise NotImplementedError("the math_gpu_check stand-in for datasets reads one local .jsonl file only")
    with open(data_files) as f:
        return _Rows([json.loads(line) for line in f if line.strip()])
'''


def filler_tokenizer(vocab_size: int):
    """The project's character tokenizer with filler tokens `<f{i}>` up to `vocab_size` ids: encoding never
    produces them (every character is its own pre-token), decoding any id the model samples works."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from prime_values.models.tokenizer import BOS, EOS, PAD, UNK, char_vocab

    vocab = char_vocab()
    for i in range(len(vocab), vocab_size):
        vocab[f"<f{i}>"] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, bos_token=BOS, unk_token=UNK,
                                   clean_up_tokenization_spaces=False, padding_side="right", model_max_length=1 << 20)


def synthetic_rows(repeat: int) -> list[dict]:
    """GSM8K-format rows (question / answer ending in '#### n'): the 11 GSM8K rows of tests/data/math_tiny.jsonl
    (the others are MATH-format), each `repeat` times with a distinct question prefix."""
    base = [r for r in (json.loads(line) for line in DATA.read_text().splitlines() if line.strip())
            if "question" in r]
    return [{"question": f"(Problem {k}.{i}) {row['question']}", "answer": row["answer"]}
            for k in range(repeat) for i, row in enumerate(base)]


def prepare(size: str, work: Path, device: str, repeat: int) -> dict:
    """`work/model` (random weights, Qwen3 shape `size`, fp32 safetensors + tokenizer), `work/gsm8k_synthetic.jsonl`,
    and `work/standin_site/datasets` when HF datasets does not import here."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from prime_values.models.build import save_model

    work.mkdir(parents=True, exist_ok=True)
    data = work / "gsm8k_synthetic.jsonl"
    rows = synthetic_rows(repeat)
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    arch = SIZES[size]
    tok = filler_tokenizer(arch["vocab_size"])
    assert len(tok) == arch["vocab_size"]
    cfg = Qwen3Config(**arch, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                      bos_token_id=tok.bos_token_id, attention_dropout=0.0, use_cache=True)
    init_device = device if device.startswith("cuda") and torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with torch.device(init_device):  # initialising 0.6B parameters is seconds on a GPU, a minute on a CPU
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    save_model(model.cpu(), tok, work / "model")
    params = sum(p.numel() for p in model.parameters())
    standin = None
    if importlib.util.find_spec("datasets") is None:
        standin = work / "standin_site" / "datasets"
        standin.mkdir(parents=True, exist_ok=True)
        (standin / "__init__.py").write_text(DATASETS_STANDIN)
    info = {"model": str(work / "model"), "size": size, "parameters": params, "vocab": len(tok),
            "data": str(data), "rows": len(rows), "datasets_standin": str(standin) if standin else None}
    print(json.dumps(info))
    return info


# ---------------------------------------------------------------------------------------------- figures
def _records(run_dir: Path, pattern: str) -> dict[str, list[dict]]:
    out = {}
    for path in sorted((run_dir / "metrics").glob(pattern)):
        rows = []
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue  # a torn last line of a killed role
        out[path.stem] = rows
    return out


def _rate(rows: list[dict], rate_key: str, total_rate_key: str, time_key: str) -> dict:
    """Aggregate tokens/s over `rows`: tokens = total_rate * time (what the role measured), busy time = tokens / rate.
    Also without each role's first record (CUDA warm-up, vLLM graph capture, allocator growth)."""
    def agg(rs):
        tokens = sum(r[total_rate_key] * r[time_key] for r in rs)
        busy = sum(r[total_rate_key] * r[time_key] / r[rate_key] for r in rs if r[rate_key] > 0)
        return tokens, busy
    tokens, busy = agg(rows)
    later = rows[1:]
    tokens_later, busy_later = agg(later)
    return {"records": len(rows), "tokens": round(tokens), "tokens_per_s": tokens / busy if busy else None,
            "tokens_per_s_after_first": tokens_later / busy_later if busy_later else None,
            "median_record_tokens_per_s": statistics.median(r[rate_key] for r in rows) if rows else None}


def _steps(values: list[float]) -> dict:
    return {"steps": len(values), "median_s": statistics.median(values) if values else None,
            "mean_s": statistics.fmean(values) if values else None,
            "median_s_after_first": statistics.median(values[1:]) if len(values) > 1 else None}


def extract(run_dir: str | os.PathLike) -> dict:
    """The check's figures from a run's metrics/*.jsonl: inference generation tokens/s (inference*.jsonl:
    generate_tokens_per_s over the generation alone, tokens_per_s incl. the log write, gen_s), evaluator scoring
    tokens/s (evaluator*.jsonl: forward_states_per_s over the critic forward passes alone, states_per_s, score_s),
    policy-trainer step time (policy_trainer.jsonl: train_s of each step record, the update and publishing the
    version; the io part from the cumulative io_s) and value-trainer step time
    (value_trainer.jsonl: step_s of each critic step)."""
    run_dir = Path(run_dir)
    inference = [r for rows in _records(run_dir, "inference*.jsonl").values()
                 for r in rows if "generate_tokens_per_s" in r]
    evaluator = [r for rows in _records(run_dir, "evaluator*.jsonl").values()
                 for r in rows if "forward_states_per_s" in r]
    policy_rows = _records(run_dir, "policy_trainer.jsonl").get("policy_trainer", [])
    policy = [r for r in policy_rows if "train_s" in r]
    io, previous = [], 0.0  # the io part of each step (publishing the version): io_s is cumulative over the role
    for r in policy_rows:
        if "train_s" in r and "io_s" in r:
            io.append(r["io_s"] - previous)
        previous = r.get("io_s", previous)
    value = [r for r in _records(run_dir, "value_trainer.jsonl").get("value_trainer", [])
             if "critic_step" in r and "step_s" in r]
    return {
        "run_dir": str(run_dir),
        "inference": _rate(inference, "generate_tokens_per_s", "tokens_per_s", "gen_s"),
        "evaluator": _rate(evaluator, "forward_states_per_s", "states_per_s", "score_s"),
        "policy_trainer": {**_steps([r["train_s"] for r in policy]),
                           "median_io_s": statistics.median(io) if io else None,
                           "median_wait_s": statistics.median(r["step_wait_s"] for r in policy) if policy else None,
                           "rollouts_per_step": policy[-1]["rollouts"] if policy else None},
        "value_trainer": _steps([r["step_s"] for r in value]),
    }


def _fmt(value, digits: int = 4) -> str:
    if value is None:
        return "—"
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def table(fig: dict) -> str:
    i, e, p, v = fig["inference"], fig["evaluator"], fig["policy_trainer"], fig["value_trainer"]
    lines = [
        "| figure | value | after the first record | over |",
        "|---|---|---|---|",
        f"| inference: generated tokens/s | {_fmt(i['tokens_per_s'])} | {_fmt(i['tokens_per_s_after_first'])} | "
        f"{i['records']} chunks, {i['tokens']} tokens |",
        f"| evaluator: scored tokens/s (critic forward) | {_fmt(e['tokens_per_s'])} | "
        f"{_fmt(e['tokens_per_s_after_first'])} | {e['records']} batches, {e['tokens']} tokens |",
        f"| policy trainer: step time, median (s) | {_fmt(p['median_s'])} | {_fmt(p['median_s_after_first'])} | "
        f"{p['steps']} steps of {_fmt(p['rollouts_per_step'])} rollouts; of a step, io (publishing the version) "
        f"{_fmt(p['median_io_s'])} s; median wait for a batch {_fmt(p['median_wait_s'])} s |",
        f"| value trainer: critic step time, median (s) | {_fmt(v['median_s'])} | "
        f"{_fmt(v['median_s_after_first'])} | {v['steps']} critic steps |",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("site", help="copy the pure-Python packages the GPU machine lacks into .gpu_site")
    s.add_argument("--venv", default=str(ROOT / ".venv"))
    s.add_argument("--site", default=str(ROOT / ".gpu_site"))
    sub.add_parser("probe", help="versions and which optional packages import")
    p = sub.add_parser("prepare", help="random-weight model + tokenizer + synthetic GSM8K jsonl")
    p.add_argument("--size", choices=sorted(SIZES), default="0.6b")
    p.add_argument("--dir", required=True)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--repeat", type=int, default=40, help="copies of the 11 GSM8K rows of tests/data/math_tiny.jsonl")
    f = sub.add_parser("figures", help="the throughput table of a run directory")
    f.add_argument("run_dir")
    f.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    if args.command == "site":
        make_site(Path(args.venv), Path(args.site))
    elif args.command == "probe":
        for key, value in probe().items():
            print(f"{key:>22}: {value}")
    elif args.command == "prepare":
        prepare(args.size, Path(args.dir), args.device, args.repeat)
    else:
        fig = extract(args.run_dir)
        if args.json:
            write_record(args.json, fig)
        print(table(fig))


if __name__ == "__main__":
    main()
