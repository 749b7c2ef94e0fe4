"""A fork server for local role jobs: `python -m prime_values.launch.zygote <socket> <run_dir>`.

Started once per local run by the conductor. It imports what every role needs (torch, transformers, the model
code, submitit) and then forks a job controller (prime_values.launch.controller) for each job it is asked for,
whose tasks are forked from it in turn. A role started this way skips the imports a fresh Python process pays,
so a replacement for a killed role starts working almost at once (figures in docs/reliability.md).

Protocol (one Unix-socket connection per job): the conductor sends one JSON line {"folder", "env"}; the zygote
answers with the controller's pid on one line, and, when that controller has ended, one more line with its exit
status (as `Popen.returncode`: negative for a signal). A closed connection without it means the zygote is gone
(and its controllers with it: they die with it). `ZygoteClient.start` returns a Popen-like handle.

Safe to fork: nothing here starts a thread of its own, touches CUDA, or imports pyarrow (whose allocator runs a
background thread); the roles import those after the fork. The zygote exits when its parent (the conductor) is
gone and its last job has ended, or on SIGTERM.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import psutil

from prime_values.launch.controller import Controller, _die_with_parent

PRELOAD = ("psutil", "numpy", "torch", "transformers", "omegaconf", "submitit", "submitit.core.submission",
           "prime_values.config", "prime_values.tasks", "prime_values.models.build", "prime_values.launch.controller")


def preload() -> None:
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception as error:  # noqa: BLE001 - a role imports it again and reports what is wrong
            print(f"zygote: could not preload {name}: {error}", file=sys.stderr, flush=True)


def _controller_main(request: dict, zygote: int) -> None:
    """In the forked child: become the job's controller (its tasks are forked from here), then exit."""
    code = 1
    try:
        _die_with_parent(zygote)  # a killed zygote takes its controllers (and so their tasks) with it
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(request["env"])
        code = Controller(Path(request["folder"]), fork=True).run()
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
    finally:
        os._exit(code)


def serve(path: str) -> None:
    parent = os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = f"{path}.{os.getpid()}.tmp"
    listener.bind(tmp)
    listener.listen(64)
    os.rename(tmp, path)  # the socket appears only once the imports are done: clients fall back until then
    children: dict[int, socket.socket] = {}
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the roles; the conductor closes us after them
    try:
        while not stop and (os.getppid() == parent or children):
            ready, _, _ = select.select([listener], [], [], 0.02)
            if ready:
                conn, _ = listener.accept()
                try:
                    request = json.loads(conn.makefile("r").readline())
                except (OSError, ValueError):
                    conn.close()
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                zygote = os.getpid()
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    for other in children.values():
                        other.close()
                    conn.close()
                    _controller_main(request, zygote)
                children[pid] = conn
                try:
                    conn.sendall(f"{pid}\n".encode())
                except OSError:
                    pass
            while children:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if not pid:
                    break
                conn = children.pop(pid, None)
                if conn is not None:
                    try:
                        conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                    except OSError:
                        pass
                    conn.close()
    finally:
        listener.close()
        try:
            os.unlink(path)
        except OSError:
            pass


class ZygoteJob:
    """The conductor's handle on a controller the zygote forked: poll(), send_signal(), pid (as Popen), and
    `server_lost` once the zygote died under it. Signals go through a psutil handle taken when the zygote
    answered (checked to be the zygote's child), so a pid reused after the controller ended is never signalled."""

    def __init__(self, conn: socket.socket, pid: int, zygote_pid: int | None = None):
        self.conn, self.pid, self.returncode = conn, pid, None
        self.buffer, self.server_lost = b"", False
        try:
            self.proc = psutil.Process(pid)
            if zygote_pid is not None and self.proc.ppid() != zygote_pid:
                self.proc = None  # it ended and the pid was reused before we looked
        except psutil.Error:
            self.proc = None
        conn.setblocking(False)

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        try:
            data = self.conn.recv(64)
        except BlockingIOError:
            return None
        except OSError:
            data = b""
        if data:
            self.buffer += data
            if not self.buffer.endswith(b"\n"):
                return None
            self.returncode = int(self.buffer.strip())
        else:  # the zygote is gone, and its controllers died with it
            self.returncode, self.server_lost = -signal.SIGKILL, True
        self.conn.close()
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.proc is None or self.poll() is not None:
            return
        try:
            self.proc.send_signal(signum)
        except psutil.Error:
            pass

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.time() + timeout
        while self.poll() is None:
            if deadline is not None and time.time() > deadline:
                raise TimeoutError(f"controller {self.pid} still running")
            time.sleep(0.02)
        return self.returncode


class ZygoteClient:
    """Starts the zygote for one run and asks it for jobs; `start()` is None until it is ready (or when it died),
    and the caller then starts a fresh process instead."""

    def __init__(self, run_dir: str | os.PathLike):
        self.path = os.path.join(tempfile.gettempdir(), f"pv-zygote-{os.getpid()}-{time.time_ns()}.sock")
        self.process = subprocess.Popen([sys.executable, "-m", "prime_values.launch.zygote", self.path,
                                         str(run_dir)], stdin=subprocess.DEVNULL)

    def ready(self, wait_s: float = 0.0) -> bool:
        deadline = time.time() + wait_s
        while True:
            if self.process.poll() is not None:
                return False
            if os.path.exists(self.path):
                return True
            if time.time() >= deadline:
                return False
            time.sleep(0.05)

    def start(self, folder: str | os.PathLike, env: dict) -> ZygoteJob | None:
        if not self.ready():
            return None
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.settimeout(10)
            conn.connect(self.path)
            conn.sendall((json.dumps({"folder": str(folder), "env": env}) + "\n").encode())
            line = b""
            while not line.endswith(b"\n"):
                chunk = conn.recv(64)
                if not chunk:
                    raise OSError("the zygote closed the connection")
                line += chunk
        except OSError:
            conn.close()
            return None
        return ZygoteJob(conn, int(line.strip()), self.process.pid)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except Exception:  # noqa: BLE001
                self.process.kill()


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] in ("-h", "--help"):
        print("usage: python -m prime_values.launch.zygote <socket path> <run_dir>  (started by the conductor)")
        sys.exit(0 if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help") else 2)
    serve(sys.argv[1])
