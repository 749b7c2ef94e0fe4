"""The product speaks of itself, not of how it was made: no tracked text file, and no tracked file's name, carries a
work-log trace (a numbered work unit, a ticket number, a phrase such as "since the last <unit>"). A measured
figure carries its date and commit instead (docs/changelog.md keeps the history).

The words are assembled from pieces below so that this file passes its own scan. Legitimate uses stay legal: an
HTTP or pytest session, `--stop-after 16:30`, SIGSTOP, "the early stop at 0.4", "issue" as a verb.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# the work-unit nouns, spelled in pieces (see the module docstring)
UNITS = ["sess" + "ion", "st" + "op", "iss" + "ue", "hel" + "per", "sub" + "agent"]
NOUN = "(?:" + "|".join(UNITS) + ")s?"
# a unit and its number: "<unit> 18", "<unit>-18's", "<unit> #8", "<unit>32" in a file name, "<unit> 0.4" (a
# reader cannot tell it from a work-log number: "the stop at 0.4" says what it is); not a time such as 16:30
NUMBERED = re.compile(r"(?<![A-Za-z])" + NOUN + r"[ _#-]{0,2}\d+(?!:\d)(?![A-Za-z])", re.I)
# the same nouns in phrases that only a work log uses
WHEN = ["this", "last", "previous", "next", "earlier", "later", "another", "other", "the " + "lead's"]
PHRASES = re.compile(
    # ("this issues": a verb)
    r"\b(?:" + "|".join(WHEN) + r")\s+(?:" + UNITS[0] + "s?|" + UNITS[1] + "|" + UNITS[2] + r")\b"
    r"|\b" + UNITS[3] + r"\s+" + UNITS[0] + r"s?\b"
    r"|\b" + UNITS[4] + r"s?\b"
    r"|\bwork" + r"trees?\b"
    r"|\bthe\s+" + UNITS[2] + r"(?:'s|\s+note)\b"
    r"|\bother\s+" + "age" + r"nts?\b",
    re.I)
# run data (rollouts, configs of recorded runs) is not prose
SKIP_DIRS = ("tests/data/",)


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p]


def text_of(path: Path) -> str | None:
    """The file's text, or None for a binary (a NUL byte or not UTF-8) or a missing file."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def traces(text: str) -> list[tuple[int, str]]:
    """(line number, the matched words) of every work-log trace in `text`."""
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in (*NUMBERED.finditer(line), *PHRASES.finditer(line)):
            found.append((n, m.group(0)))
    return found


def test_no_file_name_carries_a_work_log_trace():
    bad = [p for p in tracked() if NUMBERED.search(p) or PHRASES.search(p.replace("_", " "))]
    assert bad == [], f"file names with work-log words (name what the file holds, and its date): {bad}"


def test_no_tracked_text_carries_a_work_log_trace():
    bad = []
    for rel in tracked():
        if rel.startswith(SKIP_DIRS):
            continue
        text = text_of(REPO / rel)
        if text is None:
            continue
        bad += [f"{rel}:{n}: {words!r}" for n, words in traces(text)]
    assert bad == [], ("work-log words in the product (say the date and commit, or plain words):\n  "
                       + "\n  ".join(bad))


def test_the_scan_flags_traces_and_passes_legitimate_uses():
    s, t, i = UNITS[0], UNITS[1], UNITS[2]
    flagged = [f"defaults since {s} 18", f"the {s}-17 reading", f"({i} 8)", f"{t} 32", f"{s}s 15 and 16",
               f"equal_budget_{t}32.png", f"since the last {s}", f"in this {s}", f"the previous {t}",
               f"a {UNITS[3]} {s}", f"the {i}'s targets", f"a {UNITS[4]} ran it"]
    legal = ["--stop-after 16:30", "the early stop at 0.4", "SIGSTOP", "an HTTP session", "the stop file",
             "this issues one request", "stop_grace_s = 30", '@pytest.fixture(scope="session")',
             "once per test session", "stop.sh --purge", "the SFT stop at 0.5"]
    assert [x for x in flagged if not traces(x)] == []
    assert [x for x in legal if traces(x)] == []
