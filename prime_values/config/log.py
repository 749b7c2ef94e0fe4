"""`log.*`: retention of the rollout log and of published weights, and the end-of-run plots."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from prime_values.config.base import ranged

_OR_NULL = (">= 0", ", or null to disable this retention rule")


@dataclass
class LogConfig:
    keep_segments: Optional[int] = ranged(None, _OR_NULL)
    """retention: keep at most this many segments per shard once every consumer has passed them (null = all)"""
    max_age_s: Optional[float] = ranged(None, _OR_NULL)
    """retention: delete passed segments older than this (null = never)"""
    durable_rename: bool = False
    """also fsync the log directory after publishing each segment, so it survives a power loss (slower appends;
    visibility is atomic either way)"""
    keep_weights: int = ranged(3, ">= 1")
    """published weight versions kept per model (version 0 is always kept)"""
    optimizer_state_every: int = ranged(1, ">= 0")
    """the trainers save their optimizer state inside every Nth published version (`optimizer.pt`), so a restarted
    trainer resumes its Adam moments; a restart from a version without one starts a fresh optimizer (0 = never)"""
    publish_in_background: bool = True
    """the policy trainer writes each version's files, then fsyncs them, renames them into place, commits its batch
    and prunes on a second thread while it computes the next step (weights.stage / Staged.finish): the fsyncs leave
    the step's critical path (~25-40 ms a step of the embedded run on 2 cores); at most one version is in flight
    and versions appear in order. false: all of it before the next step"""
    plots: bool = True
    """draw the report's PNG plots (report/*.png) at the end of a run; false writes report/summary.json and
    summary.md without them (~5 s less per run on 2 cores: many short runs, tests), and
    `python -m prime_values.tools.report <run>` draws them later"""
