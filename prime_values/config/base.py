"""What every config section shares: the error type, the field rules (choices, ranges) and their generic check.

A field's rules live beside it as dataclass metadata: `choice(default, 'a', 'b')` for a closed set of names,
`ranged(default, '>= 1')` for a bound (several bounds are checked in order; a bound may carry the rest of its
message: `('< 1', ' (the ratio clip ...)')`), `free(default, why)` for a field without a generic rule (why: any
value is fine, or which section check decides).
`check_fields` walks a section and raises the one-line ConfigError of the first rule broken.
"""

from __future__ import annotations

import contextlib
import operator
from dataclasses import MISSING as NO_DEFAULT, field, fields, is_dataclass
from typing import Any

_OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}


class ConfigError(ValueError):
    """A user-caused configuration problem; the message is one sentence naming the key and the fix."""


@contextlib.contextmanager
def reported(*errors: type[Exception]):
    """Inside: an error of a type in `errors` (a library's own one-line message) becomes that ConfigError."""
    try:
        yield
    except errors as error:
        raise ConfigError(str(error)) from None


def choice(default: str, *choices: str) -> Any:
    """A string field whose value is one of `choices`."""
    assert default in choices or default is NO_DEFAULT, (default, choices)
    return field(default=default, metadata={"choices": choices})


def ranged(default: Any, *bounds: str | tuple[str, str]) -> Any:
    """A numeric field with bounds such as '>= 1', '> 0', '<= 1', or an interval 'in [0, 1]' / 'in (0, 1]' /
    'in [0, 1)'; a bound may be (bound, the rest of its message). null (None) passes every bound."""
    return field(default=default, metadata={"bounds": tuple(b if isinstance(b, tuple) else (b, "") for b in bounds)})


def free(default: Any, why: str) -> Any:
    """A field with no generic rule: any value is valid, or a section's check says which are (`why` says which;
    tests/config/test_config_rules.py requires it of every number without bounds and of every string that looks like a
    closed set without choices)."""
    return field(default=default, metadata={"free": why})


def _holds(bound: str, value) -> bool:
    if bound.startswith("in "):
        low, high = (float(x) for x in bound[4:-1].split(","))
        return (low <= value if bound[3] == "[" else low < value) and \
            (value <= high if bound[-1] == "]" else value < high)
    op, number = bound.split()
    return _OPS[op](value, float(number))


def field_problem(key: str, value, f) -> str | None:
    """The one-line message of the first rule of dataclass field `f` that `value` breaks, or None."""
    allowed = f.metadata.get("choices")
    if allowed is not None and value not in allowed:
        return f"{key}={value!r} is not allowed; choose one of {', '.join(allowed)}"
    if value is None or isinstance(value, bool):
        return None
    for bound, rest in f.metadata.get("bounds", ()):
        if not _holds(bound, value):
            return f"{key}={value} must be {bound}{rest}"
    return None


def check_fields(node, cls, prefix: str = "", sections: dict | None = None) -> None:
    """Every choice and bound of dataclass `cls` (and of the sections nested in it) on `node`, in field order;
    `sections` names the class of a section whose class the node chooses (the task's)."""
    for f in fields(cls):
        if f.metadata.get("derived"):  # resolved.*: derived from the other keys when the run is prepared
            continue
        value = node[f.name]
        default = f.default_factory() if f.default_factory is not NO_DEFAULT else f.default
        if is_dataclass(default):
            check_fields(value, (sections or {}).get(f.name, type(default)), f"{prefix}{f.name}.")
            continue
        problem = field_problem(f"{prefix}{f.name}", value, f)
        if problem:
            raise ConfigError(problem)
