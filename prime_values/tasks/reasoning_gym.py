"""Problems generated offline by `reasoning-gym` (``basic_arithmetic``, ``chain_sum``, ``gsm_symbolic``, ...),
checked with ``math-verify`` in the sandboxed verifier pool.

- **Problems.** ``reasoning_gym.create_dataset(dataset, size=dataset_size, seed=seed, **dataset_args)`` generates
  the same ``dataset_size`` problems in every process (no data files, no network). Each entry's ``question`` goes
  into ``prompt_template`` (``{question}``); its ``answer`` is the reference.
- **Held-out split, fixed by content.** Unique questions are ordered by ``sha1(seed:question)`` and the first
  ``heldout_size`` are held out; training samples only the others, and a question text that is held out never
  appears in training (duplicates of it are dropped from the training pool).
- **Chat template.** With ``chat=true`` (the default) the prompt is the policy tokenizer's chat template applied
  to one user turn, with the generation prompt (``<|im_start|>assistant\\n`` for SmolLM2): the text the model was
  instruction-tuned on, encoded without extra special tokens. ``chat_tokenizer`` names that tokenizer (a
  ``from_pretrained`` directory or hub id; the task config sets it to ``${policy.model}``); a tokenizer without a
  chat template is a one-line error. ``chat=false`` uses the template's text as it is.
- **Answer format and reward.** The prompt asks for the final answer in ``\\boxed{...}`` (``answer_format=boxed``)
  or on a last line ``Answer: <answer>`` (``answer_format=answer_line``). The reward extracts that final answer
  first, and only it is checked: 1.0 when it equals the reference as a string or math-verify finds it equivalent
  (through ``prime_values.tasks.verify``'s pool, as for task=math), else 0.0; a response without a final answer
  in that format scores 0.0 (``parsable()`` says which). reasoning-gym's own ``score_answer`` is not used: it
  gives (partial) credit for an answer that appears anywhere in the text.
- **Privileged context** (the critic only): ``"Reference answer: <answer>"``, plus ``"\\nReference solution:\\n
  <steps>"`` when the generator gives a worked solution in its metadata (``gsm_symbolic``'s ``answer_cot``; the
  expression of ``chain_sum`` / ``basic_arithmetic`` / ``products``) and ``privileged_solution`` is on.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import random
from pathlib import Path

from .arith import Problem
from .math import last_boxed
from .verify import PooledVerification

ANSWER_FORMATS = {
    "boxed": "\nPut your final answer within \\boxed{}.",
    "answer_line": "\nEnd your reply with a final line 'Answer: <answer>'.",
}
DEFAULT_TEMPLATE = "{question}" + ANSWER_FORMATS["boxed"]
# metadata keys that hold a worked solution, in order of preference (the first present is used)
_SOLUTION_KEYS = ("answer_cot", "solution", "cot", "expression")


class ReasoningGymError(ValueError):
    """The configured dataset cannot be generated or used; the message is one line saying how to fix it."""


def dataset_names() -> list[str]:
    """Every dataset name reasoning-gym registers (importing it registers them)."""
    try:
        from reasoning_gym.factory import DATASETS
    except ImportError:
        raise ReasoningGymError("task=reasoning_gym needs reasoning-gym: pip install 'prime_values[reasoning_gym]' "
                                "(or pip install -e '.[reasoning_gym]' in a checkout)") from None
    return sorted(DATASETS)


def check_dataset(name: str, key: str = "task.dataset") -> None:
    """Raise ``ReasoningGymError`` (one line, with the close matches) unless ``name`` is a reasoning-gym dataset.

    Cheap (imports the registry, generates nothing): meant for config validation before any job starts."""
    names = dataset_names()
    if not isinstance(name, str) or not name.strip():
        raise ReasoningGymError(f"{key} is empty; name a reasoning-gym dataset, e.g. chain_sum, basic_arithmetic "
                                f"or gsm_symbolic ({len(names)} are installed)")
    if name not in names:
        near = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
        hint = f"close matches: {', '.join(near)}" if near else f"e.g. {', '.join(names[:5])}, ..."
        raise ReasoningGymError(f"{key}={name!r} is not a reasoning-gym dataset; {hint} "
                                f"({len(names)} in reasoning_gym.factory.DATASETS)")


def check_chat_source(source: str, key: str = "task.chat_tokenizer") -> None:
    """Cheap, before any job starts: raise ``ReasoningGymError`` when ``source`` surely has no chat template (the
    embedded tiny model's character tokenizer; a local directory whose tokenizer files hold none). A hub id or a
    GGUF file (converted later) is left to the task itself."""
    fix = "use an instruction-tuned model's tokenizer (e.g. policy=smollm2_135m) or set task.chat=false"
    if source == "tiny":
        raise ReasoningGymError(f"{key}='tiny': the embedded model's character tokenizer has no chat template, and "
                                f"task.chat=true renders the prompt with it; {fix}")
    path = Path(source).expanduser()
    if not path.is_dir():
        return
    if (path / "chat_template.jinja").exists() or (path / "chat_template.json").exists():
        return
    config = path / "tokenizer_config.json"
    try:
        has = bool(json.loads(config.read_text()).get("chat_template")) if config.exists() else False
    except (OSError, ValueError):
        return  # unreadable here: the task's own load says what is wrong
    if not has:
        raise ReasoningGymError(f"{key}={source!r} has no chat template (no chat_template.jinja, none in "
                                f"tokenizer_config.json), and task.chat=true renders the prompt with it; {fix}")


def extract_answer(text: str, answer_format: str = "boxed") -> str | None:
    """The response's final answer in ``answer_format``, or None: the last ``\\boxed{...}`` (braces matched), or
    what follows ``Answer:`` on the last line that starts with it (``answer_line``; ``$``, ``**`` and a final
    period stripped)."""
    if not isinstance(text, str):
        return None
    if answer_format == "boxed":
        return last_boxed(text)
    for line in reversed(text.strip().splitlines()):
        stripped = line.strip().lstrip("*#> ").strip()
        if stripped.lower().startswith("answer:"):
            value = stripped[len("answer:"):].strip().rstrip(".").strip("*$ ")
            return value or None
    return None


def _chat_renderer(source: str):
    """``render(text) -> prompt`` with the chat template of tokenizer ``source``."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(source)
    except Exception as e:  # noqa: BLE001 - one line for the user, whatever transformers raised
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise ReasoningGymError(f"task.chat_tokenizer={source!r} could not be loaded ({type(e).__name__}: {first}); "
                                "point it at the policy's from_pretrained directory, or set task.chat=false") from None
    if not getattr(tok, "chat_template", None):
        raise ReasoningGymError(f"task.chat_tokenizer={source!r} has no chat template, and task.chat=true renders "
                                "the prompt with it; use an instruction-tuned model's tokenizer or set task.chat=false")

    def render(text: str) -> str:
        return tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                       add_generation_prompt=True)

    return render


def check_settings(dataset: str, prompt_template: str, answer_format: str, dataset_size: int, heldout_size: int,
                   chat: bool, chat_tokenizer: str) -> None:
    """The task's rules that need no generated problem: the constructor and the config check
    (prime_values/config/task.py) call this. Raises ReasoningGymError (one line naming the key and the fix)."""
    check_dataset(dataset)
    if answer_format not in ANSWER_FORMATS:
        raise ReasoningGymError(f"task.answer_format={answer_format!r} is not allowed; choose one of "
                                f"{', '.join(ANSWER_FORMATS)}")
    if "{question}" not in prompt_template:
        raise ReasoningGymError(f"task.prompt_template={prompt_template!r} must contain '{{question}}'")
    if heldout_size < 1 or dataset_size <= heldout_size:
        raise ReasoningGymError(f"task.dataset_size={dataset_size} must exceed task.heldout_size={heldout_size} "
                                "(>= 1): the held-out problems are carved out of the generated ones")
    if chat and not chat_tokenizer:
        raise ReasoningGymError("task.chat=true needs task.chat_tokenizer (the policy's tokenizer: "
                                "${policy.model}); or set task.chat=false for the raw template text")


class ReasoningGymTask(PooledVerification):
    """A reasoning-gym dataset as a task: chat-formatted prompts, a held-out split by content, privileged
    reference answer (and steps), a final-answer reward through math-verify.

    Arguments (config keys ``task.<name>``): ``dataset``: the reasoning-gym dataset name; ``dataset_args``: its
    config fields (e.g. ``{min_terms: 2, max_terms: 2}`` for chain_sum); ``dataset_size``: problems generated;
    ``heldout_size``; ``seed``: generation and held-out selection; ``prompt_template`` (``{question}`` replaced);
    ``answer_format``: ``boxed`` or ``answer_line`` (what the reward extracts: say it in the template);
    ``chat`` / ``chat_tokenizer``: render with that tokenizer's chat template; ``privileged_solution``;
    ``max_response_chars``; ``verifier_*``: the pool (``VerifierPool``).
    """

    name = "reasoning_gym"

    def __init__(self, dataset: str = "", dataset_args: dict | None = None, dataset_size: int = 5000,
                 heldout_size: int = 200, seed: int = 1234, prompt_template: str = DEFAULT_TEMPLATE,
                 answer_format: str = "boxed", chat: bool = True, chat_tokenizer: str = "",
                 privileged_solution: bool = True, max_response_chars: int = 1024, verifier_workers: int = 2,
                 verifier_timeout_s: float = 3.0, verifier_batch_timeout_s: float = 60.0,
                 verifier_max_chars: int = 4096, verifier_memory_mb: int | None = 4096) -> None:
        check_settings(dataset, prompt_template, answer_format, dataset_size, heldout_size, chat, chat_tokenizer)
        self.dataset, self.dataset_args = dataset, dict(dataset_args or {})
        self.dataset_size, self.heldout_size, self.seed = dataset_size, heldout_size, seed
        self.prompt_template, self.answer_format = prompt_template, answer_format
        self.chat, self.chat_tokenizer = chat, chat_tokenizer
        self.privileged_solution, self.max_response_chars = privileged_solution, max_response_chars
        self._init_pool(verifier_workers, verifier_timeout_s, verifier_batch_timeout_s, verifier_max_chars,
                        verifier_memory_mb)
        self._render = _chat_renderer(chat_tokenizer) if chat else (lambda text: text)

        import reasoning_gym

        try:
            entries = list(reasoning_gym.create_dataset(dataset, size=dataset_size, seed=seed, **self.dataset_args))
        except Exception as e:  # noqa: BLE001 - a bad dataset_args key or value: one line
            first = (str(e).strip().splitlines() or [""])[0][:200]
            raise ReasoningGymError(f"task.dataset_args={self.dataset_args} for {dataset!r} failed: "
                                    f"{type(e).__name__}: {first}") from None
        unique: dict[str, Problem] = {}
        for i, entry in enumerate(entries):
            question, answer = str(entry["question"]).strip(), str(entry["answer"]).strip()
            if question and answer and question not in unique:
                unique[question] = self.make_problem(question, answer, entry.get("metadata") or {}, i)
        ordered = sorted(unique.values(),
                         key=lambda p: hashlib.sha1(f"{seed}:{p.meta['question']}".encode()).hexdigest())
        if len(ordered) <= heldout_size:
            raise ReasoningGymError(f"task.dataset={dataset!r} gave {len(ordered)} distinct questions out of "
                                    f"{dataset_size}, no more than task.heldout_size={heldout_size}; raise "
                                    "task.dataset_size or widen task.dataset_args")
        self._heldout = ordered[:heldout_size]
        self._heldout_questions = frozenset(p.meta["question"] for p in self._heldout)
        self._train = ordered[heldout_size:]
        self.duplicates = len(entries) - len(ordered)

    # ------------------------------------------------------------------ problems
    def make_problem(self, question: str, answer: str, metadata: dict, index: int | None = None) -> Problem:
        prompt = self._render(self.prompt_template.replace("{question}", question))
        pid = f"rg:{self.dataset}:{hashlib.sha1(question.encode()).hexdigest()[:12]}"
        solution = next((str(metadata[k]).strip() for k in _SOLUTION_KEYS if metadata.get(k) not in (None, "")),
                        None)
        privileged = f"Reference answer: {answer}"
        if solution and self.privileged_solution:
            privileged += f"\nReference solution:\n{solution}"
        return Problem(prompt_id=pid, prompt=prompt, answer=answer, privileged=privileged,
                       meta={"question": question, "solution": solution, "index": index})

    def sample(self, rng: random.Random, n: int) -> list[Problem]:
        """``n`` training problems drawn uniformly with replacement, never a held-out question."""
        return [self._train[rng.randrange(len(self._train))] for _ in range(n)]

    def heldout(self) -> list[Problem]:
        """The fixed evaluation set: the same in every process given the dataset, its args, size and seed."""
        return list(self._heldout)

    def is_heldout(self, problem: Problem) -> bool:
        return problem.meta["question"] in self._heldout_questions

    def train_size(self) -> int:
        return len(self._train)

    # ------------------------------------------------------------------ reward
    def parsable(self, text: str) -> bool:
        """Does the response end in a final answer of ``answer_format`` (whatever its value)?"""
        return extract_answer(text, self.answer_format) is not None

    def score_many(self, problems: list[Problem], texts: list[str], deadline_s: float | None = None) -> list[float]:
        """1.0 where the extracted final answer equals the reference (as a string, else by math-verify), else 0.0."""
        if len(problems) != len(texts):
            raise ValueError(f"{len(problems)} problems for {len(texts)} texts")
        scores = [0.0] * len(texts)
        todo = []
        for i, (p, text) in enumerate(zip(problems, texts)):
            final = extract_answer(text, self.answer_format)
            if final is None:
                continue
            if final.replace(" ", "") == p.answer.replace(" ", ""):
                scores[i] = 1.0
            else:
                todo.append((i, p.answer, "\\boxed{" + final + "}"))
        if todo:
            checked = self.verifier.score_many([g for _, g, _ in todo], [t for _, _, t in todo], deadline_s=deadline_s)
            for (i, _, _), s in zip(todo, checked):
                scores[i] = s
        return scores

    # ------------------------------------------------------------------ supervision and metadata
    def solution(self, problem: Problem) -> str:
        """Target response for supervised fine-tuning: the generator's steps (when it gives some beyond the bare
        expression) and the final answer in ``answer_format``."""
        sol = problem.meta.get("solution")
        if sol and "####" in sol:  # GSM8K-style rationale ending in '#### <answer>'
            sol = sol.rsplit("####", 1)[0].strip()
        final = f"\\boxed{{{problem.answer}}}" if self.answer_format == "boxed" else f"Answer: {problem.answer}"
        if sol and "\n" in sol:
            return f"{sol}\n{final}" if self.answer_format == "answer_line" else f"{sol}\nThe final answer is {final}."
        if sol:
            return f"{sol} = {problem.answer}\n" + (final if self.answer_format == "answer_line"
                                                    else f"The final answer is {final}.")
        return final

    def max_answer_chars(self) -> int:
        """A generation-budget hint (``max_response_chars``)."""
        return self.max_response_chars

    def describe(self) -> dict:
        return {
            "name": self.name,
            "dataset": self.dataset,
            "dataset_args": self.dataset_args,
            "dataset_size": self.dataset_size,
            "duplicates": self.duplicates,
            "heldout_size": len(self._heldout),
            "train_rows": len(self._train),
            "seed": self.seed,
            "answer_format": self.answer_format,
            "chat": self.chat,
            "privileged_solution": self.privileged_solution,
            "verifier": dict(self._pool_args),
            "prompt_example": self._heldout[0].prompt,
        }
