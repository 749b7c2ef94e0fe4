"""tests/mutations.py breaks a promise of the code by replacing a text it expects to find once. When the code moves,
a mutation whose text is gone or found twice would silently stop running: every one must still apply."""
from __future__ import annotations

from tests import mutations


def test_every_mutation_still_applies_to_the_code(capsys):
    assert mutations.main(["--check"]) == 0, capsys.readouterr().out
    assert f"{len(mutations.MUTATIONS)} of {len(mutations.MUTATIONS)} mutations apply" in capsys.readouterr().out
