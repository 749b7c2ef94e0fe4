"""Idle cores lent to the policy trainer (launch/cores.py, topology.lend_idle_cores): the lock protocol between
roles, the thread count it gives, and the guard that stops borrowing where it does not pay."""

from __future__ import annotations

import fcntl

import pytest
from omegaconf import OmegaConf

from prime_values.launch.cores import BorrowGuard, CoreShare, NoShare, core_share


def always(share: CoreShare) -> CoreShare:
    share.guard = BorrowGuard(window=0)  # no own-thread steps to time first
    return share


def locked_elsewhere(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def test_the_trainer_borrows_an_idle_lenders_core_and_holds_it_until_it_gives_it_back(tmp_path):
    lender = CoreShare(tmp_path, "inference0", 1, 2, lends=True)
    trainer = always(CoreShare(tmp_path, "policy_trainer", 1, 2))
    assert trainer.borrow() == 2 and trainer.now == 2
    assert locked_elsewhere(lender.fd), "the lender could compute beside the borrowed team"
    trainer.give_back(10)
    assert trainer.now == 1 and not locked_elsewhere(lender.fd)
    with lender.computing():  # generating: its core is not free
        assert trainer.borrow() == 1
        trainer.give_back(10)


def test_a_core_freed_mid_step_is_borrowed_at_the_next_micro_batch_and_kept_to_the_step_s_end(tmp_path):
    lender = CoreShare(tmp_path, "inference0", 1, 2, lends=True)
    trainer = always(CoreShare(tmp_path, "policy_trainer", 1, 2))
    with lender.computing():  # inference's chunk overlaps the step's first micro-batch
        assert trainer.borrow() == 1
        assert trainer.borrow() == 1  # its backward: still generating
    assert trainer.borrow() == 2  # the second micro-batch: the chunk is over
    assert locked_elsewhere(lender.fd), "the lender could compute beside the borrowed team"
    assert trainer.borrow() == 2 and trainer.now == 2  # kept for the rest of the step
    assert trainer.give_back(10) == 2, "the step's most threads"
    assert trainer.now == 1 and not locked_elsewhere(lender.fd)
    assert trainer.borrow() == 2 and trainer.give_back(10) == 2  # a new step, the lender idle


def test_the_guard_is_asked_once_a_step_however_many_micro_batches(tmp_path):
    CoreShare(tmp_path, "inference0", 1, 2, lends=True)
    trainer = CoreShare(tmp_path, "policy_trainer", 1, 2)
    trainer.guard = BorrowGuard(window=1, gain=1.15, retry=3)
    trainer.guard.own.append(1.0)
    trainer.guard.paused = 2  # the next 2 steps on the own threads
    for _ in range(2):
        assert [trainer.borrow() for _ in range(4)] == [1, 1, 1, 1]
        trainer.give_back(1)
    assert trainer.borrow() == 2, "four micro-batches counted as four paused steps, or the pause never ended"
    trainer.give_back(1)


def test_a_role_that_does_not_lend_counts_as_computing_for_its_whole_life(tmp_path):
    always_busy = CoreShare(tmp_path, "value_trainer", 1, 2)
    CoreShare(tmp_path, "inference0", 1, 2, lends=True)
    trainer = always(CoreShare(tmp_path, "policy_trainer", 1, 2))
    assert trainer.borrow() == 1, "2 cores - the value trainer's 1 thread - the trainer's own 1: nothing to borrow"
    trainer.give_back(1)
    always_busy.close()  # its process ended: the kernel drops its lock
    assert trainer.borrow() == 2


def test_a_value_trainer_that_serves_the_evaluator_never_lends(tmp_path):
    cfg = OmegaConf.create({"launcher": {"name": "local"}, "topology": {
        "lend_idle_cores": True, "threads_per_role": 0, "policy_trainer_threads": 0, "policy_trainer_procs": 1,
        "value_trainer_procs": 1, "policy_trainer_device": "cpu", "evaluator": "colocated"}})
    colocated = core_share(cfg, "value_trainer", "cpu", 1, tmp_path, environ={})
    trainer = always(CoreShare(tmp_path, "policy_trainer", 1, 2))
    with colocated.computing():  # its scoring between steps is not inside this block: it never lets go
        pass
    assert not colocated.lends and trainer.borrow() == 1


def test_the_borrower_never_takes_more_than_the_cores_left(tmp_path):
    CoreShare(tmp_path, "inference0", 2, 4, lends=True)
    CoreShare(tmp_path, "evaluator0", 1, 4)
    trainer = always(CoreShare(tmp_path, "policy_trainer", 1, 4))
    assert trainer.borrow() == 3  # 4 cores - the evaluator's 1 (the idle inference worker's 2 are lent)


def test_the_guard_hand_worked():
    guard = BorrowGuard(window=2, gain=1.15, retry=4)
    assert not guard.wants()  # its own threads timed first
    guard.add(False, 1.0)
    guard.add(False, 1.0)
    assert guard.wants()
    guard.add(True, 0.6)
    guard.add(True, 0.6)
    assert guard.wants(), "1.0 / 0.6 = 1.67x faster: borrowing pays"
    guard.add(True, 1.1)
    guard.add(True, 1.2)  # a busy machine: the window keeps 1.1 and 1.2, median 1.15
    assert [guard.wants() for _ in range(4)] == [False] * 4, "slower than 1.0 / 1.15: the own threads for 4 steps"
    assert guard.wants() and not guard.borrowing, "then borrowing steps are timed afresh"


@pytest.mark.parametrize("change, applies", [
    ({}, True),
    ({"env": {"OMP_NUM_THREADS": "1"}}, False),  # the environment's own choice (the test suite sets it)
    ({"topology.lend_idle_cores": False}, False),
    ({"launcher.name": "slurm"}, False),
    ({"topology.threads_per_role": 2}, False),
    ({"topology.policy_trainer_procs": 2}, False),
    ({"device": "cuda:0"}, False),
    ({"role": "orchestrator"}, False),
])
def test_core_share_applies_only_to_cpu_roles_of_a_local_run_with_automatic_threads(tmp_path, change, applies):
    cfg = OmegaConf.create({"launcher": {"name": "local"}, "topology": {
        "lend_idle_cores": True, "threads_per_role": 0, "policy_trainer_threads": 0, "policy_trainer_procs": 1,
        "value_trainer_procs": 1, "policy_trainer_device": "cpu", "evaluator": "dedicated"}})
    for key, value in change.items():
        if "." in key:
            OmegaConf.update(cfg, key, value)
    share = core_share(cfg, change.get("role", "inference0"), change.get("device", "cpu"), 1, tmp_path,
                       environ=change.get("env", {}))
    assert isinstance(share, CoreShare) == applies and isinstance(share, NoShare) != applies
