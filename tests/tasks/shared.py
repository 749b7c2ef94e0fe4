"""What the task tests share: a verifiers task's config, and the runs of a policy mask."""

from __future__ import annotations


def verifiers_cfg(group_size=4, max_new_tokens=6, **task):
    from prime_values.config import VerifiersTaskConfig, schema

    cfg = schema(VerifiersTaskConfig)
    cfg.inference.group_size, cfg.inference.max_new_tokens = group_size, max_new_tokens
    for key, value in task.items():
        cfg.task[key] = value
    return cfg


def mask_runs(mask):
    """(start, end) of each run of 1s."""
    out, start = [], None
    for i, m in enumerate(list(mask) + [0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out
