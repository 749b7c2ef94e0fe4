"""The filesystem rollout log: atomic Arrow IPC segments, tailing readers with cursors, retention.

Knows nothing of models (pyarrow, numpy and the standard library only). See docs/design.md §2.
"""

from .records import SCHEMA_VERSION, SCHEMAS, per_token, to_rows, to_table
from .retention import apply_retention
from .segments import CorruptSegment, LogReader, NewerSchemaVersion, Segment, SegmentWriter, load_cursor, read_segment

__all__ = ["SCHEMA_VERSION", "SCHEMAS", "to_table", "to_rows", "per_token", "SegmentWriter", "read_segment",
           "CorruptSegment", "NewerSchemaVersion", "LogReader", "Segment", "load_cursor", "apply_retention"]
