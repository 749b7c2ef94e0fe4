"""The conductor's live view of a run, read from the run directory alone.

On a terminal it is a few lines redrawn in place (ANSI cursor movement): the policy step and an ETA from the
recent step rate, reward and held-out accuracy, the critic version and its explained variance, the off-policy
lag, the replay buffer and ingest drops, then one line per role with its state and throughput. When stdout is
not a terminal (CI, a SLURM log file) it prints one plain line every ~10 s instead.

Sources (nothing here talks to a role):

- `metrics/<role>.jsonl`: policy_trainer (`step`, `reward_mean`, `heldout_accuracy`), orchestrator
  (`critic_explained_variance`, `off_policy_mean`/`off_policy_max`, `critic_version_lag_mean`,
  `waiting_rollouts`, `dropped_stale`), value_trainer (`critic_step`, `critic_version`, `replay_size`,
  `replay_capacity`, `ingest_dropped`, and in the colocated topology the scorer's `scored`/`states_per_s`/
  `score_s`), evaluator (`scored`, `states_per_s`, `score_s`), inference<w> (`rollouts`, `tokens_per_s`,
  `gen_s`), warm_start (`sft_step`, `critic_pretrain_step`);
- `state/<role>/heartbeat` (a role beats every ~2 s while it polls) and `state/<role>/done`; the heartbeat's
  second line is what the role is doing (roles.common.RoleContext.doing: 'waiting for batch 3', the warm start's
  'critic pretraining' with its step, rate, threads and slow steps, monitor.Pace), shown on its line;
- `jobs/<role>/` (the job was submitted) and `control/restarts.json` ({role job: restarts}, written by the conductor
  when it schedules a restart) and `control/STOP`.

Role states: `waiting` (not submitted yet: the warm start runs first), `starting` (submitted, no heartbeat yet:
imports, loading), `running` (with `quiet <n>s` when its heartbeat is older than a minute: a long step, or hung),
`restarting` (the conductor counted a restart the role has not heartbeat since), `done` (its done marker),
`stopping`/`stopped` (after the stop request). Throughputs are rates over each role's recent records (wall clock
between records, so waiting counts).

Slow steps: a role whose heartbeat reports a phase of equal steps (the warm start) gets a `slow:` line when a step
took monitor.SLOW_FACTOR times the median of the steps before it (for SLOW_SHOW_S after it), or when no step has
ended for that long (the step under way: its heartbeat says when the last one ended), and a line when it changed its
thread count (monitor.ThreadTuner).
"""

from __future__ import annotations

import io
import json
import shutil
import sys
import time
from collections import deque
from pathlib import Path

from prime_values.launch.topology import pipeline_roles
from prime_values.monitor import SLOW_FACTOR, SLOW_MIN_S, MetricsTail
from prime_values.rundir import RunDir

QUIET_S = 60.0  # a heartbeat older than this is shown ("quiet 75s"): a long step, or a hung role
STOPPED_S = 10.0  # after the stop request, a role whose heartbeat is this old has exited
PLAIN_EVERY_S = 10.0  # non-terminal output: one line this often
REDRAW_EVERY_S = 1.0  # terminal: at most one redraw this often
RATE_POINTS = 20  # rates and the ETA come from (at most) this many recent records of a role
MAX_WORKER_LINES = 4  # more inference workers than this are summarised on one line
SLOW_SHOW_S = 30.0  # a slow step (or a change of threads) is shown this long after it
BEAT_LAG_S = 2.5  # a heartbeat goes out at most every 2 s (roles.common.HEARTBEAT_EVERY_S): its news is this old
MACHINE_SHARED = "the machine may be shared"

CSI = "\x1b["


def _num(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _rate(value) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def pack(parts: list[str], width: int, indent: str = "  ") -> list[str]:
    """`parts` joined with " | " into lines of at most `width` characters (a part longer than that is cut)."""
    lines: list[str] = []
    for part in parts:
        if lines and len(lines[-1]) + 3 + len(part) <= width:
            lines[-1] += " | " + part
        else:
            lines.append(((indent if lines else "") + part)[:width])
    return lines


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def _secs(value: float) -> str:
    return f"{value:.1f}" if value >= 1 else f"{value:.2g}"


def activity_text(activity: dict, now: float) -> str:
    """A role's heartbeat activity in words: 'critic pretraining step 137/150, 0.45 steps/s, 2 threads',
    'generating rollouts for critic pretraining: 256/1024 rollouts, 41 rollouts/s', 'waiting for batch 3 for 12s'."""
    what = activity.get("doing") or ""
    if not what:
        return ""
    step, of, unit = activity.get("step"), activity.get("of"), activity.get("unit", "step")
    units = "steps" if unit == "step" else unit
    text = what
    if step is not None:
        count = f"{step}/{of}" if of else f"{step}"
        text += f" step {count}" if unit == "step" else f": {count} {unit}"
    elif of:
        text += f" ({of} {units})"
    since = activity.get("since")
    if since and what.startswith(("waiting", "loading", "starting")) and now - since >= 1:
        text += f" for {duration(now - since)}"
    if activity.get("rate"):
        text += f", {_rate(activity['rate'])} {units}/s"
    if activity.get("threads"):
        text += f", {activity['threads']} thread{'s' if activity['threads'] > 1 else ''}"
    if activity.get("note"):
        text += f", {activity['note']}"
    return text


def slow_text(activity: dict, now: float) -> list[str]:
    """The heartbeat's news of a slowdown: a step under way for SLOW_FACTOR times the phase's median (the heartbeat
    says when the last step ended), else its latest slow step (for SLOW_SHOW_S); and a change of the thread count
    (monitor.ThreadTuner). No step times in the heartbeat: nothing."""
    lines = []
    slow, median, last_at = activity.get("slow"), activity.get("median_s"), activity.get("last_at")
    step, of = activity.get("step"), activity.get("of")
    under_way = step is not None and (of is None or step < of) and median and last_at
    stalled = now - last_at if under_way else 0.0
    if under_way and stalled > max(SLOW_FACTOR * median, SLOW_MIN_S) + BEAT_LAG_S:
        unit = activity.get("unit", "step")
        nothing = f"step {step + 1} running for" if unit == "step" else f"no {unit} for"
        lines.append(f"slow: {activity.get('doing', '')} {nothing} {duration(stalled)}, median step "
                     f"{_secs(median)} s — {MACHINE_SHARED}")
    elif slow and now - slow.get("at", 0.0) <= SLOW_SHOW_S:
        lines.append(f"slow: {activity.get('doing', '')} step {slow['step']} took {_secs(slow['took_s'])} s, median "
                     f"{_secs(slow['median_s'])} s — {MACHINE_SHARED}")
    change = activity.get("threads_change")
    if change and now - change.get("at", 0.0) <= SLOW_SHOW_S:
        lines.append(f"threads: {change['text']}")
    return lines


class Rate:
    """A cumulative count sampled at record times; `per_s()` is its rate over the last RATE_POINTS samples."""

    def __init__(self):
        self.points: deque[tuple[float, float]] = deque(maxlen=RATE_POINTS)
        self.total = 0.0

    def add(self, t: float, amount: float) -> None:
        self.total += amount
        self.points.append((t, self.total))

    def set(self, t: float, cumulative: float) -> None:
        self.total = cumulative
        self.points.append((t, cumulative))

    def per_s(self) -> float | None:
        if len(self.points) < 2:
            return None
        (t0, c0), (t1, c1) = self.points[0], self.points[-1]
        return max(c1 - c0, 0.0) / (t1 - t0) if t1 > t0 else None


class _Watched:
    """sys.stdout/sys.stderr while the terminal view is up: notes that someone else printed (a restart message,
    a warning), so the next frame is drawn below that text instead of over it."""

    def __init__(self, stream, view: "LiveView"):
        self._stream, self._view = stream, view

    def write(self, text):
        if text:
            self._view._foreign = True
        return self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def expected_roles(run: RunDir) -> list[str]:
    """The role jobs of this run, from its config (or, without one, from what is in the run directory)."""
    try:
        from prime_values.config import load_saved
        from prime_values.config.critic import trains_critic

        cfg = load_saved(run.config)  # the role jobs the supervisor starts, from the run's resolved.uses_critic
        roles = pipeline_roles(cfg.topology, cfg.resolved.uses_critic, trains_critic(cfg))
        return ["warm_start", *(spec.name for spec in roles)]
    except Exception:  # noqa: BLE001 - without a readable config, the roles come from the run directory
        found = {p.stem for p in run.root.glob("metrics/*.jsonl")} | \
                {p.name for p in run.root.glob("state/*") if p.is_dir() and p.name != "cores"}  # launch/cores.py
        order = ["warm_start", "inference", "evaluator", "orchestrator", "policy_trainer", "value_trainer"]
        return sorted(found, key=lambda n: (next((i for i, o in enumerate(order) if n.startswith(o)), 99), n))


class LiveView:
    """The live view of one run. `show()` is called by the conductor on every poll; `line()` is the one-line
    headline (`python -m prime_values.tools.status` prints it); `lines()` is the whole view.

    `out` defaults to sys.stdout and `tty` to `out.isatty()`; tests pass a StringIO and a flag."""

    def __init__(self, run: RunDir, steps: int, out=None, tty: bool | None = None):
        self.run, self.steps, self.started = run, steps, time.time()
        self.roles = expected_roles(run)
        self.tails = {name: MetricsTail(run.metrics(name)) for name in self.roles}
        out = out if out is not None else sys.stdout
        self.out = out._stream if isinstance(out, _Watched) else out  # a view left watching by an earlier run
        self.tty = bool(tty if tty is not None else getattr(self.out, "isatty", lambda: False)())
        self.clock = time.time  # `prime_values.tools.status` pins it to the last metric of an ended run
        self.now = time.time  # heartbeat ages (real time, also for an ended run)
        self.rates: dict[str, Rate] = {}
        self.seen_restarts: dict[str, tuple[int, float]] = {}  # job -> (count, when the count was first seen)
        self._last_print = 0.0
        self._drawn = 0  # lines of the last terminal frame
        self._foreign = False
        self._watched = False
        self.width: int | None = None  # None: the terminal's

    # ---------------------------------------------------------------- reading
    def _rate(self, key: str) -> Rate:
        return self.rates.setdefault(key, Rate())

    def read(self) -> None:
        for name, tail in self.tails.items():
            for record in tail.read():
                self._count(name, record)

    def _count(self, name: str, r: dict) -> None:
        t = r.get("time", 0.0)
        if name.startswith("inference") and "rollouts" in r:
            self._rate(f"{name}.rollouts").add(t, r["rollouts"])
            self._rate(f"{name}.tokens").add(t, (r.get("tokens_per_s") or 0.0) * (r.get("gen_s") or 0.0))
        if name in ("evaluator", "value_trainer") and "scored" in r:  # value_trainer: the colocated scorer
            self._rate(f"{name}.states").add(t, (r.get("states_per_s") or 0.0) * (r.get("score_s") or 0.0))
        if name == "value_trainer" and "critic_step" in r:
            self._rate("value_trainer.steps").set(t, r["critic_step"])
        if name == "policy_trainer" and "reward_mean" in r:  # a training step (held-out evals also carry `step`)
            self._rate("policy_trainer.steps").set(t, r["step"])

    def last(self, name: str) -> dict:
        tail = self.tails.get(name)
        return tail.last if tail else {}

    def _restarts(self) -> dict[str, int]:
        """{role job: restarts}; remembers when each count changed (the file's modification time, compared
        with heartbeat files' modification times: one clock, the filesystem's, also on NFS)."""
        path = self.run.restarts_file
        try:
            counts, changed = json.loads(path.read_text()), path.stat().st_mtime
        except (OSError, ValueError):
            return {}
        for name, count in counts.items():
            if self.seen_restarts.get(name, (0, 0.0))[0] != count:
                self.seen_restarts[name] = (count, changed)
        return counts

    def _heartbeat(self, name: str) -> tuple[float, float, dict] | None:
        """(the time the role wrote into its heartbeat, the file's modification time, the activity on its second
        line: {} without one), None before the first."""
        path = self.run.heartbeat_file(name)
        try:
            mtime = path.stat().st_mtime
            text = path.read_text()
        except OSError:
            return None
        first, _, rest = text.partition("\n")
        try:
            beat = float(first.strip())
        except ValueError:
            beat = mtime
        try:
            activity = json.loads(rest) if rest.strip() else {}
        except ValueError:  # a heartbeat of other code
            activity = {}
        return beat, mtime, activity if isinstance(activity, dict) else {}

    def activity(self, name: str) -> dict:
        """What role `name` said it is doing in its newest heartbeat ({} before one, or without one)."""
        heartbeat = self._heartbeat(name)
        return heartbeat[2] if heartbeat else {}

    def role_state(self, name: str, restarts: dict[str, int], final: bool = False) -> str:
        if self.run.done_file(name).exists():
            return "done"
        heartbeat, now = self._heartbeat(name), self.now()
        beat, beat_mtime, _ = heartbeat or (None, None, None)
        if self.run.stop_requested() or final:
            if beat is None:
                return "not started"
            return "stopped" if final or now - beat > STOPPED_S else "stopping"
        if restarts.get(name) and (beat is None or beat_mtime < self.seen_restarts[name][1]):
            return "restarting"
        if beat is None:
            return "starting" if (self.run.jobs / name).is_dir() else "waiting"
        if now - beat > QUIET_S:
            return f"running (quiet {duration(now - beat)})"
        return "running"

    # ---------------------------------------------------------------- rendering
    def eta(self) -> tuple[float | None, float | None]:
        """(policy steps per second over the recent steps, seconds to the last step at that rate)."""
        rate = self._rate("policy_trainer.steps").per_s()
        step = self.last("policy_trainer").get("step", 0)
        if not rate:
            return rate, None
        return rate, max(self.steps - step, 0) / rate

    def _headline(self) -> tuple[str, dict[str, str]]:
        """(the step or warm-start text, {figure: text}) of the headline."""
        self.read()
        policy, orch, critic = (self.last(n) for n in ("policy_trainer", "orchestrator", "value_trainer"))
        warm = self.last("warm_start")
        elapsed = self.clock() - self.started
        if not policy:
            if self.run.done_file("warm_start").exists() and warm:
                return f"[{elapsed:6.0f}s] warm start done; waiting for policy step 1/{self.steps}", {}
            doing = self.activity("warm_start")
            if doing.get("doing"):  # fresher than its metrics: the step under way, the rate, the threads
                return f"[{elapsed:6.0f}s] warm start: {activity_text(doing, self.now())}", {}
            if "critic_pretrain_step" in warm:
                return (f"[{elapsed:6.0f}s] warm start: critic pretraining step {warm['critic_pretrain_step']} "
                        f"explained variance {_num(warm.get('train_explained_variance'))}"), {}
            if "sft_step" in warm:
                return (f"[{elapsed:6.0f}s] warm start: SFT step {warm['sft_step']} loss {_num(warm.get('loss'), 3)}"
                        f" validation acc {_num(warm.get('sft_val_accuracy'))}"), {}
            return f"[{elapsed:6.0f}s] starting", {}
        step = policy.get("step", 0)
        head = f"[{elapsed:6.0f}s] policy step {step}/{self.steps}"
        rate, eta = self.eta()
        if step < self.steps and eta is not None:
            head += f" ETA {duration(eta)}"
        parts = {"reward": f"reward {_num(policy.get('reward_mean'))}",
                 "heldout": f"held-out acc {_num(policy.get('heldout_accuracy'))}"}
        if rate:
            parts["rate"] = f"{_rate(rate)} steps/s"
        if "critic_version" in critic:
            parts["critic"] = f"critic v{critic['critic_version']} EV {_num(orch.get('critic_explained_variance'))}"
        if "off_policy_max" in orch:
            parts["off_policy"] = f"off-policy {_num(orch.get('off_policy_mean'), 1)}/{orch['off_policy_max']}"
        if "replay_size" in critic:
            parts["replay"] = f"replay {critic['replay_size']} dropped {critic.get('ingest_dropped', 0)}"
        return head, parts

    def line(self) -> str:
        """The headline: step, ETA, reward, held-out accuracy, critic version and EV, off-policy lag, replay."""
        head, parts = self._headline()
        return " | ".join([head] + [text for key, text in parts.items() if key != "rate"])

    def alerts(self, final: bool = False) -> list[str]:
        """'<role>: slow: ...' for each role whose heartbeat reports a slow step or a change of threads (slow_text);
        none in the final frame (what was slow is over)."""
        if final:
            return []
        now = self.now()
        return [f"{name}: {text}" for name in self.roles if not self.run.done_file(name).exists()
                for text in slow_text(self.activity(name), now)]

    def _doing(self, name: str, state: str) -> str:
        """What a role does, for its line: its heartbeat's activity while it runs; what a role not submitted yet
        waits for."""
        if state == "waiting" and name != "warm_start" and not self.run.done_file("warm_start").exists():
            return "for the warm start"
        if not state.startswith("running"):
            return ""
        return activity_text(self.activity(name), self.now())

    def _throughput(self, name: str) -> str:
        r = lambda key: self._rate(key).per_s()
        if name.startswith("inference"):
            return f"{_rate(r(name + '.rollouts'))} rollouts/s  {_rate(r(name + '.tokens'))} tokens/s"
        if name == "evaluator":
            return f"{_rate(r('evaluator.states'))} states/s"
        if name == "policy_trainer":
            return f"{_rate(r('policy_trainer.steps'))} steps/s"
        if name == "value_trainer":
            text = f"{_rate(r('value_trainer.steps'))} critic steps/s"
            if "value_trainer.states" in self.rates:  # colocated: it also scores
                text += f"  {_rate(r('value_trainer.states'))} states/s scored"
            return text
        if name == "orchestrator":
            orch = self.last("orchestrator")
            if "waiting_rollouts" in orch:
                return (f"{orch['waiting_rollouts']} rollouts waiting for values  "
                        f"{orch.get('dropped_stale', 0)} dropped stale")
        return ""

    def role_lines(self, final: bool = False) -> list[str]:
        restarts = self._restarts()
        lines = []
        workers = [n for n in self.roles if n.startswith("inference")]
        for name in self.roles:
            if name.startswith("inference") and len(workers) > MAX_WORKER_LINES:
                if name != workers[0]:
                    continue
                states = [self.role_state(w, restarts, final).split(" (")[0] for w in workers]
                summary = ", ".join(f"{states.count(s)} {s}" for s in dict.fromkeys(states))
                rollouts = sum(self._rate(f"{w}.rollouts").per_s() or 0.0 for w in workers)
                tokens = sum(self._rate(f"{w}.tokens").per_s() or 0.0 for w in workers)
                lines.append(f"  {'inference x' + str(len(workers)):<16}{summary:<23} "
                             f"{_rate(rollouts)} rollouts/s  {_rate(tokens)} tokens/s")
                continue
            state = self.role_state(name, restarts, final)
            rates = self._throughput(name) if state not in ("waiting", "starting", "not started") else ""
            doing = self._doing(name, state)
            if restarts.get(name):
                state += f" [{restarts[name]} restart{'s' if restarts[name] > 1 else ''}]"
            text = "  ".join(part for part in (doing, rates) if part)
            lines.append(f"  {name:<16}{state:<23} {text}".rstrip())
        return lines

    def lines(self, final: bool = False) -> list[str]:
        """The whole view: the headline, a line of critic, off-policy and replay figures, one line per role."""
        head, parts = self._headline()
        orch, critic = self.last("orchestrator"), self.last("value_trainer")
        width = self.columns()
        top = pack([head] + [parts[k] for k in ("reward", "heldout", "rate") if k in parts], width)
        second = []
        if "critic_version" in critic:
            second.append(f"critic v{critic['critic_version']} (step {critic.get('critic_step', 0)}) "
                          f"EV {_num(orch.get('critic_explained_variance'))}")
            if "critic_version_lag_mean" in orch:
                second.append(f"values {_num(orch['critic_version_lag_mean'], 1)} versions behind")
        if "off_policy_max" in orch:
            second.append(f"off-policy {_num(orch.get('off_policy_mean'), 1)}/{orch['off_policy_max']} (mean/max)")
        if "replay_size" in critic:
            capacity = f"/{critic['replay_capacity']}" if "replay_capacity" in critic else ""
            second.append(f"replay {critic['replay_size']}{capacity} rollouts, ingest dropped "
                          f"{critic.get('ingest_dropped', 0)}")
        figures = pack(second, width - 2) if parts else []
        alerts = [f"  ! {text}"[:width] for text in self.alerts(final)]
        return top + ["  " + text for text in figures] + alerts + [text[:width] for text in self.role_lines(final)]

    def columns(self) -> int:
        """The terminal's width less one: a line that wraps would break the cursor movement."""
        return self.width or max(shutil.get_terminal_size((120, 24)).columns - 1, 40)

    def plain(self, final: bool = False) -> str:
        """One line for a log file: the headline, then the roles that are not simply running and the rates."""
        text = self.line()
        restarts = self._restarts()
        odd = [f"{n} {s}" for n in self.roles
               if (s := self.role_state(n, restarts, final)) not in ("running", "done", "waiting")]
        rates = []
        r = lambda key: self._rate(key).per_s()
        workers = [n for n in self.roles if n.startswith("inference")]
        if any(r(f"{w}.rollouts") for w in workers):
            rates.append(f"{_rate(sum(r(f'{w}.rollouts') or 0 for w in workers))} rollouts/s "
                         f"{_rate(sum(r(f'{w}.tokens') or 0 for w in workers))} tok/s")
        states = r("evaluator.states") or r("value_trainer.states")
        if states:
            rates.append(f"{_rate(states)} states/s")
        if r("value_trainer.steps"):
            rates.append(f"{_rate(r('value_trainer.steps'))} critic steps/s")
        doing = []  # until the first policy step: what each role that came up is waiting for or loading
        if not self.last("policy_trainer") and not final:
            now = self.now()
            doing = [f"{n}: {activity_text(a, now)}" for n in self.roles if n != "warm_start"
                     and (a := self.activity(n)).get("doing") and not self.run.done_file(n).exists()]
        return " | ".join([text] + ([", ".join(rates)] if rates else []) + ([", ".join(odd)] if odd else [])
                          + doing + self.alerts(final))

    def show(self, final: bool = False) -> None:
        now = time.time()
        if not self.tty:
            if final or now - self._last_print >= PLAIN_EVERY_S:
                print(self.plain(final), file=self.out, flush=True)
                self._last_print = now
            return
        if not final and now - self._last_print < REDRAW_EVERY_S:
            return
        self._last_print = now
        frame = self.lines(final)
        up = f"{CSI}{self._drawn}F" if self._drawn and not self._foreign else ""
        self.out.write(up + "".join(f"{CSI}2K{text}\n" for text in frame) + f"{CSI}J")
        self.out.flush()
        self._drawn, self._foreign = len(frame), False
        if final:
            self._unwatch()
            self._drawn = 0
        elif self.out is sys.stdout or self.out is getattr(sys.stdout, "_stream", None):
            self._watch()

    def _watch(self) -> None:
        if self._watched:
            return
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            setattr(sys, name, _Watched(stream._stream if isinstance(stream, _Watched) else stream, self))
        self._watched = True

    def _unwatch(self) -> None:
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if isinstance(stream, _Watched) and stream._view is self:
                setattr(sys, name, stream._stream)
        self._watched = False


def render(run_dir: str | Path, steps: int | None = None, tty: bool = False, final: bool = False) -> str:
    """The view of a run directory as text (tests, `prime_values.tools.status`)."""
    run = RunDir(run_dir)
    if steps is None:
        from omegaconf import OmegaConf

        steps = OmegaConf.load(run.config).steps
    out = io.StringIO()
    view = LiveView(run, steps, out=out, tty=tty)
    view.show(final=final)
    return out.getvalue()
