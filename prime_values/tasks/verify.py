"""Sandboxed answer checking with ``math-verify``: a pool of worker processes with hard time limits.

Model output is untrusted. ``math_verify.parse``/``verify`` can run for minutes (power towers such as
``9**9**9**9``, deeply nested braces) or blow the C stack, and their own timeouts are ``signal.alarm``-based:
whole seconds only (a fractional value silently returns "wrong"), unusable off the main thread, and a timeout
logs the whole input. So the library's timeouts are switched off and this module enforces its own:

- every check runs in a worker *process*: a fresh interpreter (``python -c``; no ``multiprocessing`` start
  method, so callers need no ``__main__`` guard and nothing is forked from a process holding threads or CUDA)
  that imports ``math_verify`` once and serves checks over a socket;
- **soft limit** (``call_timeout_s``, fractions fine): the worker arms ``setitimer`` around each check on its
  own main thread; an overrun raises out of the check (a ``BaseException``, so the library cannot swallow it),
  scores 0.0 and counts as a timeout — the worker survives;
- **hard limit** (``call_timeout_s + kill_grace_s``, enforced by the parent): a check stuck in C code where no
  signal handler can run (a giant integer power) gets its worker SIGKILLed and replaced; 0.0, counted;
- a worker that dies (segfault, C stack overflow, out of memory) or a check that raises scores 0.0, counted;
- ``score_many`` has a total deadline: whatever is unfinished when it passes scores 0.0 (``deadline``) and busy
  workers are killed, so a batch never stalls the caller much longer than its deadline;
- inputs are cut to their last ``max_chars`` characters before they leave the caller (answers come last);
- workers are quiet (loggers off; stdout/stderr to /dev/null: math-verify logs the whole input on timeout),
  run under an address-space limit, and die with their parent (``PR_SET_PDEATHSIG``, and EOF on the socket).

Gold answers are trusted reference strings: a worker parses ``$<gold>$`` (falling back to ``\\boxed{<gold>}``),
caches the parse, then parses the response and calls ``verify(gold, answer)`` — gold first, the library is not
symmetric. No regexes on the final answer and no ``eval`` anywhere.
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import logging
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
import weakref
from functools import lru_cache
from multiprocessing.connection import Connection, wait as mp_wait
from pathlib import Path

log = logging.getLogger(__name__)

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the directory holding prime_values/
_WORKER_CODE = "from prime_values.tasks.verify import _worker_entry; _worker_entry()"


# ---------------------------------------------------------------------------------------------- worker side
class _SoftTimeout(BaseException):
    """Raised by the worker's own interval timer; a BaseException so ``except Exception`` cannot swallow it."""


def _on_alarm(signum, frame):
    raise _SoftTimeout()


def _quiet_worker() -> None:
    for name in ("math_verify", "math_verify.parser", "math_verify.grader", "math_verify.utils",
                 "latex2sympy2_extended", "latex2sympy2_extended.latex2sympy2"):
        lg = logging.getLogger(name)
        lg.disabled = True
        lg.propagate = False
    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort: a platform without prctl runs without it
        pass


def _limit_memory(memory_mb: int | None) -> None:
    if not memory_mb:
        return
    try:
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except Exception:  # noqa: BLE001 - best effort: a platform without RLIMIT_AS runs without it
        pass


def _make_checker():
    """Return ``check(gold, text) -> (correct, gold_parsed)`` with the library's own timeouts off."""

    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    targets = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]

    @lru_cache(maxsize=8192)
    def parse_gold(gold: str):
        parsed = parse(f"${gold}$", extraction_config=targets, parsing_timeout=None)
        if not parsed:
            parsed = parse("\\boxed{" + gold + "}", extraction_config=targets, parsing_timeout=None)
        return parsed

    def check(gold: str, text: str) -> tuple[bool, bool]:
        g = parse_gold(gold)
        if not g:
            return False, False
        a = parse(text, extraction_config=targets, parsing_timeout=None)
        if not a:
            return False, True
        return bool(verify(g, a, timeout_seconds=None)), True

    return check


def _serve(conn, check, soft_timeout_s: float) -> None:
    signal.signal(signal.SIGALRM, _on_alarm)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        idx, gold, text = msg
        try:
            try:
                signal.setitimer(signal.ITIMER_REAL, soft_timeout_s)
                ok, gold_ok = check(gold, text)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            reply = (idx, 1.0 if ok else 0.0, "ok" if gold_ok else "gold_unparsed")
        except _SoftTimeout:
            reply = (idx, 0.0, "timeout")
        except (Exception, RecursionError, MemoryError):  # noqa: BLE001 - whatever the untrusted answer raises scores 0
            reply = (idx, 0.0, "error")
        try:
            conn.send(reply)
        except (EOFError, OSError):
            return


def _worker_entry() -> None:
    """``python -c`` entry point of a worker: argv = fd, quiet, memory_mb, soft_timeout_s."""
    fd, quiet, memory_mb, soft = int(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3]) or None, float(sys.argv[4])
    _die_with_parent()
    conn = Connection(fd)
    if quiet:
        _quiet_worker()
    try:
        check = _make_checker()
        check("1", "1")  # warm the library's lazy regex / grammar caches before declaring ready
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises
        try:
            conn.send(("fatal", f"{type(e).__name__}: {e}"))
        except Exception:  # noqa: BLE001 - the parent may be gone already
            pass
        return
    _limit_memory(memory_mb)
    conn.send(("ready", os.getpid()))
    _serve(conn, check, soft)


# ---------------------------------------------------------------------------------------------- parent side
class VerifierError(RuntimeError):
    """The verifier itself cannot work (math-verify missing, workers cannot start) — not a wrong answer."""


class _Worker:
    __slots__ = ("proc", "conn", "ready", "started_at", "job", "job_started")

    def __init__(self, quiet: bool, memory_mb: int | None, soft_timeout_s: float) -> None:
        parent, child = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        env.setdefault("OMP_NUM_THREADS", "1")
        sink = subprocess.DEVNULL if quiet else None
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _WORKER_CODE, str(child.fileno()), "1" if quiet else "0",
                 str(memory_mb or 0), repr(float(soft_timeout_s))],
                pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, stdout=sink, stderr=sink, env=env,
                close_fds=True)
        finally:
            child.close()
        self.conn = Connection(parent.detach())
        self.ready = False
        self.started_at = time.monotonic()
        self.job: int | None = None
        self.job_started = 0.0

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        try:
            self.proc.kill()
        except Exception:  # noqa: BLE001 - best effort: the worker may be gone already
            pass
        try:
            self.proc.wait(timeout=2.0)
        except Exception:  # noqa: BLE001 - best effort: the worker may be gone already
            pass
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001 - best effort: the pipe may be closed already
            pass


_LIVE_POOLS: "weakref.WeakSet[VerifierPool]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for pool in list(_LIVE_POOLS):
        pool.close()


class VerifierPool:
    """Score ``(gold, response)`` pairs with math-verify in ``workers`` sandboxed processes.

    ``call_timeout_s``: per-check limit (fractional allowed), enforced in the worker; a check still running
    ``kill_grace_s`` later gets its worker killed and replaced.
    ``batch_timeout_s``: default total deadline of one ``score_many`` call.
    ``max_chars``: responses are cut to their last ``max_chars`` characters before checking.
    ``memory_mb``: address-space limit of each worker (None/0: unlimited).
    ``startup_timeout_s``: a worker not ready by then is replaced (counted as a failed start).

    Thread-safe (one batch at a time). ``stats`` counts, cumulatively: ``calls``, ``correct``, ``timeouts``
    (soft or hard), ``killed`` (hard: the worker was killed), ``crashes`` (a worker died mid-check), ``errors``
    (the check raised), ``deadline`` (unfinished at a batch deadline), ``gold_unparsed`` (the reference itself
    did not parse: a data problem), ``truncated`` (inputs over ``max_chars``), ``restarts`` (workers replaced)
    and ``failed_starts``.
    """

    def __init__(self, workers: int = 2, call_timeout_s: float = 3.0, batch_timeout_s: float = 60.0,
                 max_chars: int = 4096, memory_mb: int | None = 4096, quiet: bool = True,
                 kill_grace_s: float = 1.0, startup_timeout_s: float = 60.0) -> None:
        if workers < 1:
            raise ValueError("workers must be >= 1")
        if call_timeout_s <= 0 or batch_timeout_s <= 0 or kill_grace_s < 0:
            raise ValueError("call_timeout_s and batch_timeout_s must be > 0, kill_grace_s >= 0")
        if max_chars < 1:
            raise ValueError("max_chars must be >= 1")
        self.n_workers, self.call_timeout_s, self.batch_timeout_s = workers, call_timeout_s, batch_timeout_s
        self.max_chars, self.memory_mb, self.quiet = max_chars, memory_mb, quiet
        self.kill_grace_s, self.startup_timeout_s = kill_grace_s, startup_timeout_s
        self._workers: list[_Worker] = []
        self._lock = threading.RLock()
        self._closed = False
        self._fatal_starts = 0
        self.stats: collections.Counter = collections.Counter()
        _LIVE_POOLS.add(self)

    # -------------------------------------------------------------------------------------- lifecycle
    def _spawn(self) -> _Worker:
        w = _Worker(self.quiet, self.memory_mb, self.call_timeout_s)
        self._workers.append(w)
        return w

    def _replace(self, w: _Worker, counter: str | None = "restarts") -> None:
        w.kill()
        if w in self._workers:
            self._workers.remove(w)
        if counter:
            self.stats[counter] += 1
        if not self._closed:
            self._spawn()

    def start(self) -> "VerifierPool":
        """Start the workers now (otherwise the first ``score_many`` does); returns at once."""
        with self._lock:
            if self._closed:
                raise VerifierError("verifier pool is closed")
            while len(self._workers) < self.n_workers:
                self._spawn()
        return self

    def wait_ready(self, timeout_s: float | None = None) -> "VerifierPool":
        """Block until every worker is ready (or raise ``VerifierError``)."""
        limit = self.startup_timeout_s if timeout_s is None else timeout_s
        with self._lock:
            self.start()
            end = time.monotonic() + limit
            while not all(w.ready for w in self._workers):
                left = end - time.monotonic()
                if left <= 0:
                    raise VerifierError(f"math-verify workers not ready after {limit}s")
                self._poll(min(left, 0.5), results=None)
        return self

    def close(self) -> None:
        """Stop the workers (idle ones exit on a message, busy ones are killed). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for w in self._workers:
                try:
                    if w.job is None and w.ready:
                        w.conn.send(None)
                except Exception:  # noqa: BLE001 - best effort at shutdown: the worker may be gone
                    pass
            for w in self._workers:
                try:
                    w.proc.wait(timeout=0.5)
                except Exception:  # noqa: BLE001 - best effort at shutdown: the worker may be gone
                    pass
                w.kill()
            self._workers.clear()

    def __enter__(self) -> "VerifierPool":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:  # best effort; atexit covers interpreter shutdown
        try:
            self.close()
        except Exception:  # noqa: BLE001 - a destructor must not raise
            pass

    # -------------------------------------------------------------------------------------- scoring
    def score(self, gold: str, text: str, timeout_s: float | None = None) -> float:
        return self.score_many([gold], [text], deadline_s=timeout_s)[0]

    def score_many(self, golds: list[str], texts: list[str], deadline_s: float | None = None) -> list[float]:
        """Scores in order: 1.0 where the response's final answer matches the gold, else 0.0.

        Returns within ``deadline_s`` (default ``batch_timeout_s``) plus the few ms it takes to kill busy workers.
        Workers still starting up use the same deadline, so a cold pool may score a short deadline's batch 0."""
        if len(golds) != len(texts):
            raise ValueError(f"{len(golds)} golds for {len(texts)} texts")
        n = len(texts)
        results = [0.0] * n
        if n == 0:
            return results
        with self._lock:
            self.start()
            end = time.monotonic() + (self.batch_timeout_s if deadline_s is None else deadline_s)
            todo: collections.deque[int] = collections.deque()
            payload: list[tuple[str, str]] = []
            for i, (g, t) in enumerate(zip(golds, texts)):
                self.stats["calls"] += 1
                if not isinstance(t, str) or not isinstance(g, str) or not t.strip() or not g.strip():
                    payload.append(("", ""))
                    continue
                if len(t) > self.max_chars:
                    t = t[-self.max_chars:]
                    self.stats["truncated"] += 1
                payload.append((g, t))
                todo.append(i)
            while (todo or any(w.job is not None for w in self._workers)) and time.monotonic() < end:
                for w in list(self._workers):
                    if w.ready and w.job is None and todo:
                        if not w.alive():  # died while idle (OOM killer, a signal): not this batch's fault
                            self._replace(w, "restarts")
                            continue
                        i = todo.popleft()
                        try:
                            w.conn.send((i, *payload[i]))
                        except (OSError, EOFError, ValueError):
                            todo.appendleft(i)
                            self._replace(w, "restarts")
                            continue
                        w.job, w.job_started = i, time.monotonic()
                self._poll(self._next_wakeup(end), results=results)
                self._enforce_limits()
            unfinished = len(todo)
            for w in list(self._workers):  # deadline passed: kill whatever still runs
                if w.job is not None:
                    unfinished += 1
                    w.job = None
                    self._replace(w, "restarts")
            if unfinished:
                self.stats["deadline"] += unfinished
            return results

    def _next_wakeup(self, end: float) -> float:
        t = end
        for w in self._workers:
            if w.job is not None:
                t = min(t, w.job_started + self.call_timeout_s + self.kill_grace_s)
            elif not w.ready:
                t = min(t, w.started_at + self.startup_timeout_s)
        return max(0.0, t - time.monotonic())

    def _poll(self, timeout: float, results) -> None:
        by_conn = {w.conn: w for w in self._workers}
        if not by_conn:
            return
        for conn in mp_wait(list(by_conn), timeout=timeout):
            w = by_conn[conn]
            if w not in self._workers:
                continue
            try:
                msg = conn.recv()
            except (EOFError, OSError):  # the worker exited or died: its socket closed
                self._on_death(w)
                continue
            self._on_message(w, msg, results)

    def _on_message(self, w: _Worker, msg, results) -> None:
        kind = msg[0]
        if kind == "ready":
            w.ready = True
            self._fatal_starts = 0
            return
        if kind == "fatal":
            self._fail_start(w, msg[1])
            return
        idx, score, status = msg
        if w.job != idx:
            return  # a stale reply (cannot happen with one job per worker; kept defensive)
        w.job = None
        if results is not None:
            results[idx] = score
        if score > 0:
            self.stats["correct"] += 1
        if status in ("error", "timeout", "gold_unparsed"):
            self.stats[{"error": "errors", "timeout": "timeouts", "gold_unparsed": "gold_unparsed"}[status]] += 1

    def _fail_start(self, w: _Worker, why: str) -> None:
        self._fatal_starts += 1
        self._replace(w, "failed_starts")
        if self._fatal_starts >= 2 * self.n_workers:
            self.close()
            raise VerifierError(f"math-verify workers cannot start ({why}); "
                                f"pip install 'math-verify[antlr4_9_3]==0.9.0' in {sys.executable}'s environment")

    def _on_death(self, w: _Worker) -> None:
        if not w.ready:
            self._fail_start(w, "the worker exited before it was ready")
            return
        if w.job is not None:
            self.stats["crashes"] += 1
        self._replace(w, "restarts")

    def _enforce_limits(self) -> None:
        now = time.monotonic()
        for w in list(self._workers):
            if w.job is not None and now - w.job_started > self.call_timeout_s + self.kill_grace_s:
                self.stats["timeouts"] += 1
                self.stats["killed"] += 1
                w.job = None
                self._replace(w, "restarts")
            elif not w.ready and now - w.started_at > self.startup_timeout_s:
                self._fail_start(w, f"not ready after {self.startup_timeout_s}s")

    def describe(self) -> dict:
        return {"workers": self.n_workers, "call_timeout_s": self.call_timeout_s, "kill_grace_s": self.kill_grace_s,
                "batch_timeout_s": self.batch_timeout_s, "max_chars": self.max_chars,
                "memory_mb": self.memory_mb, "stats": dict(self.stats)}


class PooledVerification:
    """What a task that checks answers through a `VerifierPool` shares (math, reasoning_gym): the pool started on
    first use from `_pool_args`, one check at a time, its counters, and closing it."""

    _pool_args: dict
    _verifier: VerifierPool | None = None

    def _init_pool(self, workers: int, timeout_s: float, batch_timeout_s: float, max_chars: int,
                   memory_mb: int | None) -> None:
        self._pool_args = dict(workers=workers, call_timeout_s=timeout_s, batch_timeout_s=batch_timeout_s,
                               max_chars=max_chars, memory_mb=memory_mb)
        self._verifier = None

    @property
    def verifier(self) -> VerifierPool:
        """The sandboxed math-verify pool, started on first use."""
        if self._verifier is None:
            self._verifier = VerifierPool(**self._pool_args)
        return self._verifier

    def score(self, problem, response_text: str) -> float:
        """One check through the pool; prefer ``score_many`` for a batch (it uses every worker)."""
        return self.score_many([problem], [response_text])[0]

    def verifier_stats(self) -> dict:
        return dict(self._verifier.stats) if self._verifier is not None else {}

    def close(self) -> None:
        if self._verifier is not None:
            self._verifier.close()
            self._verifier = None
