"""Bounded non-blocking ingest queue and rollout-granular replay buffer: every rule with hand-worked numbers."""

import math
import random
import threading
from collections import Counter

import pytest

from prime_values.replay import (
    SAMPLING_RULES,
    IngestQueue,
    ReplayBuffer,
    dump_snapshot,
    load_snapshot,
    rollout_key,
)


def row(rid, version):
    return {"rollout_id": rid, "policy_version": version}


def keys(batch):
    return [rollout_key(item) for item in batch]


# -- ingest queue ---------------------------------------------------------------------------------------------


def test_ingest_queue_drops_oldest_when_full_and_drains_fifo():
    queue = IngestQueue(maxsize=3)
    for i in range(5):
        queue.put(i)
    # 0 and 1 were pushed out by 3 and 4
    assert (len(queue), queue.dropped, queue.put_count) == (3, 2, 5)
    assert queue.drain(max_items=1) == [2]
    assert queue.drain() == [3, 4]
    assert queue.drain() == [] and len(queue) == 0


def test_ingest_queue_concurrent_puts_never_block_and_count_exactly():
    queue = IngestQueue(maxsize=50)
    drained = []

    def produce(offset):
        for i in range(500):
            queue.put(offset + i)

    threads = [threading.Thread(target=produce, args=(k * 1000,)) for k in range(4)]
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        drained += queue.drain(max_items=7)
    for thread in threads:
        thread.join()
    drained += queue.drain()
    assert queue.put_count == 2000
    assert len(drained) + queue.dropped == 2000  # every item either consumed or counted as dropped
    assert len(set(drained)) == len(drained)
    for k in range(4):  # each producer's items come out in the order it put them
        mine = [x for x in drained if k * 1000 <= x < (k + 1) * 1000]
        assert mine == sorted(mine)


def test_ingest_queue_rejects_nonpositive_size():
    with pytest.raises(ValueError, match="queue_size"):
        IngestQueue(0)


# -- capacity, reuse, fifo ------------------------------------------------------------------------------------


def test_replay_capacity_eviction_and_fifo_reuse_eviction():
    buffer = ReplayBuffer(capacity=3, max_reuse=2, sampling="fifo")
    for i in range(5):
        buffer.add(i)
    # 0 and 1 evicted by capacity, with 0 uses each; held 2, 3, 4
    assert buffer.sample(2) == [2, 3]
    assert buffer.sample(2) == [4, 2]  # pass ends at 4, a new pass starts at the oldest; 2 reaches 2 uses, leaves
    assert buffer.reuse_counts() == {3: 1, 4: 1}
    assert buffer.sample(5) == [3, 4]  # n capped at len; both reach max_reuse
    stats = buffer.stats()
    assert (stats["size"], stats["added"], stats["sampled"]) == (0, 5, 6)
    assert (stats["evicted_capacity"], stats["evicted_reuse"], stats["evicted_age"]) == (2, 3, 0)
    assert stats["mean_reuse_of_evicted"] == pytest.approx(1.2)  # uses (0 + 0 + 2 + 2 + 2) / 5 evicted


def test_fifo_serves_each_rollout_once_per_pass_and_new_rollouts_join_the_pass():
    buffer = ReplayBuffer(capacity=10, max_reuse=0, sampling="fifo")
    for i in range(5):
        buffer.add(i)
    assert buffer.sample(2) == [0, 1]
    assert buffer.sample(2) == [2, 3]
    buffer.add(5)  # joins the current pass, after 4
    assert buffer.sample(3) == [4, 5, 0]  # wraps: second pass begins at the oldest
    assert buffer.sample(2) == [1, 2]
    assert buffer.reuse_counts() == {0: 2, 1: 2, 2: 2, 3: 1, 4: 1, 5: 1}
    buffer.add(6)
    buffer.add(7)
    for i in range(8, 13):  # capacity 10: 0, 1 and 2 leave, including the rollout under the cursor (2)
        buffer.add(i)
    assert buffer.sample(3) == [3, 4, 5]  # the cursor survives its rollout's eviction


def test_capacity_evicts_in_insertion_order_and_duplicates_are_ignored():
    buffer = ReplayBuffer(capacity=2, max_reuse=0, sampling="fifo")
    for rid in ["a", "b", "a", "c", "a"]:  # the second "a" is a duplicate; "c" evicts "a"; the third re-enters
        buffer.add(row(rid, 0))
    assert list(buffer.reuse_counts()) == ["c", "a"]
    stats = buffer.stats()
    assert (stats["added"], stats["duplicates"], stats["evicted_capacity"]) == (4, 1, 2)


# -- max age --------------------------------------------------------------------------------------------------


def test_max_age_boundary_is_inclusive_and_stale_rollouts_are_never_sampled():
    buffer = ReplayBuffer(capacity=100, max_reuse=0, sampling="uniform", max_age=2)
    for rid, version in [("a", 3), ("b", 4), ("c", 5)]:
        buffer.add(row(rid, version))
    assert list(buffer.reuse_counts()) == ["a", "b", "c"]  # a is exactly max_age = 2 behind: kept
    buffer.add(row("d", 6))  # a is now 3 behind: evicted
    assert list(buffer.reuse_counts()) == ["b", "c", "d"]
    buffer.set_policy_version(7)  # b is 3 behind: evicted
    buffer.set_policy_version(5)  # never goes down
    assert buffer.newest_policy_version == 7
    buffer.add(row("e", 4))  # arrives already 3 behind: counted as added, evicted at once
    assert list(buffer.reuse_counts()) == ["c", "d"]
    for _ in range(50):
        assert sorted(keys(buffer.sample(10))) == ["c", "d"]
    stats = buffer.stats()
    assert (stats["added"], stats["evicted_age"], stats["size"]) == (5, 3, 2)
    assert (stats["newest_policy_version"], stats["age_mean"], stats["age_max"]) == (7, 1.5, 2)  # ages 2 and 1


def test_max_age_zero_is_unlimited_and_versionless_items_never_age():
    buffer = ReplayBuffer(capacity=10, max_reuse=0, max_age=0)
    buffer.add(row("old", 0))
    buffer.add(row("new", 1000))
    assert list(buffer.reuse_counts()) == ["old", "new"]
    aged = ReplayBuffer(capacity=10, max_reuse=0, max_age=1)
    aged.add(7)  # not a row: no policy version
    aged.add(row("x", 0))
    aged.set_policy_version(50)
    assert list(aged.reuse_counts()) == [7]
    assert (aged.stats()["age_mean"], aged.stats()["age_max"]) == (0.0, 0)


# -- uniform and recent sampling ------------------------------------------------------------------------------


def test_replay_uniform_without_replacement_and_deterministic_by_seed():
    def draws(seed):
        buffer = ReplayBuffer(capacity=100, max_reuse=3, sampling="uniform", seed=seed)
        for i in range(20):
            buffer.add(i)
        return [buffer.sample(8) for _ in range(6)], buffer

    first, buffer = draws(seed=1)
    again, _ = draws(seed=1)
    other, _ = draws(seed=2)
    assert first == again and first != other
    for batch in first:
        assert len(set(batch)) == len(batch)  # no repeats within one call
    # 6 calls × 8 = 48 draws, max_reuse 3 → each rollout used at most 3 times
    uses = {i: sum(batch.count(i) for batch in first) for i in range(20)}
    assert max(uses.values()) <= 3
    stats = buffer.stats()
    assert stats["sampled"] == 48
    assert stats["evicted_reuse"] == sum(1 for u in uses.values() if u == 3)
    assert stats["size"] == 20 - stats["evicted_reuse"]


def test_uniform_includes_each_rollout_with_probability_n_over_len():
    buffer = ReplayBuffer(capacity=10, max_reuse=0, sampling="uniform", seed=3)
    for i in range(10):
        buffer.add(i)
    counts = Counter(i for _ in range(20000) for i in buffer.sample(3))
    for i in range(10):
        assert counts[i] / 20000 == pytest.approx(0.3, abs=0.015)  # 3 / 10; sd ≈ 0.003


def test_recent_half_life_zero_samples_newest_first_with_unlimited_reuse():
    buffer = ReplayBuffer(capacity=10, max_reuse=0, sampling="recent", recent_half_life=0)
    for i in range(4):
        buffer.add(i)
    for _ in range(20):
        assert buffer.sample(3) == [3, 2, 1]
    assert len(buffer) == 4 and buffer.stats()["evicted_reuse"] == 0
    assert buffer.stats()["mean_reuse_of_evicted"] == 0.0


def test_recent_weights_halve_every_half_life_rollouts_back():
    buffer = ReplayBuffer(capacity=8, max_reuse=0, sampling="recent", seed=11, recent_half_life=2.0)
    for i in range(8):
        buffer.add(i)
    weights = [2 ** (-rank / 2) for rank in range(8)]  # rank 0 = newest = item 7
    p = [w / sum(weights) for w in weights]
    assert p[0] == pytest.approx(0.3124, abs=1e-4) and p[7] == pytest.approx(0.0276, abs=1e-4)  # 4-digit hand values
    draws = 40000
    counts = Counter(buffer.sample(1)[0] for _ in range(draws))
    for rank in range(8):
        assert counts[7 - rank] / draws == pytest.approx(p[rank], abs=0.008)  # sd ≤ 0.0024
    # A batch is drawn one at a time without replacement: P(7 then 6) = p0 * p1 / (1 - p0) ≈ 0.1004; a pair's
    # frequency has sd sqrt(0.1 * 0.9 / 40000) = 0.0015 (seeded draws), so 0.006 is 4 sd.
    pairs = [buffer.sample(2) for _ in range(draws)]
    assert all(a != b for a, b in pairs)
    assert sum(pair == [7, 6] for pair in pairs) / draws == pytest.approx(p[0] * p[1] / (1 - p[0]), abs=0.006)
    assert sum(pair == [6, 7] for pair in pairs) / draws == pytest.approx(p[1] * p[0] / (1 - p[1]), abs=0.006)


def test_recent_tiny_weights_do_not_underflow():
    buffer = ReplayBuffer(capacity=3000, max_reuse=1, sampling="recent", recent_half_life=0.5)
    for i in range(3000):  # weight of the oldest is 2 ** -5998, far below the smallest float
        buffer.add(i)
    batch = buffer.sample(3000)
    assert sorted(batch) == list(range(3000)) and len(buffer) == 0  # every rollout drawn once, then used up
    assert batch.index(2999) < 20 and batch.index(0) > 2900  # and still drawn roughly newest first


def test_replay_unknown_sampling_lists_allowed_names():
    with pytest.raises(ValueError, match="uniform, fifo, recent"):
        ReplayBuffer(capacity=4, max_reuse=1, sampling="lifo")


def test_replay_rejects_negative_max_age_and_half_life():
    with pytest.raises(ValueError, match="max_age"):
        ReplayBuffer(capacity=4, max_reuse=1, max_age=-1)
    with pytest.raises(ValueError, match="recent_half_life"):
        ReplayBuffer(capacity=4, max_reuse=1, recent_half_life=-1.0)


# -- stats ----------------------------------------------------------------------------------------------------


def test_stats_report_size_age_reuse_histogram_and_evictions_by_cause():
    buffer = ReplayBuffer(capacity=5, max_reuse=4, sampling="recent", recent_half_life=0, max_age=3)
    assert buffer.stats()["newest_policy_version"] == -1
    for i, version in enumerate([1, 1, 2, 2, 3, 4]):  # r0 leaves for capacity when r5 arrives
        buffer.add(row(f"r{i}", version))
    for n in (4, 3, 2, 1):  # newest first: r5 r4 r3 r2, r5 r4 r3, r5 r4, r5
        buffer.sample(n)
    # r5 reached 4 uses and left for reuse
    assert buffer.reuse_counts() == {"r1": 0, "r2": 1, "r3": 2, "r4": 3}
    buffer.add(row("r6", 5))  # newest 5: r1 (version 1) is 4 behind and leaves for age
    assert buffer.reuse_counts() == {"r2": 1, "r3": 2, "r4": 3, "r6": 0}
    assert buffer.stats() == {
        "size": 4,
        "capacity": 5,
        "added": 7,
        "duplicates": 0,
        "sampled": 10,
        "evicted_capacity": 1,
        "evicted_reuse": 1,
        "evicted_age": 1,
        "mean_reuse_of_evicted": (0 + 4 + 0) / 3,
        "newest_policy_version": 5,
        "age_mean": (3 + 3 + 2 + 0) / 4,  # versions 2, 2, 3, 5
        "age_max": 3,
        "reuse_mean": 1.5,
        "reuse_max": 3,
        "reuse_0": 1,
        "reuse_1": 1,
        "reuse_2": 1,
        "reuse_3plus": 1,
    }


# -- restart --------------------------------------------------------------------------------------------------


def test_rebuild_hand_worked_restores_counts_skips_dropped_and_adds_rows_after_the_snapshot():
    log = [row(f"r{i}", 0) for i in range(7)]
    live = ReplayBuffer(capacity=3, max_reuse=3, sampling="fifo")
    for i in (0, 1, 2):
        live.add(log[i])  # r3 is dropped by the ingest queue
    assert keys(live.sample(2)) == ["r0", "r1"]
    live.add(log[4])  # capacity: r0 leaves with 1 use
    assert keys(live.sample(2)) == ["r2", "r4"]
    saved = dump_snapshot(live.snapshot())
    assert isinstance(saved, bytes)
    live.add(log[5])  # after the snapshot; r6 is still in the queue when the process dies
    live.sample(1)

    restarted = ReplayBuffer(capacity=3, max_reuse=3, sampling="fifo")
    summary = restarted.rebuild(log[1:7], load_snapshot(saved))
    # r1 r2 r4 restored with 1 use each, r3 skipped, r5 and r6 fresh: r5 pushes out r1, r6 pushes out r2
    assert summary == {"restored": 3, "fresh": 2, "skipped": 1, "missing": 0}
    assert restarted.reuse_counts() == {"r4": 1, "r5": 0, "r6": 0}
    stats = restarted.stats()
    assert (stats["added"], stats["sampled"], stats["evicted_capacity"]) == (6, 4, 3)
    assert keys(restarted.sample(1)) == ["r5"]  # the fifo cursor was restored on r4


def test_rebuild_counts_missing_rows_and_handles_a_tail_that_starts_after_the_snapshot():
    log = [row(f"r{i}", 0) for i in range(6)]
    live = ReplayBuffer(capacity=3, max_reuse=0, sampling="uniform")
    for r in log[:4]:
        live.add(r)
    snapshot = live.snapshot()  # holds r1 r2 r3
    short = ReplayBuffer(capacity=3, max_reuse=0, sampling="uniform")
    assert short.rebuild(log[2:6], snapshot) == {"restored": 2, "fresh": 2, "skipped": 0, "missing": 1}
    assert list(short.reuse_counts()) == ["r3", "r4", "r5"]
    pruned = ReplayBuffer(capacity=3, max_reuse=0, sampling="uniform")
    assert pruned.rebuild(log[4:6], snapshot) == {"restored": 0, "fresh": 2, "skipped": 0, "missing": 3}
    assert list(pruned.reuse_counts()) == ["r4", "r5"]


def test_rebuild_applies_current_settings_and_without_snapshot_adds_every_row():
    log = [row(f"r{i}", i) for i in range(6)]
    live = ReplayBuffer(capacity=6, max_reuse=0, sampling="fifo")
    for r in log:
        live.add(r)
    live.sample(4)  # r0..r3 used once
    snapshot = load_snapshot(dump_snapshot(live.snapshot()))
    tighter = ReplayBuffer(capacity=3, max_reuse=1, sampling="fifo", max_age=4)
    tighter.rebuild(log, snapshot)  # r0 too old (5 behind), r1..r3 used up, then capacity has room
    assert tighter.reuse_counts() == {"r4": 0, "r5": 0}
    stats = tighter.stats()
    assert (stats["evicted_age"], stats["evicted_reuse"], stats["evicted_capacity"]) == (1, 3, 0)
    fresh = ReplayBuffer(capacity=4, max_reuse=0)
    assert fresh.rebuild(log, None) == {"restored": 0, "fresh": 6, "skipped": 0, "missing": 0}
    assert list(fresh.reuse_counts()) == ["r2", "r3", "r4", "r5"]
    with pytest.raises(ValueError, match="freshly constructed"):
        fresh.rebuild(log, snapshot)
    with pytest.raises(ValueError, match="format"):
        load_snapshot(b'{"format": 99}')


@pytest.mark.parametrize("sampling", SAMPLING_RULES)
def test_rebuild_from_log_tail_equals_the_buffer_at_the_crash(sampling):
    def make():
        return ReplayBuffer(capacity=16, max_reuse=3, sampling=sampling, seed=7, max_age=2, recent_half_life=3.0)

    log = [row(f"r{i:03d}", i // 10) for i in range(200)]  # the policy version rises every 10 rollouts
    dropped = random.Random(0)
    live = make()
    for i, r in enumerate(log[:150]):
        if i % 37 == 36:
            live.set_policy_version(i // 10 + 2)  # the trainer learns of a newer policy before its rollouts
        if dropped.random() < 0.3 and i < 149:  # (a row dropped after the last add would come back fresh)
            continue  # dropped by the ingest queue: in the log, never in the buffer
        live.add(r)
        if live.added % 3 == 0:
            live.sample(4)
    live.sample(4)
    snapshot = live.snapshot()
    saved = dump_snapshot(snapshot)
    for r in log[150:160]:  # ingested after the snapshot, no critic step before the crash
        live.add(r)
    before = live.stats()
    assert min(before["evicted_capacity"], before["evicted_reuse"], before["evicted_age"]) > 0
    assert any(uses > 0 for _, uses in snapshot["held"])

    restarted = make()
    summary = restarted.rebuild(log[100:160], load_snapshot(saved))
    assert summary["missing"] == 0 and summary["fresh"] == 10 and summary["restored"] == len(snapshot["held"])
    assert list(restarted.reuse_counts().items()) == list(live.reuse_counts().items())
    assert restarted.stats() == before
    assert [restarted.sample(5) for _ in range(6)] == [live.sample(5) for _ in range(6)]
    assert restarted.stats() == live.stats()


def test_snapshot_round_trips_integer_keys():
    buffer = ReplayBuffer(capacity=4, max_reuse=0, sampling="fifo")
    for i in range(3):
        buffer.add(i)
    buffer.sample(2)
    restarted = ReplayBuffer(capacity=4, max_reuse=0, sampling="fifo")
    restarted.rebuild([0, 1, 2], load_snapshot(dump_snapshot(buffer.snapshot())))
    assert restarted.reuse_counts() == {0: 1, 1: 1, 2: 0}
    assert math.isclose(restarted.stats()["reuse_mean"], 2 / 3)
