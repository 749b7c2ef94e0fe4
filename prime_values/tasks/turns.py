"""The turn loop of the native multi-turn tasks (task=guess, task=tools): episodes whose policy turns are sampled in
one batched decode per round, and whose environment replies are appended as tokens the policy never trains on
(``policy_mask`` 0, logprob 0).

A task built on it (``TurnTask``) gives ``start(problem)``, an environment state with

    state.play(text | None) -> str    one policy turn (its text, None for a turn cut at max_new_tokens without
                                      its eos); returns the reply ('' when none follows)
    state.done, state.turns           the episode is over; the policy turns played
    state.reward                      the episode's reward once it is over
    state.copy()                      the same state, for an episode played on from it

and ``max_turns`` (rounds of play at most). The loop plays episodes from their prompts (``rollout``) or on from any
state before a policy token, mid-turn included (``continuations``: what the oracle critic samples).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prime_values.rollout import EnvRollout


@dataclass
class Episode:
    prompt_index: int  # into the problems (rollout) or the states (continuations)
    state: object  # the environment's state (the task's start(problem))
    token_ids: list[int]
    policy_mask: list[int]
    logprobs: list[float]
    replies: list[str] = field(default_factory=list)
    last_stop: str = "eos"
    done: bool = False
    partial: list[int] = field(default_factory=list)  # the tokens of a turn begun before play (continuations)


class TurnTask:
    """What task=guess and task=tools share: ``rollout``, ``continuations`` and the loop under them."""

    max_turns: int

    def start(self, problem):
        """The environment's state at the start of an episode of ``problem``."""
        raise NotImplementedError

    def finished(self, episode: Episode) -> EnvRollout:
        """The scored rollout of a finished episode."""
        stop = "length" if episode.last_stop == "length" else "env_done" if episode.state.turns > 1 else "eos"
        return EnvRollout(episode.prompt_index, episode.token_ids, episode.policy_mask, episode.logprobs,
                          float(episode.state.reward), stop, "\n".join(episode.replies), turns=episode.state.turns)

    def rollout(self, model, tokenizer, problems: list, num_samples: int, max_new_tokens: int, temperature: float,
                seed: int, batch_size: int | None = None) -> list[EnvRollout]:
        """``num_samples`` episodes per problem (grouped by problem), all turns of the live episodes sampled in one
        batched decode; ``max_new_tokens`` caps each policy turn, ``temperature <= 0`` decodes greedily."""
        episodes = []
        for i, p in enumerate(problems):
            prompt = tokenizer.encode(p.prompt, add_special_tokens=False)
            episodes += [Episode(i, self.start(p), list(prompt), [0] * len(prompt), [0.0] * len(prompt))
                         for _ in range(num_samples)]
        self._play(model, tokenizer, episodes, max_new_tokens, temperature, seed, batch_size)
        return [self.finished(e) for e in episodes]

    def continuations(self, model, tokenizer, starts: list[tuple[object, list[int], list[int]]], num_samples: int,
                      max_new_tokens: int, temperature: float, seed: int,
                      batch_size: int | None = None) -> list[list[EnvRollout]]:
        """``num_samples`` episodes played on from each state of ``starts``, all in one batched play: a state is
        ``(problem, token_ids, policy_mask)``, a prefix of a rollout of ``problem`` that ends before a policy token
        (mid-turn: the turn goes on from its first tokens). What a Monte-Carlo estimate of the policy's value of a
        state samples (the oracle critic, bench/critic_oracle.py)."""
        episodes = []
        for k, (problem, token_ids, policy_mask) in enumerate(starts):
            state, partial = self.replayed(tokenizer, problem, token_ids, policy_mask)
            episodes += [Episode(k, state.copy(), list(token_ids), list(policy_mask), [0.0] * len(token_ids),
                                 partial=list(partial)) for _ in range(num_samples)]
        self._play(model, tokenizer, episodes, max_new_tokens, temperature, seed, batch_size, by_length=True)
        out: list[list[EnvRollout]] = [[] for _ in starts]
        for e in episodes:
            out[e.prompt_index].append(self.finished(e))
        return out

    def replayed(self, tokenizer, problem, token_ids: list[int], policy_mask: list[int]):
        """The environment's state after a rollout prefix, and the tokens of the turn it is in the middle of."""
        eos = tokenizer.eos_token_id
        state, turn = self.start(problem), []
        for token, m in zip(token_ids, policy_mask):  # the turns played: each ends where the environment replies
            if m:
                turn.append(token)
            elif turn:
                ended = turn[-1] == eos
                state.play(tokenizer.decode(turn[:-1], skip_special_tokens=True) if ended else None)
                turn = []
        if state.done or (turn and turn[-1] == eos):
            raise ValueError("the state is not before a policy token of an episode still going: nothing to play")
        return state, turn

    def _play(self, model, tokenizer, episodes: list[Episode], max_new_tokens: int, temperature: float, seed: int,
              batch_size: int | None, by_length: bool = False) -> None:
        """Play every episode to its end: one batched decode per round of the live episodes' turns. `by_length`:
        each round's episodes are decoded shortest first, so a batch pads to lengths close to its own (the
        continuations of many states of different depths: about a fifth fewer tokens computed); off for `rollout`,
        whose episodes of one round have nearly one length, so a seed draws what it drew before."""
        from prime_values.models.sampling import sample

        eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
        limit = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        for round_ in range(self.max_turns):
            live = [e for e in episodes if not e.done]
            if not live:
                break
            groups: dict[int, list[Episode]] = {}  # by tokens still allowed this turn (a turn begun has fewer)
            for e in live:
                groups.setdefault(max_new_tokens - len(e.partial), []).append(e)
            for allowed, group in groups.items():
                if by_length:
                    group.sort(key=lambda e: len(e.token_ids))  # stable: a state's samples stay together
                if allowed <= 0:
                    completions = [None] * len(group)
                else:
                    completions = sample(model, [e.token_ids for e in group], num_samples=1,
                                         max_new_tokens=allowed, temperature=temperature, eos_id=eos, pad_id=pad,
                                         seed=seed + 7919 * round_ + allowed, batch_size=batch_size)
                for e, c in zip(group, completions):
                    response = list(c.response_ids) if c is not None else []
                    e.token_ids += response
                    e.policy_mask += [1] * len(response)
                    e.logprobs += [float(x) for x in c.logprobs] if c is not None else []
                    turn, e.partial = e.partial + response, []
                    ended = bool(turn) and turn[-1] == eos
                    e.last_stop = "eos" if ended else "length"
                    text = tokenizer.decode(turn, skip_special_tokens=True)
                    e.replies.append(text)
                    reply = e.state.play(text if ended else None)
                    env = tokenizer.encode(reply, add_special_tokens=False) if reply else []
                    # the model's positions end an episode too (the config checks keep the embedded model's in)
                    e.done = e.state.done or len(e.token_ids) + len(env) + max_new_tokens > limit
                    if not e.done:
                        e.token_ids += env
                        e.policy_mask += [0] * len(env)
                        e.logprobs += [0.0] * len(env)
