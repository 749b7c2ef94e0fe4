"""Suite-wide rules.

- Tests marked `gpu` or `vllm` need a machine or a venv CI does not have: they are deselected unless the -m
  expression names the marker (`pytest -m vllm`, `pytest -m gpu`, `-m "vllm or not vllm"`), so that other -m
  expressions (`pytest -m "not slow"`, the fast tier) keep them out the way a plain `pytest` does.
- One torch/OpenMP thread per process unless OMP_NUM_THREADS is set (tests/vllm/run.sh sets 2 for its engines):
  the suite's models are tiny, and beside other processes (CI runs the vLLM tests next to this suite) a 2-thread
  OpenMP team stalls at every barrier for a descheduled thread: the math test's 60-step SFT took 8-45 s with 2
  threads on a loaded 2-core machine and 2.6-2.8 s with 1. The variable reaches every job the tests start (jobs
  that run alone read it: prime_values.launch.solo_threads; roles use topology.threads_per_role).
- A test that runs the conductor's `quiet_libraries` in the pytest process (its filter on every root log handler,
  pytest's capture handlers included) would hide other loggers' INFO records from every later test of that
  worker (`caplog`): the filter is taken off after each test.
- Under CI=true a skipped test is a failure (the install or the machine is broken, and green would hide it); the
  reason is kept in the report. Expected failures are not skips: `xfail` stays (strict, setup.cfg).
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import sys
import textwrap
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before any test module imports torch

OPT_IN_MARKERS = ("gpu", "vllm")
CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def pytest_collection_modifyitems(config, items):
    expression = config.getoption("markexpr") or ""
    named = {m for m in OPT_IN_MARKERS if re.search(rf"\b{m}\b", expression)}
    keep, drop = [], []
    for item in items:
        needs = {m for m in OPT_IN_MARKERS if item.get_closest_marker(m)}
        (drop if needs - named else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


def _fail_skip(report, where: str) -> None:
    report.outcome = "failed"
    report.longrepr = (f"{where} skipped under CI=true, where every selected test must run "
                       f"(fix the install or the machine): {_skip_reason(report)}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if CI and report.skipped and not hasattr(report, "wasxfail"):
        _fail_skip(report, item.nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if CI and report.skipped:
        _fail_skip(report, collector.nodeid)


@pytest.fixture(autouse=True)
def _no_library_log_filter_left_behind():
    yield
    # at teardown pytest's capture handlers are on the root logger again: the ones a filter may have been added to
    for handler in logging.getLogger().handlers:
        for f in list(handler.filters):
            if type(f).__name__ == "_OursOrWarnings":  # prime_values.conductor.quiet_libraries
                handler.removeFilter(f)


@pytest.fixture
def outside_package(tmp_path, monkeypatch):
    """`install(name, source) -> root`: a package `name` outside the repository (its __init__.py is `source`) on this
    process's sys.path (a subprocess gets it with `root` on PYTHONPATH); forgotten by sys.modules after the test."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    installed = []

    def install(name: str, source: str) -> Path:
        (root / name).mkdir()
        (root / name / "__init__.py").write_text(textwrap.dedent(source))
        importlib.invalidate_caches()
        installed.append(name)
        return root

    yield install
    for name in installed:
        sys.modules.pop(name, None)


@pytest.fixture(scope="session")
def tokenizer():
    """The embedded model's character tokenizer (prime_values.models.tokenizer)."""
    from prime_values.models.tokenizer import build_char_tokenizer

    return build_char_tokenizer()


# one-digit sums and a longer warm start than test_pipeline's, so some rollouts are solved (reward 1) and the
# reward filter has something to keep; 3 steps leave rollouts that reached a batch and some that did not
SMALL_RUN = ("steps=3", "task.digits=1", "policy.warm_start.steps=60")


@pytest.fixture(scope="session")
def small_run(tmp_path_factory) -> Path:
    """A real run directory of a few steps, made once per test session (per xdist worker): what the rollouts
    dataset's doc and `tools.show` read."""
    from tests.e2e_helpers import run_pipeline

    run_dir = tmp_path_factory.getbasetemp() / "rollouts_dataset_run"
    if not (run_dir / "report" / "summary.json").exists():
        result = run_pipeline(run_dir, *SMALL_RUN)
        assert result.returncode == 0, result.stderr[-3000:]
    return run_dir
