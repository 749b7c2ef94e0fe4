"""replay.ratio: the value trainer trains at most `ratio` rollouts per new rollout ingested, and waits otherwise."""

from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from prime_values.config import Config
from prime_values.monitor import Timers
from prime_values.replay import IngestQueue, ReplayBuffer
from prime_values.roles.value_trainer import ReplayRatio, replay_batches


def test_replay_ratio_hand_worked():
    # ratio 1, batches of 64: 128 ingested allow 2 steps (64, 128 trained), the third waits for 64 more
    budget = ReplayRatio(1.0)
    budget.ingested = 128
    allowed = []
    for _ in range(3):
        allowed.append(budget.allows(64))
        budget.trained += 64 if allowed[-1] else 0
    assert allowed == [True, True, False] and budget.trained == 128
    budget.ingested = 192
    assert budget.allows(64) and not ReplayRatio(0.5).allows(1)  # nothing ingested yet: no step at all
    half = ReplayRatio(0.5)
    half.ingested = 128  # 0.5 x 128 = 64: one step of 64 per 128 new rollouts
    assert half.allows(64) and not half.allows(65)
    unbounded = ReplayRatio(0)
    unbounded.trained = 10 ** 9
    assert unbounded.allows(64)


def rows(prefix: str, n: int) -> list[dict]:
    return [{"rollout_id": f"{prefix}{i}", "policy_version": 0, "token_ids": [1, 2], "policy_mask": [0, 1]}
            for i in range(n)]


@pytest.mark.parametrize("ratio, steps_per_4", [(0.5, 1), (1.0, 2), (2.0, 4), (0.0, None)])
def test_replay_batches_take_ratio_times_new_rollouts_then_wait(ratio, steps_per_4):
    """Batches of 2 rollouts: each 4 rollouts ingested allow 4 x ratio / 2 critic steps; then the source waits
    (counted as wait) until more arrive. Unbounded (0): a step at every turn of the loop."""
    cfg = OmegaConf.structured(Config)
    cfg.replay.min_rollouts, cfg.critic.batch_rollouts, cfg.replay.ratio = 2, 2, ratio
    turns = {"left": 40}

    def stopping() -> bool:
        turns["left"] -= 1
        return turns["left"] < 0
    ctx = SimpleNamespace(cfg=cfg, stopping=stopping, wait=lambda *a: None, doing=lambda *a, **k: None)
    queue, budget, timers = IngestQueue(64), ReplayRatio(ratio), Timers()
    for row in rows("a", 4):
        queue.put(row)
    source = replay_batches(ctx, queue, ReplayBuffer(64, 0, "fifo"), lambda: False, timers, budget)
    taken = list(source)
    if steps_per_4 is None:
        assert len(taken) == 40  # never waits
        return
    assert len(taken) == steps_per_4 and budget.trained == 2 * steps_per_4 <= ratio * budget.ingested
    turns["left"] = 40
    for row in rows("b", 4):  # 4 more: as many steps again
        queue.put(row)
    assert len(list(replay_batches(ctx, queue, ReplayBuffer(64, 0, "fifo"), lambda: False, timers, budget))) == \
        steps_per_4
    assert budget.stats() == {"rollouts_ingested": 8, "rollouts_trained": 4 * steps_per_4}
