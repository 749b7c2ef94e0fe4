"""Math word problems from GSM8K-style and MATH-style data, checked with ``math-verify``.

Data goes through HF ``datasets``: ``data`` is a local ``.jsonl`` / ``.json`` / ``.parquet`` / ``.csv`` file (or a
directory of them), or a hub dataset name (``openai/gsm8k`` with ``data_config="main"``, ``HuggingFaceH4/MATH-500``)
when the hub is reachable or the dataset is already in the local HF cache. A missing local path, or a hub name
while ``HF_HUB_OFFLINE=1`` with nothing cached, fails at once with one line (``MathDataError``) — before
``datasets`` is even imported, so there are no network retries.

Row formats, detected per row (one file may mix them):
- GSM8K: ``question`` + ``answer`` = ``"<rationale>\\n#### <final>"``; the final answer is what follows the last
  ``####``, the rationale (calculator annotations ``<<...>>`` removed) is the reference solution;
- MATH: ``problem`` + ``solution`` whose last ``\\boxed{...}`` is the final answer (braces matched, not a regex);
- either prompt column + a plain ``answer`` column (MATH-500 style), with ``solution`` used when present.
Rows without a prompt or a final answer are skipped and counted (``describe()["skipped_rows"]``).

The held-out split is fixed by content: unique prompts are ordered by ``sha1(seed:prompt)`` and the first
``heldout_size`` are held out, so it does not depend on row order, process or run seed. With ``heldout_data`` the
held-out set comes from that source instead (``heldout_size=0``: all of it). Training never samples a held-out
prompt.

Privileged context (for the critic only): ``"Reference answer: <final>"``, plus ``"\\nReference solution:\\n
<solution>"`` when the row has one and ``privileged_solution`` is on.

Scoring runs in a sandboxed worker pool (``prime_values.tasks.verify``): use ``score_many`` for batches; ``score``
is one call through the same pool. Timeouts, crashes and truncations are counted in ``verifier_stats()``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
from pathlib import Path

from .arith import Problem
from .verify import PooledVerification

log = logging.getLogger(__name__)

DEFAULT_TEMPLATE = "{question}\nPlease reason step by step, and put your final answer within \\boxed{}."
_LOCAL_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
_PROMPT_KEYS = ("question", "problem")


class MathDataError(ValueError):
    """The configured data cannot be found or used; the message is one line saying how to fix it."""


# ---------------------------------------------------------------------------------------------- parsing rows
def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in trusted reference text, braces matched."""
    if not isinstance(text, str):
        return None
    best = None
    for cmd in ("\\boxed", "\\fbox"):
        i = text.rfind(cmd)
        if i >= 0 and (best is None or i > best[0]):
            best = (i, cmd)
    if best is None:
        return None
    j = best[0] + len(best[1])
    while j < len(text) and text[j] == " ":
        j += 1
    if j >= len(text):
        return None
    if text[j] != "{":  # "\boxed 5": up to the next space or '$'
        end = j
        while end < len(text) and text[end] not in " $\n":
            end += 1
        return text[j:end].strip() or None
    depth = 0
    for k in range(j, len(text)):
        c = text[k]
        if c == "{" and text[k - 1] != "\\":
            depth += 1
        elif c == "}" and text[k - 1] != "\\":
            depth -= 1
            if depth == 0:
                return text[j + 1:k].strip() or None
    return None  # unbalanced


def _strip_calculator(text: str) -> str:
    """Remove GSM8K calculator annotations ``<<48/2=24>>``."""
    out, i = [], 0
    while True:
        a = text.find("<<", i)
        if a < 0:
            out.append(text[i:])
            break
        b = text.find(">>", a + 2)
        if b < 0:
            out.append(text[i:])
            break
        out.append(text[i:a])
        i = b + 2
    return "".join(out)


def _as_text(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    s = str(value).strip()
    return s or None


def parse_row(row: dict) -> dict | None:
    """``{"question", "answer", "solution", "source"}`` from one GSM8K- or MATH-style row, or None."""
    question = next((_as_text(row.get(k)) for k in _PROMPT_KEYS if _as_text(row.get(k))), None)
    if question is None:
        return None
    answer, solution = _as_text(row.get("answer")), _as_text(row.get("solution"))
    if answer is not None and "####" in answer:
        rationale, final = answer.rsplit("####", 1)
        final = final.strip()
        rationale = _strip_calculator(rationale).strip()
        return {"question": question, "answer": final, "solution": rationale or None, "source": "gsm8k"} \
            if final else None
    if answer is not None:
        return {"question": question, "answer": answer, "solution": solution,
                "source": "math" if solution else "qa"}
    final = last_boxed(solution) if solution else None
    if final is None:
        return None
    return {"question": question, "answer": final, "solution": solution, "source": "math"}


# ---------------------------------------------------------------------------------------------- loading
def _hub_offline() -> bool:
    return any(os.environ.get(k, "").strip().upper() in {"1", "ON", "YES", "TRUE"}
               for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def _hub_cached(name: str, cache_dir: str | None) -> bool:
    """Is anything for hub dataset ``name`` in the local caches (so an offline load may work)?"""
    hf_home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")).expanduser()
    roots = [Path(cache_dir).expanduser()] if cache_dir else []
    roots.append(Path(os.environ.get("HF_DATASETS_CACHE", hf_home / "datasets")).expanduser())
    hub = Path(os.environ.get("HF_HUB_CACHE", os.environ.get("HUGGINGFACE_HUB_CACHE", hf_home / "hub"))).expanduser()
    candidates = [r / name.replace("/", "___") for r in roots]
    candidates.append(hub / ("datasets--" + name.replace("/", "--")))
    return any(c.exists() for c in candidates)


def _looks_local(data: str) -> bool:
    p = Path(data)
    return (p.suffix.lower() in _LOCAL_BUILDERS or data.startswith(("/", ".", "~")) or data.count("/") > 1
            or os.sep != "/" and os.sep in data)


def resolve_source(data: str, key: str = "task.data", cache_dir: str | None = None) -> tuple[str, str]:
    """``("local", path)`` or ``("hub", name)``; raise ``MathDataError`` at once when neither can work.

    Cheap (no ``datasets`` import, no network): meant for config validation before any job starts."""
    fix = "pass a local .jsonl/.parquet path or a hub dataset name with network access"
    if not isinstance(data, str) or not data.strip():
        raise MathDataError(f"{key} is empty; {fix}")
    data = data.strip()
    p = Path(data).expanduser()
    if p.exists():
        if p.is_file() and p.suffix.lower() not in _LOCAL_BUILDERS:
            raise MathDataError(f"{key}={data!r} has an unsupported extension; use one of "
                                f"{', '.join(sorted(_LOCAL_BUILDERS))}")
        return "local", str(p)
    if _looks_local(data):
        raise MathDataError(f"{key}={data!r} not found (no such file); {fix}")
    if _hub_offline() and not _hub_cached(data, cache_dir):
        raise MathDataError(f"{key}={data!r} not found: no such local file, and HF_HUB_OFFLINE=1 with nothing cached "
                            f"for that hub name; {fix}")
    return "hub", data


def load_rows(data: str, split: str = "train", data_config: str | None = None, cache_dir: str | None = None,
              key: str = "task.data") -> list[dict]:
    """Rows of ``data`` (see ``resolve_source``) as dicts, via HF ``datasets``. A local file is its own split."""
    kind, where = resolve_source(data, key, cache_dir)
    try:
        import datasets
    except ImportError:
        raise MathDataError(f"{key}: the math task needs HF datasets (pip install 'datasets>=4')") from None
    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    try:
        if kind == "local":
            p = Path(where)
            if p.is_dir():
                ds = datasets.load_dataset(str(p), split=split, cache_dir=cache_dir)
            else:
                ds = datasets.load_dataset(_LOCAL_BUILDERS[p.suffix.lower()], data_files=str(p), split="train",
                                           cache_dir=cache_dir)
        else:
            ds = datasets.load_dataset(where, data_config, split=split, cache_dir=cache_dir)
    except Exception as e:  # noqa: BLE001 - one line for the user, whatever datasets raised
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise MathDataError(f"{key}={data!r} (split {split!r}) could not be loaded: {type(e).__name__}: {first}") \
            from None
    keep = [c for c in ds.column_names if c in {*_PROMPT_KEYS, "answer", "solution"}]
    if not any(c in keep for c in _PROMPT_KEYS):
        raise MathDataError(f"{key}={data!r} has no 'question' or 'problem' column (columns: {ds.column_names})")
    return ds.select_columns(keep).to_list()


# ---------------------------------------------------------------------------------------------- the task
def check_settings(prompt_template: str, heldout_size: int) -> None:
    """The rules of the task's settings that need no data: the constructor and the config check
    (prime_values/config/task.py) call this. Raises MathDataError (one line naming the key)."""
    if "{question}" not in prompt_template:
        raise MathDataError(f"task.prompt_template={prompt_template!r} must contain '{{question}}'")
    if heldout_size < 0:
        raise MathDataError(f"task.heldout_size={heldout_size} must be >= 0")


class MathTask(PooledVerification):
    """GSM8K/MATH prompts, a fixed held-out split, privileged reference context, math-verify scoring.

    Arguments (config keys ``task.<name>``):
    ``data``: local file / directory or hub name; ``split``: split of a hub dataset (a local file is its own);
    ``data_config``: hub dataset config (``"main"`` for gsm8k); ``heldout_data``/``heldout_split``: optional
    separate held-out source (default: carved out of ``data``); ``heldout_size``: held-out prompts (0 with
    ``heldout_data``: all of it); ``seed``: held-out selection; ``prompt_template``: ``{question}`` is replaced by the
    question text (other braces are literal); ``privileged_solution``: include the reference solution in the
    critic's context; ``max_response_chars``: what ``max_answer_chars()`` reports (a generation-budget hint);
    ``verifier_*``: the worker pool (see ``VerifierPool``); ``data_cache_dir``: HF datasets cache directory.
    """

    name = "math"

    def __init__(self, data: str = "", split: str = "train", data_config: str | None = None,
                 heldout_data: str | None = None, heldout_split: str = "test", heldout_size: int = 200,
                 seed: int = 1234, prompt_template: str = DEFAULT_TEMPLATE, privileged_solution: bool = True,
                 max_response_chars: int = 1024, verifier_workers: int = 2, verifier_timeout_s: float = 3.0,
                 verifier_batch_timeout_s: float = 60.0, verifier_max_chars: int = 4096,
                 verifier_memory_mb: int | None = 4096, data_cache_dir: str | None = None) -> None:
        check_settings(prompt_template, heldout_size)
        self.data, self.split, self.data_config = data, split, data_config
        self.heldout_data, self.heldout_split = heldout_data or None, heldout_split
        self.heldout_size, self.seed = heldout_size, seed
        self.prompt_template, self.privileged_solution = prompt_template, privileged_solution
        self.max_response_chars = max_response_chars
        self._init_pool(verifier_workers, verifier_timeout_s, verifier_batch_timeout_s, verifier_max_chars,
                        verifier_memory_mb)
        if self.heldout_data:  # check both sources before loading either
            resolve_source(self.heldout_data, "task.heldout_data", data_cache_dir)

        self.skipped_rows = 0
        train = self._problems(load_rows(data, split, data_config, data_cache_dir, "task.data"), "task.data", data)
        if self.heldout_data:
            held = self._problems(load_rows(self.heldout_data, heldout_split, data_config, data_cache_dir,
                                            "task.heldout_data"), "task.heldout_data", self.heldout_data)
            held = self._ordered(held)
            if heldout_size:
                held = held[:heldout_size]
        else:
            ordered = self._ordered(train)
            if heldout_size >= len(ordered):
                raise MathDataError(f"task.heldout_size={heldout_size} leaves no training prompts: task.data={data!r} "
                                    f"has {len(ordered)} unique prompts; lower it or set task.heldout_data")
            held = ordered[:heldout_size]
        self._heldout = held
        self._heldout_prompts = frozenset(p.prompt for p in held)
        self._train = [p for p in train if p.prompt not in self._heldout_prompts]
        if not self._train:
            raise MathDataError(f"task.data={data!r}: no training prompts left after removing the held-out ones")

    # ------------------------------------------------------------------ problems
    def _problems(self, rows: list[dict], key: str, data: str) -> list[Problem]:
        out, skipped = [], 0
        for i, row in enumerate(rows):
            parsed = parse_row(row)
            if parsed is None:
                skipped += 1
                continue
            out.append(self.make_problem(parsed["question"], parsed["answer"], parsed["solution"],
                                         source=parsed["source"], row=i))
        if skipped:
            log.warning("%s=%r: skipped %d of %d rows without a question/problem or a final answer "
                        "(GSM8K '#### x', MATH '\\boxed{x}' or an 'answer' column)", key, data, skipped, len(rows))
        if not out:
            raise MathDataError(f"{key}={data!r}: none of its {len(rows)} rows has a question/problem and a final "
                                "answer")
        self.skipped_rows += skipped
        return out

    def make_problem(self, question: str, answer: str, solution: str | None = None, source: str = "qa",
                     row: int | None = None) -> Problem:
        prompt = self.prompt_template.replace("{question}", question)
        pid = f"math:{hashlib.sha1(prompt.encode()).hexdigest()[:12]}"
        privileged = f"Reference answer: {answer}"
        if solution and self.privileged_solution:
            privileged += f"\nReference solution:\n{solution}"
        return Problem(prompt_id=pid, prompt=prompt, answer=answer, privileged=privileged,
                       meta={"question": question, "solution": solution, "source": source, "row": row})

    def _ordered(self, problems: list[Problem]) -> list[Problem]:
        unique: dict[str, Problem] = {}
        for p in problems:
            unique.setdefault(p.prompt, p)
        return sorted(unique.values(),
                      key=lambda p: hashlib.sha1(f"{self.seed}:{p.prompt}".encode()).hexdigest())

    def sample(self, rng: random.Random, n: int) -> list[Problem]:
        """``n`` training problems drawn uniformly with replacement, never a held-out prompt."""
        return [self._train[rng.randrange(len(self._train))] for _ in range(n)]

    def heldout(self) -> list[Problem]:
        """The fixed evaluation set: same for every process given the data and the seed."""
        return list(self._heldout)

    def is_heldout(self, problem: Problem) -> bool:
        return problem.prompt in self._heldout_prompts

    def train_size(self) -> int:
        return len(self._train)

    # ------------------------------------------------------------------ verifier
    def score_many(self, problems: list[Problem], texts: list[str], deadline_s: float | None = None) -> list[float]:
        """1.0 where the response's final answer is equivalent to the reference (math-verify), else 0.0.

        Returns within ``deadline_s`` (default ``verifier_batch_timeout_s``); timeouts/crashes score 0.0."""
        if len(problems) != len(texts):
            raise ValueError(f"{len(problems)} problems for {len(texts)} texts")
        return self.verifier.score_many([p.answer for p in problems], list(texts), deadline_s=deadline_s)

    # ------------------------------------------------------------------ supervision and metadata
    def solution(self, problem: Problem) -> str:
        """Target response for supervised fine-tuning: the reference reasoning ending in ``\\boxed{answer}``."""
        sol = problem.meta.get("solution")
        if sol and problem.meta.get("source") == "math" and last_boxed(sol) is not None:
            return sol
        tail = f"The final answer is $\\boxed{{{problem.answer}}}$."
        return f"{sol}\n{tail}" if sol else tail

    def max_answer_chars(self) -> int:
        """A generation-budget hint (``max_response_chars``): chain-of-thought answers have no hard bound."""
        return self.max_response_chars

    def describe(self) -> dict:
        sources: dict[str, int] = {}
        for p in self._train:
            sources[p.meta["source"]] = sources.get(p.meta["source"], 0) + 1
        return {
            "name": self.name,
            "data": self.data,
            "split": self.split,
            "data_config": self.data_config,
            "heldout_data": self.heldout_data,
            "heldout_size": len(self._heldout),
            "train_rows": len(self._train),
            "train_sources": sources,
            "skipped_rows": self.skipped_rows,
            "seed": self.seed,
            "privileged_solution": self.privileged_solution,
            "verifier": dict(self._pool_args),
            "prompt_example": self._heldout[0].prompt if self._heldout else None,
        }
