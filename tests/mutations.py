"""Break the code on purpose, one change at a time, and see which tests catch it.

    python tests/mutations.py                 # every mutation (~12-25 min on 2 cores; take the heavy lock)
    python tests/mutations.py --list          # the mutations and the tests each one runs
    python tests/mutations.py --only sign-flip --only never-steps

Each mutation is a textual edit of one source file (the old text must occur exactly once, so a mutation that no
longer applies fails loudly instead of testing nothing). It is applied to a fresh copy of the working tree in a
temporary directory (the checkout itself is never edited), the mutation's tests run there with pytest, and the
tests that failed are the ones that caught it. Exit status 1 when some mutation survived (no test failed), 2 when
one no longer applies. A mutation's tests: the fast tests that should catch it, and one or two end-to-end ones.
docs/development.md ("Mutation checks") lists what each mutation is caught by.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    promise: str  # what the mission promises and this breaks
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


E2E_GRPO = "tests/test_pipeline.py::test_pipeline_grpo_lockstep_starts_no_critic"
E2E_LEARN = "tests/test_pipeline.py::test_reward_rises_on_an_easy_configuration"
E2E_CRITIC = "tests/test_pipeline.py::test_pipeline_with_critic[colocated]"
E2E_TWO = "tests/test_pipeline.py::test_two_inference_workers_and_two_evaluators"

MUTATIONS = [
    Mutation("sign-flip", "the policy gradient ascends the advantage",
             "prime_values/algo/losses.py",
             "advantages = torch.where(mask, advantages.detach(), torch.zeros_like(advantages))",
             "advantages = torch.where(mask, -advantages.detach(), torch.zeros_like(advantages))",
             ("tests/test_losses.py", E2E_LEARN)),
    Mutation("never-steps", "the policy trainer updates the policy",
             "prime_values/roles/policy_trainer.py",
             "    return optimizer_step(model, optimizer, accumulate, pcfg.max_grad_norm)",
             "    return accumulate()  # mutation: no optimizer step",
             ("tests/test_role_parts.py", E2E_GRPO)),
    Mutation("no-privileged-block", "the critic sees the privileged context",
             "prime_values/critic_io.py",
             "add_special_tokens=False) \\\n                if privileged else []",
             "add_special_tokens=False) \\\n                if privileged and False else []",
             ("tests/test_role_parts.py", "tests/test_privileged.py")),
    Mutation("staleness-off-by-one", "no batch trains on rollouts more than schedule.max_off_policy steps stale",
             "prime_values/roles/orchestrator.py",
             "(step - 1) - queue[0][\"rollouts\"][0][\"policy_version\"] > max_off_policy:",
             "(step - 1) - queue[0][\"rollouts\"][0][\"policy_version\"] > max_off_policy + 1:",
             ("tests/test_role_parts.py", "tests/test_check.py", E2E_TWO)),
    Mutation("never-adopts-policy", "inference samples from the newest admissible policy version",
             "prime_values/roles/inference.py",
             "        with timers.time(\"io\"):\n            policy.poll()",
             "        with timers.time(\"io\"):\n            pass  # mutation: never adopts a newer version",
             ("tests/test_weights.py", E2E_GRPO)),
    Mutation("critic-never-publishes", "the value trainer publishes new critic versions",
             "prime_values/roles/value_trainer.py",
             "                trainer.publish(replay_files(buffer), weights=average.swapped)",
             "                pass  # mutation: never publishes",
             ("tests/test_role_parts.py", E2E_CRITIC)),
    Mutation("critic-never-steps", "the value trainer trains the critic",
             "prime_values/critic_io.py",
             "    optimizer.step()",
             "    pass  # mutation: no critic optimizer step",
             ("tests/test_role_parts.py", E2E_CRITIC)),
    Mutation("gae-drops-reward", "advantages carry the verifier's reward",
             "prime_values/algo/gae.py",
             "    carry = last_reward + gamma * next_value  # Z_T",
             "    carry = 0 * last_reward + gamma * next_value  # mutation: Z_T without the reward",
             ("tests/test_gae.py", "tests/test_role_parts.py")),
]


def copy_tree(dest: Path) -> None:
    """The working tree as git sees it (tracked files and untracked ones git does not ignore)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        src = REPO / name
        if src.is_file() and not src.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
        elif src.is_symlink():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(src), dest / name)


def apply(mutation: Mutation, tree: Path, dry_run: bool = False) -> None:
    path = tree / mutation.path
    text = path.read_text()
    count = text.count(mutation.old)
    if count != 1:
        raise LookupError(f"mutation {mutation.name}: its old text occurs {count} times in {mutation.path} "
                          f"(the code moved: update tests/mutations.py)")
    if not dry_run:
        path.write_text(text.replace(mutation.old, mutation.new))


def run_tests(tree: Path, tests: tuple[str, ...], timeout_s: float) -> tuple[list[str], str, float]:
    """The failed test ids, the output's tail, the seconds taken."""
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled",
           # a broken run usually hangs (a critic that never publishes stalls a gated run): give up sooner
           "PV_TEST_RUN_TIMEOUT": os.environ.get("PV_TEST_RUN_TIMEOUT", "180")}
    began = time.time()
    try:
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", "--tb=line",
                              "-m", "", *tests], cwd=tree, env=env, capture_output=True, text=True,
                             timeout=timeout_s)
        text = out.stdout + out.stderr
    except subprocess.TimeoutExpired as expired:
        text = (expired.stdout or b"").decode(errors="replace") if isinstance(expired.stdout, bytes) \
            else (expired.stdout or "")
        text += f"\nTIMEOUT after {timeout_s:.0f} s"
    if "ERROR collecting" in text or "error during collection" in text:
        raise RuntimeError(f"the mutated tree's tests did not even collect (a broken harness, not a catch):\n"
                           f"{text[-3000:]}")
    failed = sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.M)))
    if "TIMEOUT after" in text:
        failed.append("(timeout)")
    return failed, text[-2000:], time.time() - began


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", default=[], help="a mutation's name (repeatable)")
    parser.add_argument("--list", action="store_true", help="list the mutations and their tests")
    parser.add_argument("--check", action="store_true", help="only check that every mutation still applies")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per mutation's tests")
    parser.add_argument("--verbose", action="store_true", help="print each run's output tail")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    unknown = set(args.only) - {m.name for m in MUTATIONS}
    if unknown:
        parser.error(f"unknown mutation(s) {sorted(unknown)}; choose from {[m.name for m in MUTATIONS]}")
    if args.list:
        for m in chosen:
            print(f"{m.name:26} {m.path}: breaks '{m.promise}'\n{'':26} runs {' '.join(m.tests)}")
        return 0
    if args.check:
        problems = 0
        for m in chosen:
            try:
                apply(m, REPO, dry_run=True)
            except LookupError as error:
                print(error)
                problems += 1
        print(f"{len(chosen) - problems} of {len(chosen)} mutations apply")
        return 2 if problems else 0
    results = []
    # the session checkpoint of the end-to-end tests (policy/critic v0), made once from the unmutated tree and
    # shared by every mutant's tests (no mutation here touches the warm start)
    sys.path.insert(0, str(REPO / "tests"))
    import e2e_helpers

    os.environ["PV_TEST_CHECKPOINT"] = str(e2e_helpers.checkpoint())
    for m in chosen:
        with tempfile.TemporaryDirectory(prefix=f"pv-mutant-{m.name}-") as tmp:
            tree = Path(tmp)
            copy_tree(tree)
            try:
                apply(m, tree)
            except LookupError as error:
                print(error, flush=True)
                results.append((m, None, 0.0))
                continue
            failed, tail, seconds = run_tests(tree, m.tests, args.timeout)
        results.append((m, failed, seconds))
        verdict = f"caught by {', '.join(failed)}" if failed else "SURVIVED (no test failed)"
        print(f"{m.name}: {verdict} [{seconds:.0f} s]", flush=True)
        if args.verbose or not failed:
            print(tail, flush=True)
    print("\n| mutation | breaks | caught by |\n|---|---|---|")
    for m, failed, _ in results:
        caught = "does not apply" if failed is None else ", ".join(f"`{t}`" for t in failed) or "**nothing**"
        print(f"| {m.name} | {m.promise} | {caught} |")
    if any(failed is None for _, failed, _ in results):
        return 2
    return 1 if any(not failed for _, failed, _ in results) else 0


if __name__ == "__main__":
    sys.exit(main())
