"""bench/common.py: `--stop-after HH:MM` is the next time the clock shows it, so a deadline past midnight is not
taken for one already past."""
from __future__ import annotations

import argparse
from datetime import datetime, timezone

import pytest

from bench.common import StopAfter, add_stop_after


def at(hour: int, minute: int, day: int = 6) -> datetime:
    return datetime(2026, 12, day, hour, minute, tzinfo=timezone.utc)


def test_a_time_later_today_is_today_and_one_earlier_is_tomorrow():
    later = StopAfter("23:30", now=at(23, 10))
    assert later.at == at(23, 30) and not later.passed(at(23, 29)) and later.passed(at(23, 30))
    past_midnight = StopAfter("01:00", now=at(23, 10))  # two hours on, not 22 hours ago
    assert past_midnight.at == at(1, 0, day=7)
    assert not past_midnight.passed(at(23, 11)) and not past_midnight.passed(at(0, 59, day=7))
    assert past_midnight.passed(at(1, 0, day=7))
    assert StopAfter("23:10", now=at(23, 10)).at == at(23, 10, day=7)  # the very minute: a day on, never at once
    assert str(past_midnight) == "01:00"


@pytest.mark.parametrize("text", ["1", "25:00", "12:60", "12:5", "noon", "-1:00", ""])
def test_a_malformed_time_is_a_one_line_argument_error(text, capsys):
    parser = argparse.ArgumentParser()
    add_stop_after(parser)
    with pytest.raises(SystemExit):
        parser.parse_args([f"--stop-after={text}"])
    err = capsys.readouterr().err
    assert "--stop-after" in err and "HH:MM" in err
