"""The config owns its rules (prime_values/config/): every field of every section has its docstring (the source
of docs/configuration.md), every number its bounds (or a reason it has none), and every string that names one
of a closed set its choices; each rule gives the one-line message the bad-config corpus expects."""

from __future__ import annotations

import re
import typing
from dataclasses import dataclass, fields, is_dataclass

import pytest
from omegaconf import OmegaConf

from prime_values.config import TASK_CONFIGS, Config, ConfigError, choice, field_docs, ranged, validate
from prime_values.config.base import check_fields, field_problem


def sections(cls=Config, prefix: str = ""):
    """(dotted prefix, class) of every section, each task's class included; the derived facts left out."""
    yield prefix, cls
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        if f.metadata.get("derived"):
            continue
        kind = hints[f.name]
        if f.name == "task" and cls is Config:
            for task in TASK_CONFIGS.values():
                yield from sections(task, "task.")
        elif is_dataclass(kind):
            yield from sections(kind, f"{prefix}{f.name}.")


def leaf_fields():
    for prefix, cls in sections():
        hints, docs = typing.get_type_hints(cls), field_docs(cls)
        for f in fields(cls):
            if not is_dataclass(hints[f.name]):
                yield f"{prefix}{f.name}", f, hints[f.name], docs.get(f.name, "")


def _base(kind):
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    return args[0] if typing.get_origin(kind) is typing.Union and len(args) == 1 else kind


def test_every_field_has_a_docstring():
    missing = sorted({key for key, _, _, doc in leaf_fields() if not doc})
    assert not missing, f"fields without a docstring (the string literal under the field): {missing}"


def test_every_number_has_bounds_or_a_reason_for_none():
    bare = sorted({key for key, f, kind, _ in leaf_fields() if _base(kind) in (int, float)
                   and "bounds" not in f.metadata and not f.metadata.get("free")})
    assert not bare, f"numeric fields with neither bounds (config.base.ranged) nor a reason (config.base.free): {bare}"


QUOTED = re.compile(r"'([a-z][a-z0-9_-]*)'")


def test_every_string_naming_one_of_a_closed_set_has_choices():
    """A string field whose docstring names its default among other quoted names ('a' ... 'b') lists them as
    choices, unless `free` says why any value is valid (a path, a template, an informational name)."""
    unlisted = []
    for key, f, kind, doc in leaf_fields():
        if _base(kind) is not str or "choices" in f.metadata or f.metadata.get("free"):
            continue
        named = set(QUOTED.findall(doc))
        if len(named) >= 2 and f.default in named:
            unlisted.append(key)
    assert not unlisted, f"string fields that look like a closed set but have no choices: {sorted(unlisted)}"


def test_the_defaults_keep_every_rule():
    for cls in TASK_CONFIGS.values():
        cfg = OmegaConf.structured(Config(task=cls()))
        check_fields(cfg, Config, sections={"task": cls})


@pytest.mark.parametrize("value, expected", [
    (0, None), (-1, "k=-1 must be >= 0"), (0.5, None), (1, "k=1 must be in [0, 1) (why)"), (None, None)])
def test_bounds_are_checked_in_order_with_their_message(value, expected):
    f = fields(_Probe)[0]
    assert field_problem("k", value, f) == expected


def test_choices_give_todays_message():
    f = fields(_Probe)[1]
    assert field_problem("m", "c", f) == "m='c' is not allowed; choose one of a, b"


def test_a_task_name_that_contradicts_the_group_is_refused():
    from prime_values.config import ArithTaskConfig

    cfg = OmegaConf.structured(Config(task=ArithTaskConfig()))
    cfg.task.name = "math"
    with pytest.raises(ConfigError, match="task.name=math does not match the task group's choice task=arith"):
        validate(cfg, cuda_count=0, environment=False)



@dataclass
class _Probe:
    k: typing.Optional[float] = ranged(0.0, ">= 0", ("in [0, 1)", " (why)"))
    m: str = choice("a", "a", "b")
