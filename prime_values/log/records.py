"""Record schemas of the rollout log streams (docs/design.md §2, "Records").

Every segment of a stream holds rows of exactly one of these schemas. Names are part of the on-disk
format: add fields by bumping SCHEMA_VERSION, never rename silently. Per-token fields are flat lists
aligned to `token_ids` (prompt + response + environment turns).
"""

from __future__ import annotations

from operator import itemgetter

import numpy as np
import pyarrow as pa
import xxhash

SCHEMA_VERSION = 4  # 2: values carry valued_tokens and bootstrap_value; 3: values and targets carry token_digest;
# 4: rollouts, targets and batches carry images

_tokens = pa.list_(pa.int32())
_mask = pa.list_(pa.int8())
_floats = pa.list_(pa.float32())
_images = pa.list_(pa.string())  # the row's images by content hash, in their placeholders' order (log/images.py)

SCHEMAS: dict[str, pa.Schema] = {
    # inference -> evaluator, orchestrator, value trainer
    "rollouts": pa.schema([
        ("rollout_id", pa.string()),
        ("prompt_id", pa.string()),
        ("group_id", pa.string()),
        ("shard", pa.string()),
        ("policy_version", pa.int64()),
        ("token_ids", _tokens),
        ("policy_mask", _mask),  # 1 where the policy sampled the token
        ("sampling_logprobs", _floats),  # 0 where policy_mask is 0
        ("reward", pa.float32()),
        ("stop_reason", pa.string()),  # eos | length | env_done | error
        ("privileged", pa.string()),  # context only the critic may see
        ("task", pa.string()),  # JSON metadata
        ("created_at", pa.float64()),  # unix time
        ("images", _images),  # the prompt's images by content hash ([] for a text task)
    ]),
    # evaluator -> orchestrator
    "values": pa.schema([
        ("rollout_id", pa.string()),
        ("critic_version", pa.int64()),
        ("values", _floats),  # aligned to token_ids
        ("cut", pa.bool_()),  # the critic's context (critic.max_length) cut the trace; never a generation cap
        ("valued_tokens", pa.int32()),  # leading trace tokens inside the critic's context (all when not cut)
        ("bootstrap_value", pa.float32()),  # V(s_cut): the value of the state where the cut happened (0 if not cut)
        ("token_digest", pa.uint64()),  # token_digest(token_ids) of the rollout these values were computed on
        ("scored_at", pa.float64()),
    ]),
    # orchestrator -> value trainer
    "targets": pa.schema([
        ("rollout_id", pa.string()),
        ("group_id", pa.string()),
        ("policy_version", pa.int64()),
        ("critic_version", pa.int64()),
        ("token_ids", _tokens),
        ("policy_mask", _mask),
        ("privileged", pa.string()),
        ("reward", pa.float32()),
        ("values", _floats),  # critic prediction at scoring time
        ("value_targets", _floats),
        ("token_digest", pa.uint64()),  # the values row's token_digest: the rollout the values were computed on
        ("created_at", pa.float64()),
        ("images", _images),  # the rollout's images: the critic trains with them
    ]),
    # orchestrator -> policy trainer (one segment per step)
    "batches": pa.schema([
        ("step", pa.int64()),
        ("rollout_id", pa.string()),
        ("policy_version", pa.int64()),
        ("critic_version", pa.int64()),
        ("token_ids", _tokens),
        ("policy_mask", _mask),
        ("sampling_logprobs", _floats),
        ("advantages", _floats),
        ("reward", pa.float32()),
        ("images", _images),  # the rollout's images: the policy trainer recomputes its logprobs with them
    ]),
}

DEFAULTS: dict[str, dict] = {kind: {"images": []} for kind in ("rollouts", "targets", "batches")}
"""fields a writer may leave out, with the value they then get: a text rollout has no images"""


def token_digest(token_ids) -> int:
    """A rollout's identity by content: xxh3-64 of its token ids as little-endian int32 (a list or a numpy array).
    Values and targets rows carry it, so `prime_values.tools.check` verifies each pairs with its own rollout's tokens,
    not only with a rollout of the same id."""
    return xxhash.xxh3_64_intdigest(np.asarray(token_ids, dtype="<i4").tobytes())


def written_by(kind: str, version: int) -> pa.Schema | None:
    """The schema of `kind` that schema version `version` wrote, for the older versions this one still reads
    (`upgrade`); None for one it does not (its segments are quarantined as unsupported). Version 3 is version 4
    without the images."""
    if version == SCHEMA_VERSION:
        return SCHEMAS.get(kind)
    if version == 3 and kind in SCHEMAS:
        return pa.schema([field for field in SCHEMAS[kind] if field.name not in DEFAULTS.get(kind, {})])
    return None


def upgrade(kind: str, table: pa.Table) -> pa.Table:
    """A table of an older schema version (`written_by`) with the columns added since, at their `DEFAULTS`,
    in the current schema's order: a run written before them resumes and reads as before."""
    for name, value in DEFAULTS.get(kind, {}).items():
        if name not in table.column_names:
            field = SCHEMAS[kind].field(name)
            table = table.append_column(field, pa.array([value] * table.num_rows, type=field.type))
    return table.select(SCHEMAS[kind].names).replace_schema_metadata(table.schema.metadata)


def schema_for(kind: str) -> pa.Schema:
    if kind not in SCHEMAS:
        raise ValueError(f"unknown stream kind {kind!r}; expected one of {sorted(SCHEMAS)}")
    return SCHEMAS[kind]


def to_table(kind: str, rows: list[dict]) -> pa.Table:
    """Rows (dicts of Python values or numpy arrays) -> a table of the stream's schema.

    Keys are checked exactly so a typo or a forgotten field fails at the writer, not in a consumer
    hours later.
    """
    return pa.Table.from_batches([to_batch(kind, rows)])


def to_batch(kind: str, rows: list[dict]) -> pa.RecordBatch:
    """`to_table` as the one record batch a segment holds (what `SegmentWriter.append` writes)."""
    schema = schema_for(kind)
    names, getter = _KEYS[kind]
    defaults = DEFAULTS.get(kind)
    if defaults and rows and any(key not in rows[0] for key in defaults):
        rows = [{**defaults, **row} for row in rows]
    # one pass over the rows, transposed (schema.field(i).name per row costs 6x more). Every name found and
    # exactly len(names) keys in every row <=> keys == names, without comparing key sets row by row.
    try:
        values = list(zip(*map(getter, rows))) if rows else [()] * len(names)
    except KeyError:
        values = None
    if values is None or any(len(row) != len(names) for row in rows):
        _key_error(kind, rows)
    columns = [_column(v, t) for v, t in zip(values, _TYPES[kind])]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _key_error(kind: str, rows: list[dict]):
    names = _KEYS[kind][0]
    for i, row in enumerate(rows):
        if row.keys() != names:
            missing, extra = sorted(names - row.keys()), sorted(row.keys() - names)
            what = f"missing key {missing[0]!r}" if missing else f"unexpected key {extra[0]!r}"
            raise ValueError(f"{kind} record {i} has {what} (schema of stream {kind!r}: {SCHEMAS[kind].names})")
    raise ValueError(f"{kind} records do not match the schema of stream {kind!r}: {SCHEMAS[kind].names}")


_KEYS = {k: (set(s.names), itemgetter(*s.names)) for k, s in SCHEMAS.items()}
_TYPES = {k: list(s.types) for k, s in SCHEMAS.items()}
_NUMPY = {t: np.dtype(t.value_type.to_pandas_dtype()) for s in SCHEMAS.values() for t in s.types
          if pa.types.is_list(t)}


def _column(values: tuple, type_: pa.DataType) -> pa.Array:
    """One column. Per-token fields that arrive as 1-D numpy arrays (hf backend, evaluator) are concatenated
    once and wrapped with offsets: no per-element Python conversion (4-5x faster than pa.array on them)."""
    dtype = _NUMPY.get(type_)
    if dtype is not None and values and all(type(v) is np.ndarray for v in values):
        offsets = np.zeros(len(values) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, values), np.int64, len(values)), out=offsets[1:])
        try:
            flat = np.concatenate(values)
        except ValueError:  # 0-d or mixed-rank arrays: the generic path below gives the clear error
            flat = None
        if flat is not None and flat.ndim == 1 and offsets[-1] < 2**31:
            flat = np.ascontiguousarray(flat, dtype=dtype)
            child = pa.Array.from_buffers(type_.value_type, len(flat), [None, pa.py_buffer(flat)])
            return pa.Array.from_buffers(type_, len(values), [None, pa.py_buffer(offsets.astype(np.int32))],
                                         children=[child])
    return pa.array(values, type=type_)


def per_token(table: pa.Table, column: str) -> tuple[np.ndarray, np.ndarray]:
    """A per-token column as numpy (values, offsets): row i is values[offsets[i]:offsets[i + 1]]. Zero-copy for
    a segment's table (one record batch); a table of several chunks is combined first."""
    col = table.column(column)
    arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    return arr.values.to_numpy(zero_copy_only=False), arr.offsets.to_numpy()


def to_rows(table: pa.Table) -> list[dict]:
    """Table -> list of dicts of Python values (lists for per-token fields)."""
    return table.to_pylist()
