"""docs/configuration.md from the dataclass docstrings: `python -m prime_values.config > docs/configuration.md`
(tests/config/test_config.py checks it is current)."""

from __future__ import annotations

import ast
import inspect
import typing
from dataclasses import MISSING as NO_DEFAULT, fields, is_dataclass

from prime_values.config.root import Config
from prime_values.config.task import TASK_CONFIGS, TaskConfig


def field_docs(cls) -> dict[str, str]:
    """The string literal under each dataclass field, by field name (a field a subclass redefines without one
    keeps its base class's)."""
    docs: dict[str, str] = {}
    for klass in reversed([k for k in cls.__mro__ if is_dataclass(k)]):
        body = ast.parse(inspect.getsource(klass)).body[0].body
        for stmt, nxt in zip(body, body[1:]):
            if isinstance(stmt, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
                docs[stmt.target.id] = " ".join(str(nxt.value.value).split())
    return docs


def _default(f):
    return f.default_factory() if f.default_factory is not NO_DEFAULT else f.default


def markdown_reference(cls=Config, prefix: str = "", skip: frozenset = frozenset()) -> list[str]:
    """One table row per key of `cls` (sections after the keys; a section's rows from its annotated class, so
    `task.*` lists the keys every task has), leaving out the fields named in `skip`."""
    lines = []
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    nested = []
    for f in fields(cls):
        default = _default(f)
        if is_dataclass(default):
            nested.append((f.name, hints[f.name]))
            continue
        if f.name not in skip:
            lines.append(f"| `{prefix}{f.name}` | `{default!r}` | {docs.get(f.name, '')} |")
    for name, sub in nested:
        lines += markdown_reference(sub, f"{prefix}{name}.")
    return lines


DOC_HEADER = """# Configuration reference

Generated from the dataclass docstrings in `prime_values/config/` (one module per section) by
`python -m prime_values.config > docs/configuration.md` (a test checks it is current). Groups under `conf/`
choose presets; any key can be overridden on the command line, e.g.
`python -m prime_values +experiment=arith policy.lr=5e-4 topology=colocated`.

Validation lives in `prime_values/config/`: `config.validate` runs, before any job starts (and for each multirun
point), every key's bounds or choices, then `CHECKS` (`config/root.py`): each section's cross-field checks, the
task's own rules (the task's `check_settings`, or the task built outright), the embedded model's token budgets
(`prime_values/budget.py`) and the stages' rules (`config/stages.py`). The checks that need the code above the
config (a task built, a data set or GGUF file found, the SLURM layout, the token budgets) are hooks: declared in
`prime_values/config/` where they run, registered by the module that knows how (`config/checks.py`), all of them
imported by `prime_values.launch.checks`, which `python -m prime_values` and the conductor import (a hook run
before then imports the module it names); a launch validates each config once. A local model's token budgets need
its tokenizer: they are checked just before the first job. `config.prepare` makes the config a run saves
(interpolations and 'auto' devices resolved, `resolved.*` derived) for the conductor, the stages and the tests;
tools read a saved run with `config.load_saved`, which derives the `resolved.*` facts an older run lacks.

| key | default | meaning |
|---|---|---|"""

TASKS_HEADER = """
## Keys of each task

The `task` group chooses the task (`task=math`); besides the `task.*` keys above, each has its own (a key of
another task is an unknown key):"""


def configuration_doc() -> str:
    parts = [DOC_HEADER, *markdown_reference(), TASKS_HEADER]
    shared = frozenset(f.name for f in fields(TaskConfig))
    for name, cls in TASK_CONFIGS.items():
        parts += ["", f"### task={name}", "", " ".join(cls.__doc__.split()), "", "| key | default | meaning |",
                  "|---|---|---|", *markdown_reference(cls, "task.", skip=shared)]
    return "\n".join(parts) + "\n"
