"""Fixtures shared by the launch tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture
def importable_tests(monkeypatch):
    """Jobs that run a test module's own functions unpickle them by name (`tests.launch.test_...`): the repository
    root on their PYTHONPATH lets their processes import the module."""
    root = Path(__file__).resolve().parents[2]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
