"""The pieces the role loops are made of, on hand-built records: joining, advantages, batches, critic inputs,
metrics tailing, device assignment."""

from __future__ import annotations

import json
from collections import deque

import pytest
import torch
from omegaconf import OmegaConf

from prime_values.config import Config
from prime_values.config.advantage import make_estimator
from prime_values.critic_io import CriticInputs
from prime_values.launch import descendants, resolve_devices
from prime_values.monitor import MetricsTail
from prime_values.roles.orchestrator import GroupJoin, ScoredGroup, batch_metrics, batch_rows, score_group, score_groups
from prime_values.roles.policy_trainer import policy_lr
from tests.log_rows import rollout, values_row


def test_group_waits_for_every_rollout_and_every_value():
    join = GroupJoin(group_size=2, needs_values=True)
    join.add_rollouts([rollout("a", "g", 1.0)])
    join.add_values([values_row("a", [0, 0, .5, .5, .5])])
    assert join.pop_complete() == []  # one rollout of the group missing
    join.add_rollouts([rollout("b", "g", 0.0)])
    assert join.pop_complete() == [] and join.waiting_rollouts == 2  # b has no values yet
    join.add_values([values_row("b", [0, 0, .25, .25, .25])])
    [(rollouts, values)] = join.pop_complete()
    assert [r["rollout_id"] for r in rollouts] == ["a", "b"] and [v["rollout_id"] for v in values] == ["a", "b"]
    assert join.waiting_rollouts == 0


def test_gae_advantages_with_lambda_one_are_return_minus_value():
    cfg = OmegaConf.structured(Config)
    rollouts = [rollout("a", "g", 1.0), rollout("b", "g", 0.0)]
    values = [values_row("a", [9, 9, .5, .75, 1.0]), values_row("b", [9, 9, .25, .5, .0])]
    scored = score_group(rollouts, values, make_estimator(cfg.advantage))
    # gamma = lambda = 1: A_t = R - V_t on policy tokens, 0 on the prompt (whatever the value there)
    assert torch.allclose(scored.advantages, torch.tensor([[0, 0, .5, .25, 0], [0, 0, -.25, -.5, 0]]))
    assert torch.allclose(scored.targets, torch.tensor([[0, 0, 1., 1., 1.], [0, 0, 0, 0, 0]]))


def test_policy_lr_is_constant_then_decays_over_the_last_steps():
    cfg = OmegaConf.structured(Config)
    cfg.policy.lr = 1.0
    assert [policy_lr(cfg.policy, s, 10) for s in range(1, 11)] == [1.0] * 10  # lr_decay_steps = 0: constant
    cfg.policy.lr_decay_steps = 3  # steps 8 / 9 / 10 of 10: 3/4, 2/4, 1/4 (never 0: every step still moves)
    assert [policy_lr(cfg.policy, s, 10) for s in range(1, 11)] == [1.0] * 7 + [0.75, 0.5, 0.25]
    cfg.policy.lr_decay_steps = 19  # longer than the run: the first step already decays, 10/20
    assert policy_lr(cfg.policy, 1, 10) == 0.5 and policy_lr(cfg.policy, 10, 10) == 0.05


def test_batch_metrics_report_critic_health_worked_by_hand():
    cfg = OmegaConf.structured(Config)
    rollouts = [rollout("a", "g", 1.0), rollout("b", "g", 0.0)]
    values = [values_row("a", [9, 9, .5, .5, .5], version=3), values_row("b", [9, 9, .5, .5, .5], version=4)]
    group = score_group(rollouts, values, make_estimator(cfg.advantage))
    class Provenance:  # critic v3 had trained on data up to policy v0, v4 had not published it
        def trained_on(self, version):
            return {3: 0}.get(version)

    m = batch_metrics(3, [group], newest_critic=5, provenance=Provenance())
    # targets 1,1,1 and 0,0,0 against a flat 0.5: residuals ±0.5 have the targets' own variance -> EV = 0
    assert m["critic_explained_variance"] == pytest.approx(0.0, abs=1e-6)  # 1 - 0.25 / 0.25 of float32 sums of 6
    assert m["value_first_mean"] == pytest.approx(0.5) and m["return_first_mean"] == pytest.approx(0.5)
    assert (m["advantage_mean"], m["advantage_abs_mean"], m["advantage_positive"]) == pytest.approx((0, .5, .5))
    assert (m["critic_version_lag_mean"], m["critic_version_lag_max"]) == (1.5, 2)  # 5-3 and 5-4
    assert (m["off_policy_mean"], m["reward_mean"]) == (2, 0.5)  # rollouts of v0 in batch 3
    assert (m["value_staleness_mean"], m["value_staleness_max"]) == (2, 2)  # (3 - 1) - 0, v4 unknown


def test_a_cut_trace_bootstraps_from_the_value_at_the_cut():
    cfg = OmegaConf.structured(Config)
    cut = {**values_row("a", [0, 0, .5, .6, 0]), "cut": True, "valued_tokens": 4, "bootstrap_value": 0.8}
    gae = make_estimator(cfg.advantage)
    scored = score_group([rollout("a", "g", 1.0)], [cut], gae)
    # the critic saw prompt + 2 response tokens; γ = λ = 1: A_t = V(s_cut) - V_t (the reward is beyond the cut)
    assert torch.allclose(scored.advantages, torch.tensor([[0, 0, .3, .2, 0]]))
    assert torch.allclose(scored.targets, torch.tensor([[0, 0, .8, .8, 0]]))
    capped = score_group([rollout("a", "g", 1.0)], [values_row("a", [0, 0, .5, .6, .7])], gae)  # not cut: R counts
    assert torch.allclose(capped.advantages, torch.tensor([[0, 0, .5, .4, .3]]))


def test_grpo_advantages_need_no_values():
    cfg = OmegaConf.structured(Config)
    cfg.advantage.estimator = "grpo"
    scored = score_group([rollout("a", "g", 1.0), rollout("b", "g", 0.0)], None, make_estimator(cfg.advantage))
    assert torch.allclose(scored.advantages, torch.tensor([[0, 0, .5, .5, .5], [0, 0, -.5, -.5, -.5]]))
    assert scored.targets is None


def test_batch_rows_carry_provenance_and_unpadded_advantages():
    cfg = OmegaConf.structured(Config)
    short = rollout("b", "g", 0.0, response=(7, 2))
    rollouts = [rollout("a", "g", 1.0, version=4), short]
    values = [values_row("a", [0, 0, .5, .5, .5], version=7), values_row("b", [0, 0, .5, .5], version=8)]
    groups = [score_group(rollouts, values, make_estimator(cfg.advantage))]
    rows = batch_rows(5, groups, whiten_advantages=False)
    assert [r["step"] for r in rows] == [5, 5]
    assert [r["policy_version"] for r in rows] == [4, 0] and [r["critic_version"] for r in rows] == [7, 8]
    assert rows[1]["advantages"] == pytest.approx([0, 0, -.5, -.5]) and len(rows[1]["token_ids"]) == 4


class PositionCritic(torch.nn.Module):
    """A fake causal critic whose value at position i is i: shows which position each value is read at."""

    def forward(self, input_ids, attention_mask=None, **kwargs):
        positions = torch.arange(input_ids.shape[1], dtype=torch.float32).expand(input_ids.shape)
        return type("Out", (), {"logits": positions[..., None]})()


def test_critic_inputs_put_the_answer_first_and_map_values_back(monkeypatch):
    from prime_values.models import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    prompt = tokenizer.encode("1+2=", add_special_tokens=False)
    rows = [rollout("a", "g", 1.0, prompt=prompt, response=(tokenizer.encode("3", add_special_tokens=False)[0],
                                                            tokenizer.eos_token_id))]
    inputs = CriticInputs(rows, tokenizer, "answer:{privileged}|", True, max_length=64)
    assert tokenizer.decode(inputs.input_ids[0], skip_special_tokens=True) == "answer:42|1+2=3"
    values = inputs.values(PositionCritic())
    prefix = len("answer:42|")
    # policy token j (here j = 4, 5) reads the critic at position prefix + j - 1: the state before it
    assert values[0].tolist() == [0, 0, 0, 0, prefix + 3, prefix + 4]
    plain = CriticInputs(rows, tokenizer, "answer:{privileged}|", False, max_length=64)
    assert plain.values(PositionCritic())[0].tolist() == [0, 0, 0, 0, 3, 4]
    assert (plain.cut, plain.valued_tokens) == ([False], [6])
    # a context of prefix + 5 tokens cuts the trace after "1+2=3": the eos is outside, V(s_cut) = position 14
    cut = CriticInputs(rows, tokenizer, "answer:{privileged}|", True, max_length=prefix + 5)
    assert cut.values(PositionCritic())[0].tolist() == [0, 0, 0, 0, prefix + 3, 0]
    assert (cut.cut, cut.valued_tokens, cut.bootstrap.tolist()) == ([True], [5], [prefix + 4])
    # placement 'response', answer padded to 3 characters: the block sits between the prompt and the response,
    # and the values are read at the same positions (prompt + block + response so far)
    ccfg = type("C", (), dict(template="{privileged:<3}|", privileged=True, max_length=64, placement="response"))
    after = CriticInputs.of(rows, tokenizer, ccfg)
    assert tokenizer.decode(after.input_ids[0], skip_special_tokens=True) == "1+2=42 |3"
    assert after.values(PositionCritic())[0].tolist() == [0, 0, 0, 0, 4 + 3, 4 + 4]


def test_metrics_tail_never_returns_a_half_written_line(tmp_path):
    path = tmp_path / "m.jsonl"
    tail = MetricsTail(path)
    assert tail.read() == []
    path.write_text(json.dumps({"step": 1}) + "\n" + '{"step": ')
    assert tail.read() == [{"step": 1}]
    with open(path, "a") as f:
        f.write('2, "loss": 0.5}\n')
    assert tail.read() == [{"step": 2, "loss": 0.5}] and tail.last == {"step": 2, "loss": 0.5}


def test_auto_devices_take_one_gpu_per_role_while_they_last():
    topology = OmegaConf.structured(Config).topology
    for key in ("inference_device", "evaluator_device", "policy_trainer_device", "value_trainer_device"):
        topology[key] = "auto"
    resolve_devices(topology, cuda_count=3)
    assert [topology.inference_device, topology.evaluator_device, topology.policy_trainer_device,
            topology.value_trainer_device] == ["cuda:0", "cuda:1", "cuda:2", "cpu"]
    topology.evaluator, topology.evaluator_device, topology.value_trainer_device = "colocated", "auto", "auto"
    resolve_devices(topology, cuda_count=0)
    assert topology.evaluator_device == "cpu" and topology.value_trainer_device == "cpu"


def test_descendants_finds_grandchildren():
    import subprocess
    import sys
    import time

    parent = subprocess.Popen([sys.executable, "-c",
                               "import subprocess, sys, time; subprocess.Popen(['sleep', '30']); time.sleep(30)"])
    try:
        deadline = time.time() + 10
        while time.time() < deadline and not descendants(parent.pid):
            time.sleep(0.05)
        assert len(descendants(parent.pid)) == 1
    finally:
        from prime_values.launch import kill_tree

        kill_tree(parent.pid)
        parent.wait()


def test_value_trainer_rebuilds_replay_from_the_log_with_reuse_counts(tmp_path):
    from prime_values.replay import ReplayBuffer, dump_snapshot
    from prime_values.roles.common import RoleContext
    from prime_values.roles.value_trainer import REPLAY_SNAPSHOT, restore_replay
    from prime_values.rundir import RunDir

    run = RunDir(tmp_path)
    run.mkdirs()
    OmegaConf.save(OmegaConf.structured(Config), run.config)
    ctx = RoleContext(tmp_path, "value_trainer")

    def target(i):
        r = rollout(f"r{i}", f"g{i // 2}", float(i % 2), version=i // 4)
        return {k: r[k] for k in ("rollout_id", "group_id", "policy_version", "token_ids", "policy_mask",
                                  "privileged", "reward")} | {
            "critic_version": 0, "values": [0.0] * 5, "value_targets": [0.0] * 5, "token_digest": 0, "created_at": 0.0}

    writer, reader = ctx.writer("targets", "main"), ctx.reader("targets", "value_trainer")
    live = ReplayBuffer(6, 2, "uniform", seed=1)
    for begin in (0, 4, 8):
        writer.append([target(i) for i in range(begin, begin + 4)])
        for segment in reader.poll():
            for row in segment.table.to_pylist():
                live.add(row)
        live.sample(3)
    reader.commit()
    critic_dir = tmp_path / "critic_v"
    critic_dir.mkdir()
    (critic_dir / REPLAY_SNAPSHOT).write_bytes(dump_snapshot(live.snapshot()))
    writer.append([target(i) for i in range(12, 16)])  # logged after the crash point: not the buffer's yet

    restarted = ReplayBuffer(6, 2, "uniform", seed=1)
    restore_replay(ctx, restarted, critic_dir, ctx.reader("targets", "value_trainer"))
    assert restarted.reuse_counts() == live.reuse_counts() and sum(live.reuse_counts().values()) > 0
    assert [r["rollout_id"] for r in restarted.sample(6)] == [r["rollout_id"] for r in live.sample(6)]


def test_tether_is_grpo_for_a_useless_critic_and_zero_for_a_perfect_one():
    cfg = OmegaConf.structured(Config)
    cfg.advantage.estimator = "tether"
    rollouts = [rollout("a", "g", 1.0), rollout("b", "g", 0.0)]
    tether = make_estimator(cfg.advantage)
    flat = [values_row("a", [0, 0, .5, .5, .5]), values_row("b", [0, 0, .5, .5, .5])]
    scored = score_group(rollouts, flat, tether)  # R² of a constant 0.5 on returns 1,1,1,0,0,0 is 0: w = 0
    assert torch.allclose(scored.advantages, torch.tensor([[0, 0, .5, .5, .5], [0, 0, -.5, -.5, -.5]]))
    perfect = [values_row("a", [0, 0, 1, 1, 1]), values_row("b", [0, 0, 0, 0, 0])]
    scored = score_group(rollouts, perfect, tether)  # w = 1: A = R - V = 0 everywhere
    assert torch.equal(scored.advantages, torch.zeros(2, 5)) and scored.stats["tether_weight"].tolist() == [1, 1]


def _tether_groups():
    """Three complete groups as the orchestrator's join hands them over (policy tokens: the last 3 of 5)."""
    informative = ([rollout("a", "g1", 1.0), rollout("b", "g1", 0.0)],
                   [values_row("a", [9, 9, .75, .75, .75]), values_row("b", [9, 9, .25, .25, .25])])
    all_right = ([rollout("c", "g2", 1.0), rollout("d", "g2", 1.0)],
                 [values_row("c", [9, 9, .5, .5, .5]), values_row("d", [9, 9, .5, .5, .5])])
    alone = ([rollout("e", "g3", 0.0)], [values_row("e", [9, 9, .25, .25, .25])])
    return [informative, all_right, alone]


def test_tether_group_mode_reads_the_running_ev_for_a_flat_group_and_the_critic_alone_for_a_group_of_one():
    cfg = OmegaConf.structured(Config)
    cfg.advantage.estimator, cfg.inference.prompts_per_step = "tether", 4
    recent = deque(maxlen=4)
    g1, g2, g3 = score_groups(_tether_groups(), make_estimator(cfg.advantage), recent)
    # g1: returns (1,1,1 | 0,0,0), V = .75 / .25: R² = 1 − 6·0.0625 / (6·0.25) = 0.75 = w, b = 0.5,
    #     Ṽ = .75·V + .125 = .6875 / .3125  →  A = ±0.3125
    assert g1.stats["tether_weight"].tolist() == [0.75, 0.75]
    assert torch.allclose(g1.advantages[:, 2:], torch.tensor([[.3125] * 3, [-.3125] * 3]))
    # g2: both right, returns do not vary → w = the critic's EV on the groups scored before it (g1: residuals
    #     ±0.25, Var 0.0625 of 0.25 → 0.75), b = 1, Ṽ = .75·.5 + .25 = .625 → A = +0.375 (the group mean gives 0)
    assert g2.stats["tether_weight"].tolist() == [0.75, 0.75]
    assert torch.allclose(g2.advantages[:, 2:], torch.full((2, 3), .375))
    # g3: a group of one → w = 1, A = R − V = −0.25 (its group mean, its own reward, would give 0)
    assert g3.stats["tether_weight"].tolist() == [1.0]
    assert torch.allclose(g3.advantages[0, 2:], torch.full((3,), -.25))
    assert [g.rollouts[0]["group_id"] for g in recent] == ["g1", "g2", "g3"]
    # under GRPO the fraction of groups (of two or more) whose rewards are all equal: g2 of g1, g2
    metrics = batch_metrics(1, [g1, g2, g3])
    assert metrics["groups_equal_reward"] == 0.5 and metrics["tether_weight_mean"] == pytest.approx(0.8)


def test_tether_running_mode_starts_at_the_group_mean_before_any_group_was_scored():
    cfg = OmegaConf.structured(Config)
    cfg.advantage.estimator, cfg.advantage.tether_mode, cfg.inference.prompts_per_step = "tether", "running", 4
    g1, g2, g3 = score_groups(_tether_groups(), make_estimator(cfg.advantage), deque(maxlen=4))
    # g1 is the first group: no explained variance yet (nan → w = 0), A = R − mean R = ±0.5
    assert g1.stats["tether_weight"].tolist() == [0.0, 0.0]
    assert torch.allclose(g1.advantages[:, 2:], torch.tensor([[.5] * 3, [-.5] * 3]))
    # g2: w = EV(g1) = 0.75 as in group mode; g3 (a group of one): w = 1 in this mode too
    assert g2.stats["tether_weight"].tolist() == [0.75, 0.75] and g3.stats["tether_weight"].tolist() == [1.0]


def test_group_size_one_completes_groups_and_gae_scores_them():
    cfg = OmegaConf.structured(Config)
    cfg.inference.group_size = 1
    join = GroupJoin(group_size=1, needs_values=True)
    join.add_rollouts([rollout("a", "g", 1.0), rollout("b", "h", 0.0)])
    join.add_values([values_row("a", [9, 9, .5, .5, .5])])
    [(rollouts, values)] = join.pop_complete()  # "b" still waits for its values
    [group] = score_groups([(rollouts, values)], make_estimator(cfg.advantage), deque(maxlen=1))
    assert torch.allclose(group.advantages[0, 2:], torch.full((3,), .5))  # R − V
    assert "groups_equal_reward" not in batch_metrics(1, [group])  # no group of two or more


def test_adaptive_lambda_reaches_the_advantages():
    cfg = OmegaConf.structured(Config)
    cfg.advantage.adaptive_alpha = 1.0  # n = 3 policy tokens: λ = 1 - 1/3 = 2/3
    rollouts = [rollout("a", "g", 1.0)]
    scored = score_group(rollouts, [values_row("a", [0, 0, .5, .5, .5])], make_estimator(cfg.advantage))
    # δ = 0, 0, 0.5 (only the last token sees the reward); A_t = Σ (γλ)^k δ_{t+k}: 0.5·(2/3)², 0.5·(2/3), 0.5
    assert torch.allclose(scored.advantages[0, 2:], torch.tensor([0.5 * 4 / 9, 0.5 * 2 / 3, 0.5]))
    assert torch.allclose(scored.targets[0, 2:], torch.ones(3))  # λ_value = 1: Monte-Carlo returns


@pytest.mark.parametrize("loss,clip,lambda_value", [("bce", 0.0, 1.0), ("mse", 0.1, 1.0), ("huber", 0.0, 0.5)])
def test_critic_step_with_each_value_loss(loss, clip, lambda_value):
    from prime_values.critic_io import critic_step
    from prime_values.models import build_char_tokenizer, build_critic

    cfg = OmegaConf.structured(Config)
    cfg.critic.loss, cfg.critic.value_clip, cfg.advantage.lambda_value = loss, clip, lambda_value
    tok = build_char_tokenizer()
    critic = build_critic(None, tok, seed=0, hidden_size=64, num_heads=2, num_kv_heads=1, intermediate_size=128)
    rows = [{**rollout(f"r{i}", "g", float(i % 2), response=(7 + i % 2, 8, 2)), "values": [0.0, 0.0, .5, .5, .5],
             "value_targets": [0.0, 0.0] + [float(i % 2)] * 3} for i in range(4)]
    optimizer = torch.optim.AdamW(critic.parameters(), lr=1e-3)
    stats = [critic_step(critic, optimizer, rows, tok, cfg, "cpu") for _ in range(5)]
    assert all(torch.isfinite(torch.tensor(s["value_loss"])) for s in stats)
    # it learns the targets (bce's values being probabilities holds by construction: a sigmoid, not checked)
    assert stats[-1]["value_loss"] < stats[0]["value_loss"]


def test_critic_step_is_the_shared_optimizer_step_on_the_value_loss():
    """critic_step = trainer.optimizer_step around the value loss: the same weights, statistics and clipped
    gradient norm as the step written out by hand (forward, value_loss, backward, clip_grad_norm_, AdamW), bit for
    bit; clipping, value clipping and recomputed λ-targets all on."""
    from prime_values.algo.gae import explained_variance
    from prime_values.algo.losses import value_loss, values_from_head
    from prime_values.critic_io import critic_step, padded, value_targets
    from prime_values.models import build_char_tokenizer, build_critic

    cfg = OmegaConf.structured(Config)
    cfg.critic.value_clip, cfg.critic.max_grad_norm, cfg.advantage.lambda_value = 0.1, 0.05, 0.5
    tok = build_char_tokenizer()
    rows = [{**rollout(f"r{i}", "g", float(i % 2), response=(7 + i % 2, 8, 2)[: 2 + i % 2]),
             "values": [0.0, 0.0, .5, .4, .3][: 4 + i % 2], "value_targets": [0.0, 0.0] + [float(i % 2)] * (2 + i % 2)}
            for i in range(4)]

    def model_and_optimizer():
        critic = build_critic(None, tok, seed=0, hidden_size=64, num_heads=2, num_kv_heads=1, intermediate_size=128)
        return critic, torch.optim.AdamW(critic.parameters(), lr=1e-3)

    def by_hand(critic, optimizer) -> dict:
        inputs = CriticInputs.of(rows, tok, cfg.critic)
        raw = inputs.values(critic, head=None)
        values = values_from_head(raw, cfg.critic.loss).where(inputs.policy_mask, torch.zeros_like(raw))
        targets = value_targets(rows, inputs, values, cfg)
        old = padded(rows, "values", torch.float32, length=values.shape[1])
        loss, stats = value_loss(raw, targets, inputs.policy_mask, kind=cfg.critic.loss, with_stats=True,
                                 old_values=old, clip_range=cfg.critic.value_clip)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(critic.parameters(), cfg.critic.max_grad_norm).item()
        optimizer.step()
        return {"value_loss": loss.item(), "value_clip_fraction": stats["clip_fraction"],
                "train_explained_variance": explained_variance(values.detach(), targets, inputs.policy_mask),
                "value_mean": values.detach()[inputs.policy_mask].mean().item(),
                "target_mean": targets[inputs.policy_mask].mean().item(), "grad_norm": norm}

    shared, reference = model_and_optimizer(), model_and_optimizer()
    for _ in range(3):
        stats, expected = critic_step(*shared, rows, tok, cfg, "cpu"), by_hand(*reference)
        assert stats == expected
        assert stats["grad_norm"] > cfg.critic.max_grad_norm  # the clip is on (not vacuous)
    for (name, a), b in zip(shared[0].named_parameters(), reference[0].parameters()):
        assert torch.equal(a, b), name


def test_offline_critic_warm_start_reads_the_newest_rollouts_of_an_earlier_run(tmp_path):
    import time as _time

    from prime_values.config import ConfigError, validate
    from prime_values.log import SegmentWriter
    from prime_values.roles.common import RoleContext
    from prime_values.roles.warm_start import rollouts_of_run
    from prime_values.rundir import RunDir

    earlier = RunDir(tmp_path / "earlier")
    with SegmentWriter(earlier.stream("rollouts"), "w0", "rollouts") as writer:
        for chunk in range(3):
            writer.append([rollout(f"r{chunk}-{i}", f"g{chunk}", float(i % 2), prompt_id="p", shard="w0",
                                   stop_reason="eos", task="{}", created_at=_time.time()) for i in range(4)])
    run = RunDir(tmp_path / "now")
    run.mkdirs()
    cfg = OmegaConf.structured(Config)
    cfg.critic.warm_start.rollouts, cfg.critic.warm_start.from_run = 6, str(earlier.root)
    validate(cfg, cuda_count=0)
    OmegaConf.save(cfg, run.config)
    rows = rollouts_of_run(RoleContext(run.root, "warm_start"), str(earlier.root))
    assert [r["rollout_id"] for r in rows] == ["r1-2", "r1-3", "r2-0", "r2-1", "r2-2", "r2-3"]  # the newest 6
    assert [r["value_targets"] for r in rows[:2]] == [[0, 0, 0, 0, 0], [0, 0, 1, 1, 1]]  # R on policy tokens
    cfg.critic.warm_start.from_run = str(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="critic.warm_start.from_run=.*has no log/rollouts"):
        validate(cfg, cuda_count=0)


def test_policy_trainer_skips_a_batch_it_trained_before_a_restart(tmp_path):
    from prime_values.log import LogReader, SegmentWriter
    from prime_values.roles.policy_trainer import next_rows

    def batch(step):
        return [{"step": step, "rollout_id": f"r{step}", "policy_version": step - 1, "critic_version": 0,
                 "token_ids": [1, 2], "policy_mask": [0, 1], "sampling_logprobs": [0.0, -1.0],
                 "advantages": [0.0, 0.5], "reward": 1.0}]

    with SegmentWriter(tmp_path / "batches", "main", "batches") as writer:
        for step in (1, 2, 3):
            writer.append(batch(step), seq=step - 1)

    class Ctx:
        def stopping(self):
            return False

        def wait(self, seconds=0.0):
            pass

        def doing(self, what, **progress):
            pass

    # crashed after publishing version 2 without committing batch 2: the cursor still points at batch 2
    reader = LogReader(tmp_path / "batches", "policy_trainer", tmp_path / "cursors", "batches")
    assert next_rows(reader, Ctx(), 1)[0]["step"] == 1
    reader.commit()
    restarted = LogReader(tmp_path / "batches", "policy_trainer", tmp_path / "cursors", "batches")
    assert next_rows(restarted, Ctx(), 3)[0]["rollout_id"] == "r3"  # batch 2 skipped, not trained twice
    fresh = LogReader(tmp_path / "batches", "other", tmp_path / "cursors", "batches")
    with pytest.raises(AssertionError, match="not for step 0"):  # a batch from the future is an error, not skipped
        next_rows(fresh, Ctx(), 0)


def waiting(rollouts: list[dict]) -> ScoredGroup:
    """A scored group as ReadyGroups holds it (only its rollouts matter there)."""
    return ScoredGroup(rollouts, None, torch.ones(len(rollouts), 1, dtype=torch.bool), torch.zeros(len(rollouts), 1))


def test_ready_groups_take_one_chunk_of_every_worker():
    """Seen in CI with 2 workers (prompts_per_step 4, 2 groups a chunk, steps=4): worker 1 ran ahead and its
    chunk for step 4 filled batch 3 next to worker 0's chunk 1 (arrival order), leaving worker 0's chunks 2 and 3
    for step 4; chunk 2 was stale there, and no worker generates past its last chunk: the run waited forever.
    Per-worker queues give every batch one chunk of each worker."""
    from prime_values.roles.orchestrator import ReadyGroups

    def group(shard: str, chunk: int, version: int) -> ScoredGroup:
        return waiting([{"shard": shard, "policy_version": version, "group_id": f"{shard}-{chunk}"}] * 4)

    ready = ReadyGroups(workers=2, per_worker=2)
    for shard, chunk, version in [("w0", 0, 0), ("w1", 0, 0), ("w1", 1, 0), ("w0", 1, 0), ("w1", 2, 1),
                                  ("w1", 3, 2)]:  # arrival order: worker 1 is ahead
        ready.add(group(shard, chunk, version))
        ready.add(group(shard, chunk, version))
    batch = ready.take()
    assert [g.rollouts[0]["group_id"] for g in batch] == ["w0-0", "w0-0", "w1-0", "w1-0"]
    assert [g.rollouts[0]["group_id"] for g in ready.take()] == ["w0-1", "w0-1", "w1-1", "w1-1"]
    assert ready.take() is None and len(ready) == 4  # worker 0's chunk 2 is not here yet
    ready.add(group("w0", 2, 1))
    ready.add(group("w0", 2, 1))
    assert ready.drop_stale(step=3, max_off_policy=1) == 0
    assert [g.rollouts[0]["group_id"] for g in ready.take()] == ["w0-2", "w0-2", "w1-2", "w1-2"]
    ready.add(group("w0", 3, 0))  # a straggler too old for step 4 (version 0: (4 - 1) - 0 > 1)
    assert ready.drop_stale(step=4, max_off_policy=1) == 4 and len(ready) == 2
    assert ready.take() is None


def test_drop_stale_keeps_exactly_max_off_policy_and_drops_one_more():
    """The bound's edge (tests/mutations.py, staleness-off-by-one, survived every other test): for step n a group of
    policy version v is (n - 1) - v steps stale; max_off_policy = k keeps k and drops k + 1."""
    from prime_values.roles.orchestrator import ReadyGroups

    for k in (0, 1, 2):
        step = 10
        ready = ReadyGroups(workers=1, per_worker=1)
        ready.add(waiting([{"shard": "w0", "policy_version": step - 1 - (k + 1)}] * 3))  # k + 1 stale
        ready.add(waiting([{"shard": "w0", "policy_version": step - 1 - k}] * 3))  # k stale
        assert ready.drop_stale(step=step, max_off_policy=k) == 3 and len(ready) == 1, k
        assert ready.take()[0].policy_version == step - 1 - k


def test_initial_critic_follows_critic_init_and_num_layers(tmp_path):
    """The warm start's untrained critic: the policy's backbone (first num_layers blocks), a fresh model from
    policy.arch, or a saved critic cut to num_layers."""
    from prime_values.models import build_char_tokenizer, build_tiny_policy, save_model
    from prime_values.roles.warm_start import initial_critic

    cfg = OmegaConf.structured(Config)
    cfg.policy.arch.hidden_size, cfg.policy.arch.num_layers, cfg.policy.arch.intermediate_size = 64, 3, 128
    cfg.policy.arch.num_heads, cfg.policy.arch.num_kv_heads = 2, 1
    tok = build_char_tokenizer()
    policy = build_tiny_policy(tok, seed=0, **cfg.policy.arch)
    save_model(policy, tok, tmp_path / "policy")
    cfg.critic.num_layers = 2
    from_policy = initial_critic(cfg, tmp_path / "policy", tok, seed=1)
    assert len(from_policy.model.layers) == 2
    kept, original = from_policy.model.layers[1].self_attn.q_proj, policy.model.layers[1].self_attn.q_proj
    assert torch.equal(kept.weight, original.weight)
    cfg.critic.init = "scratch"
    scratch = initial_critic(cfg, tmp_path / "policy", tok, seed=1)
    assert len(scratch.model.layers) == 2 and scratch.config.hidden_size == 64
    assert not torch.equal(scratch.model.embed_tokens.weight, policy.model.embed_tokens.weight)
    save_model(from_policy, tok, tmp_path / "critic")
    cfg.critic.init, cfg.critic.num_layers = str(tmp_path / "critic"), 1
    saved = initial_critic(cfg, tmp_path / "policy", tok, seed=1)
    assert len(saved.model.layers) == 1
    assert torch.equal(saved.score.weight, from_policy.score.weight)  # the saved head, not a fresh one


@pytest.mark.parametrize("loss", ["mse", "bce"])
def test_critic_step_targets_with_lambda_below_one_bootstrap_a_cut_trace_as_the_orchestrator_does(loss):
    """lambda_value < 1: the value trainer recomputes the targets with its own critic; for a trace the critic's
    context cut they must bootstrap with V(s_cut) (the reward lies beyond the cut), exactly as `score_group`
    computes them from the evaluator's scores of the same critic, and as `advantages_and_targets` defines them."""
    from prime_values.algo.gae import advantages_and_targets
    from prime_values.critic_io import value_targets
    from prime_values.models import build_char_tokenizer, build_critic

    cfg = OmegaConf.structured(Config)
    cfg.critic.loss, cfg.advantage.lambda_value, cfg.advantage.gamma = loss, 0.5, 1.0
    cfg.critic.privileged, cfg.critic.template, cfg.critic.max_length = True, "{privileged}|", 8
    tok = build_char_tokenizer()
    critic = build_critic(None, tok, seed=0, hidden_size=64, num_heads=2, num_kv_heads=1, intermediate_size=128)
    critic.eval()
    # "42|" + 2 prompt tokens + 3 response tokens = 8 fits; "42|" + 2 + 5 = 10 is cut after 3 response tokens
    rows = [rollout("fits", "g", 1.0, response=(7, 8, 2)), rollout("cut", "g", 1.0, response=(7, 8, 9, 10, 2))]
    inputs = CriticInputs.of(rows, tok, cfg.critic)
    with torch.no_grad():
        values = inputs.values(critic, loss)
    assert inputs.cut == [False, True] and inputs.valued_tokens == [5, 5]
    mine = value_targets(rows, inputs, values, cfg)
    rewards = torch.tensor([1.0, 1.0])
    _, expected = advantages_and_targets(rewards, values, inputs.policy_mask, 1.0, 1.0, 0.5,
                                         bootstrap=inputs.bootstrap, cut=torch.tensor(inputs.cut))
    assert torch.allclose(mine, expected, atol=1e-6)
    # the cut trace's last valued token targets V(s_cut), not the reward (which a wrong target would put there)
    assert mine[1, 4].item() == pytest.approx(inputs.bootstrap[1].item(), abs=1e-6)
    assert (mine[1, 5:] == 0).all()  # beyond the cut: no target
    assert mine[0, 4].item() == pytest.approx(1.0)  # the trace that fits ends on its reward
    scores = [{"rollout_id": r["rollout_id"], "critic_version": 0, "values": values[b, : len(r["token_ids"])].tolist(),
               "cut": inputs.cut[b], "valued_tokens": inputs.valued_tokens[b],
               "bootstrap_value": float(inputs.bootstrap[b]) if inputs.cut[b] else 0.0, "scored_at": 0.0}
              for b, r in enumerate(rows)]
    orchestrator = score_group(rows, scores, make_estimator(cfg.advantage)).targets
    assert torch.allclose(mine, orchestrator, atol=1e-6)


def test_time_budget_ends_the_run_before_a_step_and_the_final_evaluation_would_overrun(tmp_path):
    import os
    import time

    from prime_values.roles.policy_trainer import TimeBudget

    config, metrics = tmp_path / "config.yaml", tmp_path / "policy_trainer.jsonl"
    config.write_text("steps: 3\n")
    now = time.time()
    os.utime(config, (now - 50, now - 50))  # the run began 50 s ago
    metrics.write_text(json.dumps({"step": 0, "heldout_s": 5.0}) + "\n")  # its step-0 evaluation took 5 s
    assert not TimeBudget(0, config, metrics).spent()  # no budget
    assert not TimeBudget(1.0, config, metrics).spent()  # 50 + 5 < 60
    assert TimeBudget(0.9, config, metrics).spent()  # 50 + 5 >= 54
    budget = TimeBudget(1.0, config, metrics)
    budget.previous = time.time() - 10  # the last step took ~10 s: 50 + 10 + 5 >= 60
    assert budget.spent()


def test_warm_start_evaluates_the_heldout_set_before_and_after_sft_on_the_same_problems(tmp_path):
    """policy.warm_start.heldout_before: the model as loaded is evaluated before any SFT step, problem by problem
    (metrics/heldout/before_sft.jsonl), then SFT runs, then (heldout_after) the SFT'd weights on the same problems;
    heldout_after=false leaves the second evaluation to the policy trainer's step 0."""
    from omegaconf import OmegaConf

    from prime_values.models import build_char_tokenizer, build_tiny_policy
    from prime_values.roles.common import RoleContext
    from prime_values.roles.warm_start import supervised
    from prime_values.tasks import make_task
    from tests.e2e_helpers import SMALL, compose

    def run(name, *extra):
        root = tmp_path / name
        root.mkdir()
        cfg = compose([*SMALL, "policy.warm_start.steps=3", "policy.warm_start.target_accuracy=0",
                       "policy.warm_start.batch_size=4", "policy.warm_start.warmup_steps=0",
                       "policy.warm_start.heldout_before=true", *extra])
        (root / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
        ctx = RoleContext(root, "warm_start", "policy_trainer_device")
        tok = build_char_tokenizer()
        model, task = build_tiny_policy(tok, seed=0, **dict(cfg.policy.arch)), make_task(**cfg.task)
        before = [p.detach().clone() for p in model.parameters()]
        accuracy = supervised(ctx, model, tok, task)
        assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))  # SFT ran after it
        metrics = [json.loads(line) for line in (root / "metrics" / "warm_start.jsonl").read_text().splitlines()]
        return root / "metrics" / "heldout", accuracy, metrics, task

    heldout, accuracy, metrics, task = run("both")
    ids = [p.prompt_id for p in task.heldout()]
    rows = {name: [json.loads(line) for line in (heldout / f"{name}.jsonl").read_text().splitlines()]
            for name in ("before_sft", "after_sft")}
    for name, records in rows.items():
        assert [r["prompt_id"] for r in records] == ids, name
        assert all(r["reward"] in (0.0, 1.0) and r["stop_reason"] in ("eos", "length") for r in records)
    assert accuracy == sum(r["reward"] for r in rows["after_sft"]) / len(ids)
    logged = [m for m in metrics if "heldout_accuracy_before_sft" in m]
    assert len(logged) == 1 and logged[0]["heldout_accuracy_before_sft"] == \
        sum(r["reward"] for r in rows["before_sft"]) / len(ids)
    assert metrics.index(logged[0]) < min(i for i, m in enumerate(metrics) if "sft_step" in m)  # before SFT

    heldout, accuracy, _, _ = run("before_only", "policy.warm_start.heldout_after=false")
    assert accuracy is None and (heldout / "before_sft.jsonl").exists() and not (heldout / "after_sft.jsonl").exists()


def test_critic_batch_sources_publish_on_their_schedule_and_serve_scoring_first():
    """The value trainer's schedules as batch sources of (batch, publish_now): async publishes every
    critic.publish_every steps once replay holds replay.min_rollouts; lockstep trains lockstep_critic_steps
    minibatches on policy version v's rows and publishes after the last; both serve scoring first."""
    from types import SimpleNamespace

    from prime_values.monitor import Timers
    from prime_values.replay import IngestQueue, ReplayBuffer
    from prime_values.roles.value_trainer import lockstep_batches, replay_batches

    cfg = OmegaConf.structured(Config)
    cfg.replay.min_rollouts, cfg.critic.publish_every, cfg.critic.batch_rollouts = 2, 2, 1
    cfg.inference.prompts_per_step, cfg.inference.group_size, cfg.schedule.lockstep_critic_steps = 1, 2, 3
    ctx = SimpleNamespace(cfg=cfg, stopping=lambda: False, wait=lambda *a: None, seed=lambda *s: 0,
                          doing=lambda *a, **k: None)
    scored = []

    def score() -> bool:  # the colocated evaluator has one scoring batch waiting, then none
        scored.append(len(scored))
        return len(scored) == 1

    queue = IngestQueue(8)
    for i in range(2):
        queue.put(rollout(f"r{i}", "g", 1.0, version=0))
    source = replay_batches(ctx, queue, ReplayBuffer(8, 100, "fifo"), score, Timers())
    flags = [publish for _, publish in (next(source) for _ in range(4))]
    assert flags == [False, True, False, True] and scored[:2] == [0, 1]  # scoring served before the first step

    version, scored[:] = [0], []
    for i in range(2):
        queue.put(rollout(f"l{i}", "g", 1.0, version=0))
    queue.put(rollout("next", "h", 1.0, version=1))  # policy version 1's rows: not enough for its batch yet
    stops = iter([False] * 5 + [True])
    ctx.stopping = lambda: next(stops)
    source = lockstep_batches(ctx, queue, ReplayBuffer(8, 100, "fifo"), score, Timers(), lambda: version[0])
    items = [next(source) for _ in range(3)]
    assert [p for _, p in items] == [False, False, True]
    assert all(len(b) == 1 and b[0]["policy_version"] == 0 for b, _ in items)
    version[0] = 1  # published: the next plan waits for version 1's whole batch until the run stops
    assert list(source) == []
