"""Suite-wide pytest hooks."""

from __future__ import annotations


# ---------------------------------------------------------------------------------------------- marker tiers
# gpu and vllm tests need a machine (a CUDA device) or a venv (vLLM) this one may lack, and fail rather than skip
# there; `slow` ones run the pipeline's processes end to end. A `-m` on the command line replaces setup.cfg's, so
# `pytest -m "not slow"` (the fast tier) would select the gpu and vllm tests again: they are deselected here
# unless the -m expression names them (`pytest -m gpu`, `pytest -m vllm` still select them).
NEEDS_OPT_IN = ("gpu", "vllm")


def pytest_collection_modifyitems(config, items):
    expression = config.getoption("markexpr") or ""
    skipped = [m for m in NEEDS_OPT_IN if m not in expression]
    if not skipped:
        return
    kept, dropped = [], []
    for item in items:
        (dropped if any(item.get_closest_marker(m) for m in skipped) else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
