"""Value evaluator: the critic's value at every causal state of every rollout, stamped with its version.

Dedicated topology: this is its own job, adopting each newly published critic version between scoring
batches. Colocated topology: the value trainer owns a `Scorer` and serves it between optimizer steps.
"""

from __future__ import annotations

import contextlib
import functools
import time
from typing import TYPE_CHECKING

import torch

from prime_values.critic_io import CriticInputs
from prime_values.log.records import to_rows, token_digest
from prime_values.monitor import Timers
from prime_values.roles import evaluator_name
from prime_values.roles.common import RoleContext
from prime_values.tasks import make_task
from prime_values.weights import Adopter

if TYPE_CHECKING:
    from prime_values.config import Config


def oracle_values(policy, tokenizer, task, rows: list[dict], samples: int, max_new_tokens: int, temperature: float,
                  seed: int) -> list[list[float]]:
    """V(s_t) at every policy token t of each row (`token_ids`, `policy_mask`, `privileged`): the mean reward of
    `samples` games the given policy plays on from the state before t (the task's `continuations`, all states in
    one batched play; the problem is read back from the prompt with `task.problem_from`); 0 at the environment's
    and the prompt's tokens, as a critic's values are."""
    starts, where = [], []
    for b, row in enumerate(rows):
        ids, mask = list(row["token_ids"]), [int(m) for m in row["policy_mask"]]
        first = mask.index(1) if 1 in mask else len(mask)
        problem = task.problem_from(tokenizer.decode(ids[:first], skip_special_tokens=True), row["privileged"])
        for j, m in enumerate(mask):
            if m:
                starts.append((problem, ids[:j], mask[:j]))
                where.append((b, j))
    played = task.continuations(policy, tokenizer, starts, samples, max_new_tokens, temperature, seed=seed,
                                batch_size=1024)
    values = [[0.0] * len(row["token_ids"]) for row in rows]
    for (b, j), games in zip(where, played):
        values[b][j] = sum(g.reward for g in games) / len(games)
    return values


class OracleValues:
    """critic.oracle_samples = K: `oracle_values` with K games per state, the run's sampling settings and a fresh
    seed per scoring chunk."""

    def __init__(self, cfg: Config, task, tokenizer, seed: int):
        self.cfg, self.task, self.tokenizer, self.seed = cfg, task, tokenizer, seed
        self.calls = 0

    def __call__(self, policy, rows: list[dict]) -> list[list[float]]:
        self.calls += 1
        inference = self.cfg.inference
        return oracle_values(policy, self.tokenizer, self.task, rows, self.cfg.critic.oracle_samples,
                             inference.max_new_tokens, inference.temperature, seed=self.seed + 104729 * self.calls)


def evaluator_shards(index: int, count: int):
    """With several evaluators, evaluator k scores the rollouts of inference workers w with w % count == k (shard
    'w<w>') and writes values shard 'e<k>'; one evaluator reads every shard."""
    if count <= 1:
        return None
    return lambda shard: shard[1:].isdigit() and int(shard[1:]) % count == index


class Scorer:
    """Tails the rollout log and appends one values segment per scored batch of rollouts."""

    def __init__(self, ctx: RoleContext, tokenizer, consumer: str = "evaluator", timers: Timers | None = None,
                 index: int = 0):
        self.ctx, self.cfg, self.tokenizer = ctx, ctx.cfg, tokenizer
        self.reader = ctx.reader("rollouts", consumer, shards=evaluator_shards(index, ctx.cfg.topology.evaluators))
        self.writer = ctx.writer("values", f"e{index}")
        self.scored = 0
        self.timers = timers or Timers()
        self.lockstep = ctx.cfg.resolved.lockstep
        self.pending = []  # lockstep: polled segments waiting for a critic that trained on the previous batch

    def needed_version(self) -> int:
        """lockstep: rollouts of policy version v (batch v + 1) are scored by critic version >= v, the one the
        value trainer published after training on batch v's targets (critic version 0 scores batch 1)."""
        return max(max(segment.table.column("policy_version").to_pylist()) for segment in self.pending)

    @torch.no_grad()
    def score_pending(self, critic, critic_version: int, max_segments: int = 4, skipped_versions: int = 0,
                      weights=contextlib.nullcontext, oracle: OracleValues | None = None) -> int:
        """Score what has arrived since the last call; returns the number of rollouts scored.
        `skipped_versions`: critic versions the caller could not load (logged with the figures). `weights`: a
        context in which `critic` holds the weights of `critic_version` (colocated: the published average).
        `oracle`: `critic` is the policy, and the oracle's values are written instead of a critic's."""
        with self.timers.time("io"):
            segments = self.pending + self.reader.poll(max_segments=max_segments)
        if not segments:
            return 0
        if self.lockstep:
            self.pending = segments
            if critic_version < self.needed_version():
                return 0  # lockstep: wait for the critic trained on the previous batch's targets
            self.pending = []
        started = time.time()
        rows = [row for segment in segments for row in to_rows(segment.table)]
        was_training = critic.training
        critic.eval()
        out = []
        with self.timers.time("compute"), self.ctx.cores.computing(), weights():  # lends its core while waiting
            for begin in range(0, len(rows), self.cfg.critic.score_batch_rollouts):
                chunk = rows[begin: begin + self.cfg.critic.score_batch_rollouts]
                if oracle is not None:
                    now = time.time()
                    out += [{"rollout_id": row["rollout_id"], "critic_version": critic_version, "values": values,
                             "cut": False, "valued_tokens": len(row["token_ids"]), "bootstrap_value": 0.0,
                             "token_digest": token_digest(row["token_ids"]), "scored_at": now}
                            for row, values in zip(chunk, oracle(critic, chunk))]
                    continue
                inputs = CriticInputs.of(chunk, self.tokenizer, self.cfg.critic, self.ctx.device)
                values = inputs.values(critic, self.cfg.critic.loss).float().cpu()
                now = time.time()
                for b, row in enumerate(chunk):
                    out.append({"rollout_id": row["rollout_id"], "critic_version": critic_version,
                                "values": values[b, : len(row["token_ids"])].tolist(), "cut": inputs.cut[b],
                                "valued_tokens": inputs.valued_tokens[b],
                                "bootstrap_value": float(inputs.bootstrap[b]) if inputs.cut[b] else 0.0,
                                "token_digest": token_digest(row["token_ids"]), "scored_at": now})
        critic.train(was_training)
        scored = time.time() - started
        with self.timers.time("io"):
            self.writer.append(out)
            self.reader.commit()
        self.scored += len(rows)
        elapsed = time.time() - started
        tokens = sum(len(r["token_ids"]) for r in rows)
        cut = sum(bool(o["cut"]) for o in out)  # traces longer than critic.max_length: valued up to the cut only
        self.ctx.metrics.log(scored=len(rows), scored_total=self.scored, critic_version=critic_version,
                             cut_traces=cut, cut_fraction=cut / max(len(out), 1),
                             score_s=elapsed, states_per_s=tokens / max(elapsed, 1e-9),
                             forward_states_per_s=tokens / max(scored, 1e-9),
                             quarantined=self.reader.quarantined, skipped_newer=self.reader.skipped_newer,
                             skipped_critic_versions=skipped_versions, **self.timers.snapshot())
        return len(rows)


def main(run_dir: str, index: int = 0) -> None:
    from transformers import AutoTokenizer

    from prime_values.models import load_critic, lora

    ctx = RoleContext(run_dir, evaluator_name(index), "evaluator_device")
    timers = Timers()
    oracle = None
    if ctx.cfg.critic.oracle_samples:  # the oracle: the newest policy plays games on from every state
        from prime_values.models import load_policy

        tokenizer = AutoTokenizer.from_pretrained(ctx.run.weights("policy") / "0")
        oracle = OracleValues(ctx.cfg, make_task(**ctx.cfg.task), tokenizer, ctx.seed(index))
        critic = Adopter(ctx.run.weights("policy"),
                         lora.Adopting(functools.partial(load_policy, attention=ctx.attention), ctx.device))
    else:
        critic = Adopter(ctx.run.weights("critic"),  # LoRA: adapter in place
                         lora.Adopting(functools.partial(load_critic, attention=ctx.attention), ctx.device))
    with timers.time("wait"):
        critic.wait(timeout_s=600, stop=ctx.stopping)
    tokenizer = AutoTokenizer.from_pretrained(ctx.run.weights("policy") / "0")
    scorer = Scorer(ctx, tokenizer, consumer=evaluator_name(index), timers=timers, index=index)
    while not ctx.stopping():
        with timers.time("io"):
            critic.poll()  # adopt a newer critic version between scoring batches
        # the oracle's values are critic version 0 (no critic is trained); it plays with the adopted policy
        version = 0 if oracle is not None else critic.version
        if not scorer.score_pending(critic.value, version, skipped_versions=len(critic.skipped), oracle=oracle):
            ctx.doing("waiting for rollouts to score", note=f"critic v{critic.version}")
            with timers.time("wait"):
                ctx.wait()
        else:
            ctx.doing("scoring rollouts", note=f"critic v{critic.version}")
