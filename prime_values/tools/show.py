"""`python -m prime_values.tools.show <run_dir> [--rollout ID | --worst | --best] [--html PATH]`: one rollout, token by
token, with the critic's value at every state and the advantage each token received.

Prints the rollout's prompt, privileged context, reward, stop reason, policy version, critic version and
batch step, then every response token with `v` = the critic's value V(prompt + response[:t]) of the state
*before* token t (what the evaluator wrote to `log/values`) and `a` = the advantage the orchestrator gave the
token (`log/batches`). On a terminal the tokens are coloured (one line by value, one by advantage); otherwise
(a pipe, a file) each token is written `tok[v=0.41 a=-0.12]`. The token that made the value drop the most
is named. A tool-calling episode (task=tools) lists its calls, one line per policy turn: the call as written and
what the environment returned (`call 2      calc(53*13) -> 689`). A rollout with pictures (task=vision) names each
image by its content hash and its file in the run's image store (`image       3f2a... log/images/3f/3f2a....png`),
and the HTML page shows it. An HTML page of the same rollout goes to
`<run_dir>/report/rollout_<id>.html` (or `--html PATH`).

Which rollout:
- `--rollout ID`: that rollout (`rollout_id` of the log, e.g. `w0-000003-0005`).
- `--worst` (the default): of the rollouts that reached a batch, the one with the most negative sum of
  advantages over its policy tokens (the one the policy was pushed away from hardest). In a run with no
  batch yet: the rollout with the biggest one-token value drop (the last token: reward minus its value).
- `--best`: the most positive advantage sum (no batch yet: the biggest one-token value rise).

Model output is untrusted: every decoded token and every string of the record is escaped for the terminal
(control characters are shown as `\\x1b`, `\\n`, ...) and for HTML (`html.escape`; the page carries no
script and a Content-Security-Policy that forbids any). Read-only apart from the HTML page.
Exit status 2 with a one-line message for a path without a rollout log or an unknown rollout id.
"""

from __future__ import annotations

import argparse
import base64
import html
import json
import os
import re
import sys
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prime_values.log.images import IMAGES_DIR, ImageError, ImageStore
from prime_values.log.segments import CorruptSegment, NewerSchemaVersion, list_seqs, read_segment, segment_name
from prime_values.weights import versions


class ShowError(Exception):
    """A user-caused problem; the message is one line naming the path and what to do."""


# --- reading the run ---------------------------------------------------------------------------------

def read_stream(run: Path, stream: str, columns: list[str] | None = None) -> pa.Table | None:
    """Every readable segment of `<run>/log/<stream>` as one table (None when the stream has no segment).

    Segments that vanish (retention) or fail verification are skipped: this is a viewer, `prime_values.tools.check`
    is the tool that reports them."""
    root = run / "log" / stream
    try:
        shards = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    except (FileNotFoundError, NotADirectoryError):
        return None
    tables = []
    for shard in shards:
        for seq in list_seqs(root / shard):
            try:
                table = read_segment(root / shard / segment_name(seq), stream)
            except NewerSchemaVersion:
                raise
            except (FileNotFoundError, CorruptSegment):
                continue
            tables.append(table.select(columns) if columns else table)
    if not tables:
        return None
    return pa.concat_tables([t.replace_schema_metadata(None) for t in tables])


def policy_token_sums(table: pa.Table, column: str, weights: np.ndarray | None = None) -> np.ndarray:
    """Per row: sum of `column` over the tokens where policy_mask is 1."""
    lists = table.column(column).combine_chunks()
    masks = table.column("policy_mask").combine_chunks()
    parents = pc.list_parent_indices(lists).to_numpy()
    values = pc.list_flatten(lists).to_numpy(zero_copy_only=False).astype(np.float64)
    mask = pc.list_flatten(masks).to_numpy(zero_copy_only=False) > 0
    return np.bincount(parents, weights=np.where(mask, values, 0.0), minlength=table.num_rows)


def value_steps(values: list[float], mask: list[int], valued: int, end: float | None = None) -> list[float | None]:
    """Per token: the change of value its own sampling caused, V(s_{t+1}) - V(s_t), over the policy tokens
    inside the critic's context; for the last of them the next "value" is `end`: the reward (the outcome) or,
    for a trace the critic's context cut, V(s_cut) (None: no step for the last token). Undiscounted, like the
    TD errors of GAE with gamma = 1."""
    idx = [j for j in range(min(len(values), len(mask), valued)) if mask[j]]
    out: list[float | None] = [None] * len(mask)
    for j, k in zip(idx, idx[1:]):
        out[j] = values[k] - values[j]
    if idx and end is not None:
        out[idx[-1]] = end - values[idx[-1]]
    return out


def pick_extreme(run: Path, worst: bool) -> str:
    """rollout_id of the --worst / --best rollout (see the module doc)."""
    batches = read_stream(run, "batches", ["rollout_id", "advantages", "policy_mask"])
    if batches is not None and batches.num_rows:
        sums = policy_token_sums(batches, "advantages")
        i = int(np.argmin(sums) if worst else np.argmax(sums))
        return batches.column("rollout_id")[i].as_py()
    values = read_stream(run, "values", ["rollout_id", "values", "valued_tokens", "cut", "bootstrap_value"])
    rollouts = read_stream(run, "rollouts", ["rollout_id", "policy_mask", "reward"])
    if values is None or rollouts is None:
        raise ShowError(f"{run} has no batch and no values yet, so there is no worst or best rollout; "
                        "pick one with --rollout ID")
    known = {rid: (mask, reward) for rid, mask, reward in
             zip(*(rollouts.column(c).to_pylist() for c in ("rollout_id", "policy_mask", "reward")))}
    best_id, best = None, None
    columns = ("rollout_id", "values", "valued_tokens", "cut", "bootstrap_value")
    for rid, vals, valued, cut, bootstrap in zip(*(values.column(c).to_pylist() for c in columns)):
        if rid not in known:
            continue
        mask, reward = known[rid]
        steps = [s for s in value_steps(vals, mask, valued, bootstrap if cut else reward) if s is not None]
        if steps:
            score = min(steps) if worst else -max(steps)
            if best is None or score < best:
                best_id, best = rid, score
    if best_id is None:
        raise ShowError(f"{run} has no batch and no scored rollout yet; pick one with --rollout ID")
    return best_id


@dataclass
class Shown:
    """One rollout with what the run knows about it."""

    rollout: dict
    values: dict | None  # the log/values record used (None: never scored)
    values_records: int  # how many values records the rollout has (the evaluator may re-score after a restart)
    batch: dict | None  # the log/batches row (None: never reached a batch)
    pieces: list[str]  # decoded text of every token of the trace
    critic_expected: bool  # does this run have a critic at all
    images: list[tuple[str, Path]] = field(default_factory=list)  # (content hash, file) of each of its images

    @property
    def response_start(self) -> int:
        mask = self.rollout["policy_mask"]
        return next((j for j, m in enumerate(mask) if m), len(mask))

    @property
    def token_values(self) -> list[float | None]:
        """V(s_t) per token, None where there is none (not a policy token, beyond the critic's context)."""
        mask, n = self.rollout["policy_mask"], len(self.rollout["token_ids"])
        if self.values is None:
            return [None] * n
        valued, vals = self.values["valued_tokens"], self.values["values"]
        return [vals[j] if mask[j] and j < valued and j < len(vals) else None for j in range(n)]

    @property
    def token_advantages(self) -> list[float | None]:
        mask, n = self.rollout["policy_mask"], len(self.rollout["token_ids"])
        if self.batch is None:
            return [None] * n
        adv = self.batch["advantages"]
        return [adv[j] if mask[j] and j < len(adv) else None for j in range(n)]

    @property
    def steps(self) -> list[float | None]:
        if self.values is None:
            return [None] * len(self.rollout["token_ids"])
        v = self.values
        end = v["bootstrap_value"] if v["cut"] else self.rollout["reward"]
        return value_steps(v["values"], self.rollout["policy_mask"], v["valued_tokens"], end)

    def biggest_drop(self) -> tuple[int, float] | None:
        """(token index, value change) of the token whose sampling lowered the value the most, if any did."""
        drops = [(s, j) for j, s in enumerate(self.steps) if s is not None and s < 0]
        return (min(drops)[1], min(drops)[0]) if drops else None


def load_tokenizer(run: Path):
    """The run's tokenizer: saved with every policy version (newest first), else built from config.yaml."""
    from transformers import AutoTokenizer

    root = run / "weights" / "policy"
    for v in reversed(versions(root)):
        try:
            return AutoTokenizer.from_pretrained(root / str(v))
        except Exception:  # noqa: BLE001 - a version that does not load: try the one before
            continue
    from omegaconf import OmegaConf

    try:
        model = OmegaConf.load(run / "config.yaml").policy.model
    except Exception:  # noqa: BLE001 - without a readable config, the embedded model's tokenizer
        model = "tiny"
    if model == "tiny":
        from prime_values.models.tokenizer import build_char_tokenizer

        return build_char_tokenizer()
    return AutoTokenizer.from_pretrained(model)


def token_pieces(tokenizer, ids: list[int], start: int) -> list[str]:
    """The text of every token, prompt tokens one by one and response tokens incrementally from `start`: a
    piece is the text a token adds to the decoded prefix, so leading spaces (SentencePiece) are kept and the
    bytes of one character split over several tokens (byte-level BPE) go to the token that completes it (the
    others get '')."""
    decode = lambda part: tokenizer.decode(part, skip_special_tokens=False,
                                           clean_up_tokenization_spaces=False)
    pieces = [decode([t]) for t in ids[:start]]
    prefix, read = max(0, start - 5), start
    for j in range(start, len(ids)):
        before = decode(ids[prefix:read])
        text = decode(ids[prefix:j + 1])
        if len(text) > len(before) and text.startswith(before) and not text.endswith("\ufffd"):
            pieces.append(text[len(before):])
            prefix, read = read, j + 1
        elif j - read >= 8:  # never resolves (an invalid byte sequence): show the token alone
            pieces.append(decode([ids[j]]))
            prefix, read = j + 1, j + 1
        else:
            pieces.append("")
    return pieces


def load(run: Path, rollout_id: str | None = None, worst: bool = True) -> Shown:
    run = Path(run)
    if not (run / "log" / "rollouts").is_dir():
        where = "does not exist" if not run.exists() else "has no log/rollouts"
        raise ShowError(f"{run} {where}; give the run directory a run printed (it holds config.yaml and log/)")
    if rollout_id is None:
        rollout_id = pick_extreme(run, worst)
    rollouts = read_stream(run, "rollouts")
    if rollouts is None:
        raise ShowError(f"{run}/log/rollouts holds no rollout yet; wait for inference to write one")
    ids = rollouts.column("rollout_id")
    found = pc.index(ids, rollout_id).as_py()
    if found < 0:
        examples = ", ".join(repr(x) for x in ids.slice(0, 2).to_pylist())
        raise ShowError(f"rollout {rollout_id!r} is not in {run}/log/rollouts ({rollouts.num_rows} rollouts, e.g. "
                        f"{examples}; retention may have deleted older segments)")
    rollout = rollouts.slice(found, 1).to_pylist()[0]
    batch = None
    batches = read_stream(run, "batches")
    if batches is not None:
        rows = batches.filter(pc.equal(batches.column("rollout_id"), rollout_id)).to_pylist()
        batch = rows[-1] if rows else None
    value_rows = []
    values = read_stream(run, "values")
    if values is not None:
        value_rows = values.filter(pc.equal(values.column("rollout_id"), rollout_id)).to_pylist()
    chosen = None
    if value_rows:  # the record whose critic version the batch used, else the newest
        matching = [r for r in value_rows if batch is not None and r["critic_version"] == batch["critic_version"]]
        chosen = max(matching or value_rows, key=lambda r: r["scored_at"])
    critic_expected = values is not None or (batch is not None and batch["critic_version"] >= 0)
    try:
        from prime_values.config import load_saved

        critic_expected = load_saved(run / "config.yaml").resolved.uses_critic
    except Exception:  # noqa: BLE001 - without a readable config, no expectation about the critic
        pass
    tokenizer = load_tokenizer(run)
    start = next((j for j, m in enumerate(rollout["policy_mask"]) if m), len(rollout["policy_mask"]))
    pieces = token_pieces(tokenizer, list(rollout["token_ids"]), start)
    store = ImageStore(run / "log" / IMAGES_DIR)
    images = [(digest, store.path(digest)) for digest in rollout.get("images") or ()]
    return Shown(rollout, chosen, len(value_rows), batch, pieces, critic_expected, images)


# --- rendering ---------------------------------------------------------------------------------------

_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\"}


def visible(text: str) -> str:
    """Text safe to print on a terminal: control and format characters (ESC, bidi overrides, ...) as escapes."""
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif unicodedata.category(ch)[0] == "C" or unicodedata.category(ch) in ("Zl", "Zp"):
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def value_range(shown: Shown) -> tuple[float, float]:
    vals = [v for v in shown.token_values if v is not None] + [shown.rollout["reward"]]
    return min(0.0, *vals), max(1.0, *vals)


def value_rgb(v: float, lo: float, hi: float) -> tuple[int, int, int]:
    """Red (low) -> yellow -> green (high)."""
    x = 0.5 if hi <= lo else min(1.0, max(0.0, (v - lo) / (hi - lo)))
    if x < 0.5:
        return 220, int(60 + 340 * x), 60
    return int(220 - 340 * (x - 0.5)), 230, 60


def advantage_rgb(a: float, scale: float) -> tuple[int, int, int]:
    """Red (negative) -> white (0) -> blue (positive)."""
    x = 0.0 if scale <= 0 else max(-1.0, min(1.0, a / scale))
    if x < 0:
        return 255, int(255 * (1 + x)), int(255 * (1 + x))
    return int(255 * (1 - x)), int(255 * (1 - 0.6 * x)), 255


def header_lines(shown: Shown) -> list[str]:
    r, v, b = shown.rollout, shown.values, shown.batch
    lines = [f"rollout {visible(r['rollout_id'])}  prompt {visible(r['prompt_id'])}  group {visible(r['group_id'])}  "
             f"shard {visible(r['shard'])}",
             f"reward {r['reward']:.3f}   stop {visible(r['stop_reason'])}   policy version {r['policy_version']}"]
    if v is not None:
        again = f" ({shown.values_records} records; this one)" if shown.values_records > 1 else ""
        cut = f", cut by the critic's context after {v['valued_tokens']} tokens" if v["cut"] else ""
        lines.append(f"values   critic version {v['critic_version']}{again}{cut}")
    elif shown.critic_expected:
        lines.append("values   none: the evaluator has not scored this rollout (or retention deleted its record)")
    else:
        lines.append("values   none: this run has no critic (its advantage estimator reads no values)")
    if b is not None:
        stale = (b["step"] - 1) - r["policy_version"]
        critic = f", critic version {b['critic_version']}" if b["critic_version"] >= 0 else ""
        lines.append(f"batch    step {b['step']} ({stale} step(s) off-policy{critic})")
    else:
        lines.append("batch    none: this rollout never reached a batch (no advantages): its group was not "
                     "complete yet, too off-policy, scored before the critic warm-up ended, or the run stopped")
    task = {}
    try:
        task = json.loads(r["task"]) if r["task"] else {}
    except ValueError:
        pass
    start = shown.response_start
    prompt = task.get("prompt") if isinstance(task.get("prompt"), str) else "".join(shown.pieces[:start])
    lines += [f"prompt      {visible(prompt)}",
              f"privileged  {visible(r['privileged'])}",
              f"response    {visible(''.join(shown.pieces[start:]))}"]
    if isinstance(task.get("answer"), str):
        lines.append(f"answer      {visible(task['answer'])}")
    for digest, path in shown.images:
        lines.append(f"image       {visible(digest)}  {visible(str(path))}"
                     + ("" if path.is_file() else "  (missing: the run directory lost it)"))
    return lines + call_lines(task.get("calls"))


def call_lines(calls) -> list[str]:
    """One line per tool call of a tool-calling episode (the `calls` of its `task` JSON, tasks/tools.py): the turn,
    the call as written and what the environment returned; nothing for a rollout without calls."""
    if not isinstance(calls, list):
        return []
    lines = []
    for call in calls[:64]:
        if not isinstance(call, dict):
            continue
        tool, args, result = (str(call.get(k, "")) for k in ("tool", "args", "result"))
        written = f"{tool}({args})" if tool else f"'{args}'"
        lines.append(f"call {str(call.get('turn', '?')):<6} {visible(written)} -> {visible(result)}")
    if len(calls) > 64:
        lines.append(f"call ...    {len(calls) - 64} more")
    return lines


def drop_line(shown: Shown) -> str:
    drop = shown.biggest_drop()
    if drop is None:
        return "largest value drop: none" + ("" if shown.values is not None else " (no values)")
    j, d = drop
    v = shown.values["values"]
    last = all(s is None for s in shown.steps[j + 1:])
    to = ("the cut's V(s_cut) " if shown.values["cut"] else "the reward ") if last else ""
    return (f"largest value drop: token {j - shown.response_start} {visible(shown.pieces[j])!r} took the value from "
            f"{v[j]:.3f} to {to}{v[j] + d:.3f} ({d:+.3f})")


def render_text(shown: Shown, color: bool) -> str:
    start, n = shown.response_start, len(shown.rollout["token_ids"])
    vals, advs = shown.token_values, shown.token_advantages
    lines = header_lines(shown)
    if not color:
        lines.append("tokens      token[v=value of the state before it a=its advantage]:")
        parts = [f"{visible(shown.pieces[j])}[v={_fmt(vals[j])} a={_fmt(advs[j], '+.2f')}]"
                 if shown.rollout["policy_mask"][j] else f"{visible(shown.pieces[j])}[env]" for j in range(start, n)]
        lines.append(" ".join(parts))
    else:
        lo, hi = value_range(shown)
        scale = max((abs(a) for a in advs if a is not None), default=0.0)

        def paint(j, rgb):
            piece = visible(shown.pieces[j]) or "\u00b7"
            if rgb is None:
                return f"\x1b[2m{piece}\x1b[0m"
            return f"\x1b[48;2;{rgb[0]};{rgb[1]};{rgb[2]}m\x1b[38;2;0;0;0m{piece}\x1b[0m"

        lines.append("by value    " + "".join(paint(j, None if vals[j] is None else value_rgb(vals[j], lo, hi))
                                               for j in range(start, n))
                     + f"   (red {lo:.2f} .. green {hi:.2f})")
        lines.append("by advant.  " + "".join(paint(j, None if advs[j] is None else advantage_rgb(advs[j], scale))
                                              for j in range(start, n))
                     + f"   (red -{scale:.2f} .. white 0 .. blue +{scale:.2f})")
        lines.append("values      " + " ".join(_fmt(vals[j]) for j in range(start, n)))
        lines.append("advantages  " + " ".join(_fmt(advs[j], "+.2f") for j in range(start, n)))
    lines.append(drop_line(shown))
    return "\n".join(lines)


_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:70em}
table.meta td{padding:2px 12px 2px 0;vertical-align:top} .mono{font-family:ui-monospace,monospace;white-space:pre-wrap}
.trace{font-family:ui-monospace,monospace;white-space:pre-wrap;line-height:1.9;border:1px solid #ccc;padding:8px}
.trace span{padding:2px 1px;border-right:1px solid #fff} .ctx{color:#888}
table.tok{border-collapse:collapse;font-family:ui-monospace,monospace} table.tok td,table.tok th{border:1px solid #ddd;
padding:2px 6px;text-align:right} table.tok td.t{text-align:left;white-space:pre}"""


def render_html(shown: Shown) -> str:
    e = lambda s: html.escape(str(s), quote=True)
    r, start, n = shown.rollout, shown.response_start, len(shown.rollout["token_ids"])
    vals, advs, steps = shown.token_values, shown.token_advantages, shown.steps
    lo, hi = value_range(shown)
    scale = max((abs(a) for a in advs if a is not None), default=0.0)

    def piece(j):
        return e(shown.pieces[j].replace("\n", "\u21b5\n")) or "\u00b7"

    def trace(colour):
        out = [f'<span class="ctx" title="prompt">{piece(j)}</span>' for j in range(start)]
        for j in range(start, n):
            tip = e(f"token {j - start}: v={_fmt(vals[j], '.4f')} a={_fmt(advs[j], '+.4f')} "
                    f"dv={_fmt(steps[j], '+.4f')}")
            rgb = colour(j)
            style = f' style="background:rgb{rgb}"' if rgb else ' class="ctx"'
            out.append(f'<span{style} title="{tip}">{piece(j)}</span>')
        return "".join(out)

    rows = "".join(
        f"<tr><td>{j - start}</td><td class=\"t\">{e(visible(shown.pieces[j]))}</td><td>{r['token_ids'][j]}</td>"
        f"<td>{_fmt(vals[j], '.4f')}</td><td>{_fmt(steps[j], '+.4f')}</td><td>{_fmt(advs[j], '+.4f')}</td></tr>"
        for j in range(start, n))
    meta = "".join(f"<tr><td>{e(k)}</td><td class=\"mono\">{e(v)}</td></tr>" for k, v in
                   (line.split(None, 1) if " " in line else (line, "") for line in header_lines(shown)))
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; img-src data:">
<title>rollout {e(r['rollout_id'])}</title><style>{_CSS}</style></head><body>
<h1>Rollout <span class="mono">{e(r['rollout_id'])}</span></h1>
<table class="meta">{meta}<tr><td>drop</td><td class="mono">{e(drop_line(shown))}</td></tr></table>
{image_tags(shown)}<h2>By the critic's value</h2>
<p>Each response token is coloured by V(prompt + response[:t]), the critic's value of the state <em>before</em> it
(red {lo:.2f} .. yellow .. green {hi:.2f}); hover for the value, its advantage and dv = how much the token itself moved
the value (for the last token: the reward minus its value). Grey: prompt, environment tokens, tokens beyond the
critic's context.</p>
<div class="trace">{trace(lambda j: None if vals[j] is None else value_rgb(vals[j], lo, hi))}</div>
<h2>By advantage</h2>
<p>Red negative .. white 0 .. blue positive (scale &plusmn;{scale:.3f}).</p>
<div class="trace">{trace(lambda j: None if advs[j] is None else advantage_rgb(advs[j], scale))}</div>
<h2>Tokens</h2>
<table class="tok"><tr><th>t</th><th>token</th><th>id</th><th>value</th><th>dv</th><th>advantage</th></tr>{rows}</table>
</body></html>
"""


def image_tags(shown: Shown) -> str:
    """The rollout's pictures inline (data: URLs, the only images the page's policy allows), each checked against
    its content hash first; a missing or damaged one is named instead."""
    tags = []
    for digest, path in shown.images:
        try:
            png = ImageStore(path.parent.parent).get(digest)
        except ImageError as error:
            tags.append(f'<p class="mono">{html.escape(str(error))}</p>')
            continue
        data = base64.b64encode(png).decode("ascii")
        tags.append(f'<p><img alt="image {html.escape(digest)}" src="data:image/png;base64,{data}" width="192" '
                    'style="image-rendering:pixelated;border:1px solid #ccc"></p>')
    return "\n".join(tags)


def html_path(run: Path, rollout_id: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", rollout_id)[:120].lstrip(".") or "rollout"
    return Path(run) / "report" / f"rollout_{safe}.html"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prime_values.tools.show", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    pick = parser.add_mutually_exclusive_group()
    pick.add_argument("--rollout", metavar="ID", help="the rollout_id to show")
    pick.add_argument("--worst", action="store_true", help="most negative advantage sum (the default)")
    pick.add_argument("--best", action="store_true", help="most positive advantage sum")
    parser.add_argument("--html", metavar="PATH", help="where to write the HTML page "
                        "(default <run_dir>/report/rollout_<id>.html)")
    parser.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                        help="ANSI colours: auto = when stdout is a terminal")
    args = parser.parse_args(argv)
    run = Path(args.run_dir)
    try:
        shown = load(run, args.rollout, worst=not args.best)
    except ShowError as error:
        print(f"prime_values.tools.show: {error}", file=sys.stderr)
        return 2
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    print(render_text(shown, color))
    path = Path(args.html) if args.html else html_path(run, shown.rollout["rollout_id"])
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render_html(shown), encoding="utf-8")
        print(f"html        {path}")
    except OSError as error:
        print(f"prime_values.tools.show: could not write {path} ({error.strerror}); choose another place with "
              "--html PATH", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
