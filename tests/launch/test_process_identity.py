"""A pid is a process only with its start time: a reaped pid that the kernel gave to another process is not the
conductor a role watches, nor a job `status` reports as running."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil

from prime_values.rundir import RunDir, process_alive
from prime_values.tools.status import local_state


def test_a_pid_with_another_start_time_is_not_alive():
    me = psutil.Process()
    assert process_alive(os.getpid()) and process_alive(os.getpid(), me.create_time())
    assert not process_alive(os.getpid(), me.create_time() - 5.0)  # this pid, but not the process recorded
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    assert not process_alive(ended.pid)


def test_roles_see_the_conductor_gone_when_its_pid_is_reused(tmp_path):
    run = RunDir(tmp_path)
    run.register_conductor(watch=True)
    assert run.conductor_alive()
    info = json.loads(run.conductor_file.read_text())
    info["created"] -= 5.0  # the recorded conductor started earlier: this pid now belongs to someone else
    run.conductor_file.write_text(json.dumps(info))
    assert not RunDir(tmp_path).conductor_alive()


def test_status_reports_a_reused_job_pid_as_ended(tmp_path):
    run = RunDir(tmp_path)
    folder = run.jobs / "inference0"
    folder.mkdir(parents=True)
    me = psutil.Process()
    (folder / f"{me.pid}_process.json").write_text(json.dumps({"pid": me.pid, "create_time": me.create_time()}))
    assert local_state(run, "inference0", str(me.pid), ended=False) == "RUNNING"
    (folder / f"{me.pid}_process.json").write_text(json.dumps({"pid": me.pid, "create_time": me.create_time() - 5}))
    assert local_state(run, "inference0", str(me.pid), ended=False) == "ENDED"
