"""The critic's view of a rollout, shared by the value evaluator (scoring), the value trainer and the warm start
(training): library code the roles use (docs/design.md §6), built on algo and models; the right-padding helpers
(`padded`, `attention_mask`) serve the policy trainer and the orchestrator too.

The privileged context is folded in as a text block before the whole trace, or between the prompt and the
response (critic.placement); the trace's token ids are kept verbatim, so the policy tokens are the same tokens
in both layouts and values map back exactly (`algo.privileged`)."""

from __future__ import annotations

import torch

from prime_values import dist
from prime_values.algo.gae import explained_variance, gae
from prime_values.algo.losses import value_loss, values_from_head
from prime_values.algo.privileged import batch_values_to_policy_layout, critic_layout, truncate_for_critic


class CriticInputs:
    """A right-padded critic batch built from rollout rows (dicts with token_ids, policy_mask, privileged)."""

    def __init__(self, rows: list[dict], tokenizer, template: str, privileged: bool, max_length: int,
                 device: str = "cpu", placement: str = "start"):
        pad_id = tokenizer.pad_token_id
        sequences, prefix_lens, self.cut, self.valued_tokens = [], [], [], []
        for row in rows:
            prefix = tokenizer.encode(template.format(privileged=row["privileged"]), add_special_tokens=False) \
                if privileged else []
            ids, _ = critic_layout(list(row["token_ids"]), list(row["policy_mask"]), prefix, placement)
            ids, cut = truncate_for_critic(ids, max_length)
            sequences.append(ids)
            prefix_lens.append(len(prefix))
            self.cut.append(cut)
            self.valued_tokens.append(len(ids) - len(prefix) if cut else len(row["token_ids"]))
        length = max(map(len, sequences))
        trace_length = max(len(row["token_ids"]) for row in rows)
        self.input_ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
        self.attention_mask = torch.zeros((len(rows), length), dtype=torch.long)
        self.policy_mask = torch.zeros((len(rows), trace_length), dtype=torch.bool)
        for b, (ids, row) in enumerate(zip(sequences, rows)):
            self.input_ids[b, : len(ids)] = torch.tensor(ids)
            self.attention_mask[b, : len(ids)] = 1
            self.policy_mask[b, : len(row["policy_mask"])] = torch.tensor(list(row["policy_mask"])) > 0
            # a cut trace keeps the tokens inside the critic's context: j < len(ids) - prefix; the state after
            # the last of them (position len(ids) - 1) is V(s_cut), the bootstrap value
            self.policy_mask[b, self.valued_tokens[b]:] = False
        self.prefix_lens = torch.tensor(prefix_lens)
        self.input_ids, self.attention_mask = self.input_ids.to(device), self.attention_mask.to(device)
        self.policy_mask, self.prefix_lens = self.policy_mask.to(device), self.prefix_lens.to(device)

    @classmethod
    def of(cls, rows: list[dict], tokenizer, ccfg, device: str = "cpu") -> "CriticInputs":
        """The batch as the `critic` config lays it out (template, privileged, max_length, placement)."""
        return cls(rows, tokenizer, ccfg.template, ccfg.privileged, ccfg.max_length, device, ccfg.placement)

    def values(self, critic, head: str = "mse") -> torch.Tensor:
        """[B, T] values in the policy's layout (0 where the policy did not sample the token). `head` is
        critic.loss: with 'bce' the head's logits become probabilities; `head=None` returns the raw output."""
        from prime_values.models import critic_values

        critic_out = critic_values(critic, self.input_ids, self.attention_mask)  # [B, L]
        last = self.attention_mask.sum(dim=1) - 1
        self.raw_bootstrap = critic_out[torch.arange(len(last)), last]  # the head's V(s_cut): meaningful where cut
        self.bootstrap = self.raw_bootstrap if head is None else values_from_head(self.raw_bootstrap, head)
        raw = batch_values_to_policy_layout(critic_out, self.prefix_lens, self.policy_mask)
        return raw if head is None else torch.where(self.policy_mask, values_from_head(raw, head), raw)


def padded(rows: list[dict], key: str, dtype: torch.dtype, length: int | None = None, fill=0) -> torch.Tensor:
    """Right-pad a list column of rows into a [B, T] tensor (`fill` beyond each row's length)."""
    length = length or max(len(row[key]) for row in rows)
    out = torch.full((len(rows), length), fill, dtype=dtype)
    for b, row in enumerate(rows):
        values = row[key]
        if len(values):
            out[b, : len(values)] = torch.as_tensor(list(values), dtype=dtype)
    return out


def attention_mask(rows: list[dict]) -> torch.Tensor:
    """[B, T] 1 on each row's tokens, 0 on the right padding."""
    lengths = torch.tensor([len(row["token_ids"]) for row in rows])
    return (torch.arange(int(lengths.max()))[None, :] < lengths[:, None]).long()


def value_targets(rows: list[dict], inputs: CriticInputs, values: torch.Tensor, cfg) -> torch.Tensor:
    """[B, T] value targets of `rows` for the critic whose `values` (policy layout, after the head) `inputs` holds.

    advantage.lambda_value = 1: the stored targets (Monte-Carlo returns, or V(s_cut) for a cut trace). Below 1:
    the λ-returns recomputed from these values with the same ends as the orchestrator's (`score_group`): a trace
    the critic's context cut bootstraps with this critic's V(s_cut) (`inputs.raw_bootstrap`) instead of taking the
    reward, which lies beyond the cut. Call after `inputs.values(...)` (it sets `inputs.raw_bootstrap`)."""
    adv = cfg.advantage
    device = values.device
    if adv.lambda_value >= 1:
        return padded(rows, "value_targets", torch.float32, length=values.shape[1]).to(device)
    rewards = torch.tensor([r["reward"] for r in rows], dtype=torch.float32, device=device)
    bootstrap = values_from_head(inputs.raw_bootstrap.detach().float(), cfg.critic.loss)
    cut = torch.tensor(inputs.cut, dtype=torch.bool, device=device)
    _, targets = gae(rewards, values.detach(), inputs.policy_mask, adv.gamma, adv.lambda_value, bootstrap, cut)
    return targets


def critic_step(critic, optimizer, rows: list[dict], tokenizer, cfg, device: str) -> dict:
    """One critic optimizer step on replay rows (targets rows: token ids, mask, reward, values, value_targets).

    With advantage.lambda_value < 1 the stored targets mixed in the values of the critic that scored the
    rollout; they are recomputed here with the current critic's values of the same forward (`value_targets`:
    a cut trace bootstraps with V(s_cut), as the orchestrator's targets do), so old replay data does not pull the
    critic back toward its past self. With lambda_value = 1 they are Monte-Carlo returns."""
    ccfg = cfg.critic
    inputs = CriticInputs.of(rows, tokenizer, ccfg, device)
    raw = inputs.values(critic, head=None)
    values = values_from_head(raw, ccfg.loss).where(inputs.policy_mask, torch.zeros_like(raw))
    targets = value_targets(rows, inputs, values, cfg)
    clip = {}
    if ccfg.value_clip > 0 and "values" in rows[0]:  # pretraining rows were never scored: nothing to clip to
        old = padded(rows, "values", torch.float32, length=values.shape[1]).to(device)
        clip = {"old_values": old, "clip_range": ccfg.value_clip}
    loss, stats = value_loss(raw, targets, inputs.policy_mask, kind=ccfg.loss, with_stats=True, **clip)
    optimizer.zero_grad(set_to_none=True)
    tokens = inputs.policy_mask.sum().item()  # with several processes (prime_values.dist): this rank's share
    (loss * dist.loss_scale(tokens)).backward()  # the single-process gradient of the batch's token mean
    if ccfg.max_grad_norm > 0:
        dist.clip_grad_norm(critic.parameters(), ccfg.max_grad_norm)
    optimizer.step()
    return dist.token_mean({"value_loss": loss.item(), "value_clip_fraction": stats["clip_fraction"],
            "train_explained_variance": explained_variance(values.detach(), targets, inputs.policy_mask),
            "value_mean": values.detach()[inputs.policy_mask].mean().item(),
            "target_mean": targets[inputs.policy_mask].mean().item()}, tokens)
