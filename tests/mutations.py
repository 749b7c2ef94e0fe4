"""Break the code on purpose, one change at a time, and see which named tests catch it.

    nice -n 10 python tests/mutations.py              # every mutation (~30-40 min on 2 shared cores)
    python tests/mutations.py --list                  # the mutations and the tests each one runs
    python tests/mutations.py --only sign-flip --only never-steps
    python tests/mutations.py --check                 # only check that every mutation still applies

Each mutation is a textual edit of one source file (the old text must occur exactly once, so a mutation that no
longer applies fails loudly instead of testing nothing). It is applied to a fresh copy of the working tree in a
temporary directory (the checkout itself is never edited) and its named tests run there with pytest.

What counts as a catch, honestly:
- every named test first runs once on an unmutated copy (the baseline); a test that does not pass there cannot
  catch anything (it is reported, and the run exits 3);
- a catch is a test that passed in the baseline and fails on the mutant within CATCH_LIMIT_S (5 minutes, its own
  duration as pytest measured it);
- a timeout is never a catch: neither the harness's (the mutant's tests ran past --timeout: nothing from that
  run counts) nor a test's own (a failure whose message is a subprocess.TimeoutExpired: a broken run that hung).

Exit status: 0 when every mutation was caught, 1 when some survived, 2 when one no longer applies, 3 when a named
test failed the baseline. docs/development.md ("Mutation checks") lists what each mutation is caught by.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CATCH_LIMIT_S = 300.0


@dataclass(frozen=True)
class Mutation:
    name: str
    role: str  # the role (or shared part) whose code it breaks
    promise: str  # what the mission promises and this breaks
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    own_checkpoint: bool = False  # it breaks the warm start: its tests make their own version 0 with the mutant


E2E_GRPO = "tests/e2e/test_pipeline.py::test_pipeline_grpo_lockstep_starts_no_critic"
E2E_TWO = "tests/e2e/test_pipeline.py::test_two_inference_workers_and_two_evaluators"
E2E_COLOCATED = "tests/e2e/test_pipeline.py::test_pipeline_with_critic[colocated]"
E2E_CPU = "tests/e2e/test_pipeline.py::test_pipeline_with_critic[cpu]"
STEP = "tests/roles/test_policy_step.py"
WIRING = "tests/roles/test_orchestrator_wiring.py"
DIRECTION = f"{STEP}::test_direction_gap_is_positive_after_a_correct_step_and_negative_after_a_flipped_one[clip]"

MUTATIONS = [
    # policy trainer (and the loss it calls)
    Mutation("sign-flip", "policy trainer", "the policy gradient ascends the advantage",
             "prime_values/algo/losses.py",
             "advantages = torch.where(mask, advantages.detach(), torch.zeros_like(advantages))",
             "advantages = torch.where(mask, -advantages.detach(), torch.zeros_like(advantages))",
             (DIRECTION, E2E_GRPO, E2E_TWO)),
    Mutation("negated-loss", "policy trainer", "the policy trainer descends its loss",
             "prime_values/roles/policy_trainer.py",
             "(loss * dist.loss_scale(tokens, total_tokens, world)).backward()",
             "(-loss * dist.loss_scale(tokens, total_tokens, world)).backward()",
             (DIRECTION, E2E_GRPO, E2E_TWO)),
    Mutation("never-steps", "policy trainer", "the policy trainer updates the policy",
             "prime_values/roles/policy_trainer.py",
             "    stats = optimizer_step(model, optimizer, accumulate, pcfg.max_grad_norm)",
             "    stats = accumulate()  # mutation: no optimizer step",
             (DIRECTION,)),
    Mutation("ratio-against-itself", "policy trainer", "the ratio compares the trainer's logprobs with the sampler's",
             "prime_values/roles/policy_trainer.py",
             "loss, stats = ppo_clip_loss(logprobs, sampling, advantages",
             "loss, stats = ppo_clip_loss(logprobs, logprobs.detach(), advantages",
             (f"{STEP}::test_ratio_compares_the_trainers_logprobs_with_the_sampling_ones",)),
    Mutation("trainer-ignores-temperature", "policy trainer", "the trainer's logprobs use the sampling temperature",
             "prime_values/roles/policy_trainer.py",
             "            logprobs = rollout_logprobs(model, micro, pad_id, device, cfg.inference.temperature,",
             "            logprobs = rollout_logprobs(model, micro, pad_id, device, 1.0,",
             (f"{STEP}::test_trainer_logprobs_use_the_sampling_temperature[0.7]",)),
    # orchestrator
    Mutation("targets-are-advantages", "orchestrator", "the critic is trained on value targets",
             "prime_values/roles/orchestrator.py",
             '"value_targets": group.targets[b, : len(r["token_ids"])].tolist()',
             '"value_targets": group.advantages[b, : len(r["token_ids"])].tolist()',
             (f"{WIRING}::test_targets_rows_carry_value_targets_not_advantages_and_each_rollouts_privileged_block",
              E2E_CPU)),
    Mutation("targets-drop-privileged", "orchestrator", "the critic trains with the privileged block",
             "prime_values/roles/orchestrator.py",
             '"privileged": r["privileged"], "reward": r["reward"], "values": v["values"]',
             '"privileged": "", "reward": r["reward"], "values": v["values"]',
             (f"{WIRING}::test_targets_rows_carry_value_targets_not_advantages_and_each_rollouts_privileged_block",)),
    Mutation("grpo-std-ignored", "orchestrator", "advantage.grpo_std normalises grpo's advantages",
             "prime_values/algo/estimators.py",
             "normalize_std=self.settings.grpo_std)",
             "normalize_std=False)",
             (f"{WIRING}::test_grpo_std_flag_reaches_the_advantages[True-expected1]",)),
    Mutation("whiten-every-token", "orchestrator", "whitening is over policy tokens only",
             "prime_values/roles/orchestrator.py",
             "        advantages = whiten(advantages, mask)",
             "        advantages = whiten(advantages, torch.ones_like(mask))",
             (f"{WIRING}::test_whitening_is_over_policy_tokens_only",)),
    Mutation("restart-forgets-pending", "orchestrator", "a restarted orchestrator keeps the groups it was holding",
             "prime_values/roles/orchestrator.py",
             "rollouts.commit(hold=rollouts_at.held([*join.held_rollout_ids(), *ready.rollout_ids()]))",
             "rollouts.commit()",
             (f"{WIRING}::test_a_restarted_orchestrator_keeps_the_groups_it_was_holding",)),
    Mutation("staleness-off-by-one", "orchestrator",
             "no batch trains on rollouts more than schedule.max_off_policy steps stale",
             "prime_values/roles/orchestrator.py",
             "(step - 1) - queue[0].policy_version > max_off_policy:",
             "(step - 1) - queue[0].policy_version > max_off_policy + 1:",
             ("tests/roles/test_role_parts.py::test_drop_stale_keeps_exactly_max_off_policy_and_drops_one_more",)),
    Mutation("gae-drops-reward", "orchestrator", "advantages carry the verifier's reward",
             "prime_values/algo/gae.py",
             "    carry = last_reward + gamma * next_value  # Z_T",
             "    carry = 0 * last_reward + gamma * next_value  # mutation: Z_T without the reward",
             ("tests/algo/test_gae.py::test_gae_hand_worked_skips_environment_tokens",)),
    # evaluator
    Mutation("evaluator-digest-of-another-rollout", "evaluator", "each values row is paired with its own rollout",
             "prime_values/roles/evaluator.py",
             '"token_digest": token_digest(row["token_ids"]), "scored_at": now})',  # the learnt critic's rows
             '"token_digest": token_digest(chunk[0]["token_ids"]), "scored_at": now})',
             (E2E_TWO,)),
    Mutation("evaluator-constant-values", "evaluator", "the values are the critic's predictions",
             "prime_values/roles/evaluator.py",
             "values = inputs.values(critic, self.cfg.critic.loss).float().cpu()",
             "values = inputs.values(critic, self.cfg.critic.loss).float().cpu() * 0 + 0.5",
             (E2E_CPU, E2E_COLOCATED)),
    # inference
    Mutation("inference-drops-privileged", "inference", "the critic sees the privileged context",
             "prime_values/roles/inference.py",
             '            "privileged": problem.privileged,',
             '            "privileged": "",',
             (E2E_CPU,)),
    # value trainer (and the critic step it calls)
    Mutation("critic-never-publishes", "value trainer", "the value trainer publishes new critic versions",
             "prime_values/roles/value_trainer.py",
             "                trainer.publish(replay_files(buffer), weights=average.swapped)",
             "                pass  # mutation: never publishes",
             (E2E_TWO,)),
    Mutation("critic-never-steps", "value trainer", "the value trainer trains the critic",
             "prime_values/critic_io.py",
             "    return optimizer_step(critic, optimizer, backward, ccfg.max_grad_norm)",
             "    return backward()  # mutation: no critic optimizer step",
             ("tests/roles/test_role_parts.py::test_critic_step_with_each_value_loss[mse-0.1-1.0]",)),
    Mutation("replay-age-unwired", "value trainer", "replay.max_age bounds the replay buffer",
             "prime_values/roles/value_trainer.py",
             "max_age=rcfg.max_age,",
             "max_age=0,",
             (E2E_TWO,)),
    Mutation("no-privileged-block", "value trainer", "the critic's input holds the privileged context",
             "prime_values/critic_io.py",
             "add_special_tokens=False) \\\n                if privileged else []",
             "add_special_tokens=False) \\\n                if privileged and False else []",
             ("tests/roles/test_role_parts.py::test_critic_inputs_put_the_answer_first_and_map_values_back",)),
    # warm start
    Mutation("warm-start-wrong-returns", "warm start", "the critic is pretrained on each rollout's own return",
             "prime_values/roles/warm_start.py",
             '    rewards = torch.tensor([r["reward"] for r in rows])',
             '    rewards = torch.tensor([r["reward"] for r in rows]).roll(1)  # mutation: another rollout\'s',
             (E2E_CPU,), own_checkpoint=True),
]


def copy_tree(dest: Path) -> None:
    """The working tree as git sees it (tracked files and untracked ones git does not ignore)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        src = REPO / name
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), dest / name)
        elif src.is_file():
            shutil.copy2(src, dest / name)


def apply(mutation: Mutation, tree: Path, dry_run: bool = False) -> None:
    path = tree / mutation.path
    text = path.read_text()
    count = text.count(mutation.old)
    if count != 1:
        raise LookupError(f"mutation {mutation.name}: its old text occurs {count} times in {mutation.path} "
                          f"(the code moved: update tests/mutations.py)")
    if not dry_run:
        path.write_text(text.replace(mutation.old, mutation.new))


@dataclass
class Outcome:
    status: str  # passed | failed | skipped
    seconds: float
    timeout: bool = False  # failed because a subprocess of the test timed out (a hung run)
    message: str = ""  # the failure's first line (what caught it)


def node_id(case: ET.Element, tree: Path) -> str:
    """pytest's node id of a junit testcase (classname 'tests.test_x' or 'tests.test_x.TestClass')."""
    parts = case.get("classname", "").split(".")
    for cut in range(len(parts), 0, -1):
        path = "/".join(parts[:cut]) + ".py"
        if (tree / path).exists():
            return "::".join([path, *parts[cut:], case.get("name", "")])
    return f"{case.get('classname')}::{case.get('name')}"


def run_tests(tree: Path, tests: tuple[str, ...], timeout_s: float, checkpoint: str | None
              ) -> tuple[dict[str, Outcome] | None, str, float]:
    """Each named test's outcome (None when the harness timed out: nothing of that run counts), the output's
    tail, the seconds taken."""
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled",
           # a broken run often hangs (a critic that never publishes stalls a gated run): give up sooner
           "PV_TEST_RUN_TIMEOUT": os.environ.get("PV_TEST_RUN_TIMEOUT", "180")}
    env.pop("PV_TEST_CHECKPOINT", None)
    env.pop("PV_TEST_FRESH_VERSION0", None)
    if checkpoint:
        env["PV_TEST_CHECKPOINT"] = checkpoint
    else:  # a mutation that breaks the warm start: its tests make version 0 with the mutant, not the committed one
        env["PV_TEST_FRESH_VERSION0"] = "1"
    report = tree / ".mutation-junit.xml"
    report.unlink(missing_ok=True)
    began = time.time()
    try:
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", "--tb=line",
                              "-m", "", f"--junitxml={report}", *tests], cwd=tree, env=env, capture_output=True,
                             text=True, timeout=timeout_s)
        text = out.stdout + out.stderr
    except subprocess.TimeoutExpired:
        return None, f"TIMEOUT after {timeout_s:.0f} s", time.time() - began
    if "ERROR collecting" in text or "error during collection" in text or not report.exists():
        raise RuntimeError(f"the tests did not even collect (a broken harness, not a catch):\n{text[-3000:]}")
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        problem = next((c for c in case if c.tag in ("failure", "error")), None)
        skipped = any(c.tag == "skipped" for c in case)
        detail = "" if problem is None else f"{problem.get('message', '')}\n{problem.text or ''}"
        outcomes[node_id(case, tree)] = Outcome(
            "failed" if problem is not None else "skipped" if skipped else "passed", float(case.get("time", 0)),
            timeout="TimeoutExpired" in detail, message=detail.strip().split("\n")[0][:160])
    return outcomes, text[-2000:], time.time() - began


def catches(baseline: dict[str, Outcome], mutant: dict[str, Outcome] | None) -> list[tuple[str, float, str]]:
    """(test, seconds, failure) of each honest catch: passed in the baseline, failed on the mutant, not by a
    timeout, in under CATCH_LIMIT_S."""
    if mutant is None:
        return []
    return [(test, o.seconds, o.message) for test, o in sorted(mutant.items())
            if o.status == "failed" and not o.timeout and o.seconds < CATCH_LIMIT_S
            and baseline.get(test, Outcome("missing", 0)).status == "passed"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], help="a mutation's name (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the mutations and their tests")
    parser.add_argument("--check", action="store_true", help="only check that every mutation still applies")
    parser.add_argument("--timeout", type=float, default=900, help="seconds for one mutant's (or the baseline's) "
                                                                   "tests before the harness gives up")
    parser.add_argument("--verbose", action="store_true", help="print each run's output tail")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    unknown = set(args.only) - {m.name for m in MUTATIONS}
    if unknown:
        parser.error(f"unknown mutation(s) {sorted(unknown)}; choose from {[m.name for m in MUTATIONS]}")
    if args.list:
        for m in chosen:
            print(f"{m.name:36} [{m.role}] {m.path}: breaks '{m.promise}'\n{'':36} runs {' '.join(m.tests)}")
        return 0
    problems = 0
    for m in chosen:
        try:
            apply(m, REPO, dry_run=True)
        except LookupError as error:
            print(error)
            problems += 1
    if args.check or problems:
        print(f"{len(chosen) - problems} of {len(chosen)} mutations apply")
        return 2 if problems else 0
    # the end-to-end tests' version 0 (the committed tests/data/version0), shared by every mutant's tests except
    # those of a mutation that breaks the warm start, which make their own
    sys.path.insert(0, str(REPO / "tests"))
    import e2e_helpers

    checkpoint = str(e2e_helpers.checkpoint())
    named = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
    with tempfile.TemporaryDirectory(prefix="pv-mutant-baseline-") as tmp:
        copy_tree(Path(tmp))
        baseline, tail, seconds = run_tests(Path(tmp), named, args.timeout * 2, checkpoint)
    if baseline is None:
        print(f"the unmutated tree's tests ran past {args.timeout * 2:.0f} s: nothing can be counted\n{tail}")
        return 3
    broken = [t for t in named if baseline.get(t, Outcome("missing", 0)).status != "passed"]
    print(f"baseline: {len(named) - len(broken)} of {len(named)} named tests pass unmutated [{seconds:.0f} s]"
          + "".join(f"\n  does not pass unmutated (cannot catch anything): {t}" for t in broken), flush=True)
    results = []
    for m in chosen:
        with tempfile.TemporaryDirectory(prefix=f"pv-mutant-{m.name}-") as tmp:
            tree = Path(tmp)
            copy_tree(tree)
            apply(m, tree)
            mutant, tail, seconds = run_tests(tree, m.tests, args.timeout, None if m.own_checkpoint else checkpoint)
        caught = catches(baseline, mutant)
        results.append((m, caught, mutant is None))
        verdict = ("caught by " + "".join(f"\n  {t} ({s:.0f} s): {why}" for t, s, why in caught) if caught else
                   "SURVIVED (harness timeout: not a catch)" if mutant is None else "SURVIVED (no honest catch)")
        print(f"{m.name}: {verdict} [{seconds:.0f} s]", flush=True)
        if args.verbose or not caught:
            print(tail, flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    print(f"\n{time.strftime('%Y-%m-%d')}, commit {commit}\n\n| mutation | role | breaks | caught by (seconds) |\n"
          "|---|---|---|---|")
    for m, caught, _ in results:
        by = "<br>".join(f"`{t.split('/')[-1]}` ({s:.0f})" for t, s, _ in caught) or "**nothing**"
        print(f"| {m.name} | {m.role} | {m.promise} | {by} |")
    if broken:
        return 3
    return 1 if any(not caught for _, caught, _ in results) else 0


if __name__ == "__main__":
    sys.exit(main())
