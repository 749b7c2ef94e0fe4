"""Bounded non-blocking ingest queue and rollout-granular replay buffer."""

import threading

import pytest

from prime_values.replay import IngestQueue, ReplayBuffer


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


def test_replay_capacity_eviction_and_fifo_reuse_eviction():
    buffer = ReplayBuffer(capacity=3, max_reuse=2, sampling="fifo")
    for i in range(5):
        buffer.add(i)
    # 0 and 1 evicted by capacity, with 0 uses each
    assert buffer.sample(2) == [2, 3]
    assert buffer.sample(2) == [2, 3]  # second use: 2 and 3 reach max_reuse and leave
    assert buffer.sample(5) == [4]  # n capped at len
    assert buffer.stats() == {
        "size": 1,
        "added": 5,
        "sampled": 5,
        "evicted_capacity": 2,
        "evicted_reuse": 2,
        "mean_reuse_of_evicted": 1.0,  # uses (0 + 0 + 2 + 2) / 4 evicted
    }


def test_replay_recent_samples_newest_first_and_unlimited_reuse():
    buffer = ReplayBuffer(capacity=10, max_reuse=0, sampling="recent")
    for i in range(4):
        buffer.add(i)
    for _ in range(20):
        assert buffer.sample(3) == [3, 2, 1]
    assert len(buffer) == 4 and buffer.stats()["evicted_reuse"] == 0
    assert buffer.stats()["mean_reuse_of_evicted"] == 0.0


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


def test_replay_unknown_sampling_lists_allowed_names():
    with pytest.raises(ValueError, match="uniform, fifo, recent"):
        ReplayBuffer(capacity=4, max_reuse=1, sampling="lifo")
