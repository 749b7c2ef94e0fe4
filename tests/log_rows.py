"""Log rows for tests, from the stream schemas (`prime_values.log.records.SCHEMAS`): `row(kind, **fields)` fills
every field of the stream's schema with a default derived from its type and takes the caller's values for the
fields a test cares about, so a field added to a schema needs no fixture edit and a misspelt one fails here."""

from __future__ import annotations

import pyarrow as pa

from prime_values.log.records import SCHEMAS


def default(type_: pa.DataType):
    """The value a field of `type_` gets when the test does not name it: an empty list, "", False, 0 or 0.0."""
    if pa.types.is_list(type_):
        return []
    if pa.types.is_string(type_):
        return ""
    if pa.types.is_boolean(type_):
        return False
    if pa.types.is_integer(type_):
        return 0
    if pa.types.is_floating(type_):
        return 0.0
    raise TypeError(f"tests/log_rows.py has no default for a field of type {type_}: add one to `default`")


def row(kind: str, **fields) -> dict:
    """A row of stream `kind` ('rollouts', 'values', 'targets', 'batches'): `fields` as given, every other field
    of the schema at its type's `default`, in the schema's order."""
    schema = SCHEMAS[kind]
    unknown = sorted(set(fields) - set(schema.names))
    if unknown:
        raise KeyError(f"stream {kind!r} has no field {unknown[0]!r}; its schema (prime_values/log/records.py): "
                       f"{schema.names}")
    return {f.name: fields[f.name] if f.name in fields else default(f.type) for f in schema}


# a rollout of prompt tokens 5 6 and response 7 8 eos(2), and its values row: the roles' tests' common case
def rollout(rid: str, group: str, reward: float, prompt=(5, 6), response=(7, 8, 2), version=0, **fields) -> dict:
    return row("rollouts", rollout_id=rid, group_id=group, policy_version=version, reward=reward,
               token_ids=[*prompt, *response], policy_mask=[0] * len(prompt) + [1] * len(response),
               sampling_logprobs=[0.0] * len(prompt) + [-0.5] * len(response), privileged="42", **fields)


def values_row(rid: str, values: list[float], version: int = 3) -> dict:
    return row("values", rollout_id=rid, critic_version=version, values=values, valued_tokens=len(values))
