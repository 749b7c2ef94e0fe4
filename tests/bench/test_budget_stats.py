"""bench/budget_stats.py, the critic study protocol's statistics, on numbers worked by hand in the comments: the
endpoint, paired t-intervals (and the t table), the bootstrap's floor of 8 pairs, the verdict at a margin, the seeds a
margin needs, warm starts charged in the curve and its AUC, interpolated crossings, and the paired table with its
A/A row."""

from __future__ import annotations

import math

import pytest

from bench import budget_stats as bs, common

CURVE = [(0.0, 0.5), (10.0, 0.6), (20.0, 0.8), (30.0, 0.7)]


def test_endpoint_is_the_mean_of_the_last_five_evaluations():
    # (0.6 + 0.7 + 0.8 + 0.9 + 0.7) / 5 = 3.7 / 5 = 0.74; the start (0.3) and 0.5 are not in it
    assert bs.endpoint([0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.7]) == pytest.approx(0.74)
    # five evaluations are the start and four outcomes: no endpoint
    assert bs.endpoint([0.3, 0.5, 0.6, 0.7, 0.8]) is None
    assert bs.endpoint([0.3, 0.5, 0.6], k=2) == pytest.approx(0.55)


def test_t_interval_by_hand():
    # arith_chain, gae_g1 − mean_g1 final accuracy: 0.716 − 0.706 = 0.010, 0.714 − 0.708 = 0.006. Mean 0.008,
    # sd = |0.010 − 0.006| / √2 = 0.0028284, half = t_{0.975,1} · sd / √2 = 12.7062 · 0.002 = 0.025412
    mean, lo, hi = bs.t_interval([0.010, 0.006])
    assert (mean, lo, hi) == pytest.approx((0.008, 0.008 - 0.025412, 0.008 + 0.025412), abs=1e-6)
    # SmolLM2, batch mean − privileged critic gains: −0.005, 0.000, +0.095. Mean 0.030; deviations −0.035, −0.030,
    # +0.065, squares 0.001225 + 0.0009 + 0.004225 = 0.00635, / 2 = 0.003175, sd 0.056347; se = sd / √3 = 0.032532;
    # half = 4.3027 · 0.032532 = 0.139975: [−0.110, +0.170] (the "bootstrap" said [−0.005, +0.095], the min-max)
    mean, lo, hi = bs.t_interval([-0.005, 0.0, 0.095])
    assert (mean, lo, hi) == pytest.approx((0.030, -0.109975, 0.169975), abs=1e-5)
    # 1, 2, 3, 4: mean 2.5, sd √((2.25 + 0.25 + 0.25 + 2.25) / 3) = √(5/3) = 1.290994, se 0.645497,
    # t_{0.975,3} = 3.1824: half 2.054231
    assert bs.t_interval([1.0, 2.0, 3.0, 4.0]) == pytest.approx((2.5, 0.445769, 4.554231), abs=1e-5)
    with pytest.raises(ValueError, match="at least 2 pairs"):
        bs.t_interval([0.1])


def _t_cdf(t: float, df: int, steps: int = 4000) -> float:
    """0.5 + ∫_0^t of the Student t density (Simpson's rule)."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    f = [c * (1 + (t * i / steps) ** 2 / df) ** (-(df + 1) / 2) for i in range(steps + 1)]
    return 0.5 + t / steps / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))


def test_t_table_matches_the_t_distribution():
    for p, row in bs.T_TABLE.items():
        assert len(row) == 30
        for df, t in enumerate(row, start=1):
            assert _t_cdf(t, df) == pytest.approx(p, abs=2e-5), (p, df, t)
    # beyond 30 df the seeds' formula takes the Cornish-Fisher expansion: at 30 it is the table's to 1e-4
    for p in bs.T_TABLE:
        assert bs._t_large_df(p, 30) == pytest.approx(bs.T_TABLE[p][29], abs=1e-4)
    if bs._scipy_stats is None:
        assert bs.t_quantile(0.975, 2) == 4.3027
        with pytest.raises(ValueError, match="beyond the table"):
            bs.t_quantile(0.975, 31)


def test_paired_bootstrap_refuses_fewer_than_eight_pairs():
    with pytest.raises(ValueError, match="3 pairs: a percentile bootstrap needs at least 8"):
        bs.paired_bootstrap([0.010, 0.006, 0.02])
    diffs = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    mean, lo, hi = bs.paired_bootstrap(diffs)
    assert mean == 4.5 and 1.0 <= lo < 4.5 < hi <= 8.0
    # the standard error of the mean is sd / √8 = 2.449 / 2.828 = 0.866: the percentile interval is about
    # ±1.96 · 0.866 · √(7/8) = ±1.59 (the bootstrap's plug-in variance), far inside the pairs' range 1..8
    assert 2.4 < lo < 3.4 and 5.6 < hi < 6.6
    assert bs.paired_bootstrap(diffs) == bs.paired_bootstrap(diffs)  # deterministic


def test_verdict_against_the_margin():
    assert bs.verdict(-0.010, 0.015) == "equivalent"  # the whole interval inside ±0.02
    assert bs.verdict(0.005, 0.015) == "equivalent"   # excludes 0 but smaller than any difference that matters
    assert bs.verdict(0.010, 0.050) == "better"
    assert bs.verdict(-0.050, -0.010) == "worse"
    assert bs.verdict(-0.030, 0.010) == "inconclusive"
    assert bs.verdict(-0.110, 0.170) == "inconclusive"
    assert bs.verdict(100.0, 200.0, None, higher_is_better=False) == "worse"  # tokens: more is worse
    assert bs.verdict(-0.010, 0.010, None) == "inconclusive"  # no margin, no equivalence


def test_seeds_needed_by_hand():
    # n ≥ ((t_{0.975,n−1} + t_{0.8,n−1}) · sd / m)². sd 0.018, m 0.02 (sd/m = 0.9):
    # n = 8: (2.3646 + 0.8960) · 0.9 = 2.93454, squared 8.6115 > 8; n = 9: (2.3060 + 0.8889) · 0.9 = 2.87541,
    # squared 8.2680 <= 9: 9 seeds
    assert bs.seeds_needed(0.018) == 9
    # sd 0.027 (1.35): n = 16: 2.9976 · 1.35 = 4.04676, 16.376 > 16; n = 17: 2.9846 · 1.35 = 4.02921, 16.2345 <= 17
    assert bs.seeds_needed(0.027) == 17
    # sd 0.05 (2.5), beyond the table: n = 51 (df 50): (2.00856 + 0.84887) · 2.5 = 7.14358, 51.03 > 51;
    # n = 52 (df 51): (2.00758 + 0.84873) · 2.5 = 7.14078, 50.99 <= 52
    assert bs.seeds_needed(0.05) == 52
    assert bs.seeds_needed(0.0) == 2 and bs.seeds_needed(None) is None
    # equivalence at a true difference of 0 takes t_{0.9}: n = 10 (df 9): (2.2622 + 1.3830) · 0.9 = 3.28068,
    # 10.763 > 10; n = 11 (df 10): (2.2281 + 1.3722) · 0.9 = 3.24027, 10.499 <= 11: 11 seeds
    assert bs.seeds_needed(0.018, power=0.9) == 11


def test_pooled_sd():
    # (3 pairs, sd 0.01) and (2 pairs, sd 0.02): √((2 · 0.0001 + 1 · 0.0004) / 3) = √0.0002 = 0.014142, 3 df
    s, df = bs.pooled_sd([{"pairs": 3, "sd": 0.01}, {"pairs": 2, "sd": 0.02}, {"pairs": 1, "sd": None}])
    assert s == pytest.approx(0.0141421, abs=1e-6) and df == 3


def test_warm_start_is_charged_in_the_curve_and_the_auc():
    # a critic cell: warm start 100 tokens, so its step-0 evaluation stands at x = 100 (as records have it)
    critic = {"curve": [[0, 0.4, 100], [10, 0.6, 300], [20, 0.8, 500]], "critic_pretrain_generated_tokens": 100}
    free = {"curve": [[0, 0.4, 0], [10, 0.6, 200], [20, 0.8, 400]]}
    assert bs.tokens_curve(critic) == [(0.0, 0.4), (100, 0.4), (300, 0.6), (500, 0.8)]
    assert bs.tokens_curve(free) == [(0, 0.4), (200, 0.6), (400, 0.8)]
    # AUC over 0..400: critic 100 · 0.4 = 40, 200 · (0.4 + 0.6) / 2 = 100, to 400 (0.7 there) 100 · 0.65 = 65:
    # 205 / 400 = 0.5125; free 200 · 0.5 = 100, 200 · 0.7 = 140: 240 / 400 = 0.6
    assert bs.auc_mean(bs.tokens_curve(critic), 400) == pytest.approx(0.5125)
    assert bs.auc_mean(bs.tokens_curve(free), 400) == pytest.approx(0.6)
    # read from the critic's own first x (uncharged) it would be (100 + 65) / 300 = 0.55: 0.0375 of flattery
    assert bs.mean_over([(100, 0.4), (300, 0.6), (500, 0.8)], 400) == pytest.approx(0.55)
    with pytest.raises(ValueError, match="charged curve"):
        bs.auc_mean([(100, 0.4), (300, 0.6)], 200)
    # tokens to 0.6: 300 against 200, the warm start's 100 tokens
    assert bs.crossing(bs.tokens_curve(critic), 0.6) - bs.crossing(bs.tokens_curve(free), 0.6) == pytest.approx(100)
    # a policy warm start of a cell's own (sampled) moves every x by its tokens
    own = {**free, "policy_pretrain_generated_tokens": 50}
    assert bs.tokens_curve(own) == [(0.0, 0.4), (50, 0.4), (250, 0.6), (450, 0.8)]
    assert bs.warm_start_tokens(critic) == 100 and bs.warm_start_tokens(own) == 50
    # CPU seconds from eval_costs [(step, wall s, CPU s)], the warm start's CPU seconds in them, from 0 too
    critic["eval_costs"] = [[0, 30.0, 60.0], [10, 40.0, 80.0], [20, 50.0, 100.0]]
    assert bs.resource_curve(critic, 1) == [(0.0, 0.4), (60.0, 0.4), (80.0, 0.6), (100.0, 0.8)]
    assert bs.resource_curve(free, 1) is None


def test_crossing_interpolates_on_the_first_segment_that_reaches_the_threshold():
    assert bs.crossing(CURVE, 0.5) == 0.0                  # already there at the first point
    assert bs.crossing(CURVE, 0.55) == pytest.approx(5.0)  # halfway from 0.5 to 0.6
    assert bs.crossing(CURVE, 0.75) == pytest.approx(17.5)  # 10 + (0.75 - 0.6) / 0.2 * 10
    assert bs.crossing(CURVE, 0.7) == pytest.approx(15.0)  # the first crossing, not the later fall to 0.7
    assert bs.crossing(CURVE, 0.81) is None


def test_value_at_and_mean_over_the_budget():
    assert bs.value_at(CURVE, 25.0) == pytest.approx(0.75)
    assert bs.value_at(CURVE, 31.0) is None
    # area 0..20: (10 * (0.5 + 0.6) / 2) + (10 * (0.6 + 0.8) / 2) = 5.5 + 7 = 12.5, over 20 tokens: 0.625
    assert bs.mean_over(CURVE, 20.0) == pytest.approx(0.625)
    # to 15: 5.5 + 5 * (0.6 + 0.7) / 2 = 8.75, over 15: 0.58333
    assert bs.mean_over(CURVE, 15.0) == pytest.approx(8.75 / 15)
    assert bs.mean_over(CURVE, 40.0) is None


def run(cell: str, seed: int, accs: list[float], warm: int = 0) -> dict:
    """A record: an evaluation every 10 steps, 100 tokens apart, the first at the critic's warm start."""
    return {"cell": cell, "ckpt": "0-abc", "seed": seed, "start_accuracy": accs[0], "final_accuracy": accs[-1],
            "curve": [[10 * i, a, warm + 100 * i] for i, a in enumerate(accs)],
            "critic_pretrain_generated_tokens": warm}


RUNS = [run("grpo_g8", 0, [0.5, 0.6, 0.6, 0.6, 0.6, 0.6]),    # endpoint 0.6
        run("grpo_g8", 1, [0.5, 0.6, 0.7, 0.7, 0.7, 0.7]),    # endpoint (0.6 + 4 · 0.7) / 5 = 0.68
        run("gae_g1", 0, [0.5, 0.7, 0.7, 0.7, 0.7, 0.7], 50),  # endpoint 0.7
        run("gae_g1", 1, [0.5, 0.7, 0.8, 0.8, 0.8, 0.9], 50),  # endpoint 4.0 / 5 = 0.8
        run("tether_g1", 0, [0.5, 0.7, 0.7, 0.7, 0.7, 0.72], 50),  # endpoint 3.52 / 5 = 0.704
        run("tether_g1", 1, [0.5, 0.7, 0.8, 0.8, 0.8, 0.78], 50),  # endpoint 3.88 / 5 = 0.776
        run("gae_g1", 7, [0.5, 0.1, 0.1, 0.1, 0.1, 0.1], 50)]     # no reference run at seed 7: not paired


def test_the_paired_table_pairs_by_seed_with_t_intervals_and_charged_warm_starts():
    # thresholds: the reference's start 0.5 plus 25/50/75/100% of its gain to its mean endpoint 0.64
    assert bs.thresholds(RUNS, "grpo_g8") == [0.535, 0.57, 0.605, 0.64]
    lines = bs.paired_table(RUNS, "grpo_g8", extra=(("tether_g1", "gae_g1", "A/A: tether_g1 − gae_g1"),))
    head, rows = lines[0], {ln.split(" | ")[0].strip("| "): [c.strip() for c in ln.strip("|").split("|")]
                            for ln in lines[2:] if ln.startswith("|")}
    assert head.count("tokens to") == 4 and "mean acc over tokens 0..500" in head  # X: grpo's last x, 500
    gae = rows["gae_g1"]
    assert gae[1] == "2"
    # endpoint: 0.7 − 0.6 = 0.10, 0.8 − 0.68 = 0.12; mean 0.11, sd 0.014142, half 12.7062 · 0.01 = 0.127062
    assert gae[2] == "+0.110 [-0.017, +0.237]" and gae[3] == "inconclusive" and gae[4] == "0.014"
    # final: 0.7 − 0.6 = 0.1, 0.9 − 0.7 = 0.2
    assert gae[6].startswith("+0.150 [")
    # AUC over 0..500. grpo seed 0: 100 · 0.55 + 400 · 0.6 = 295, / 500 = 0.59; gae seed 0 (flat at 0.5 to its
    # warm start's 50 tokens): 50 · 0.5 + 100 · 0.6 + 350 · 0.7 = 330, 0.66: +0.07. grpo seed 1: 55 + 65 + 300 · 0.7
    # = 330, 0.66; gae seed 1: 25 + 60 + 100 · 0.75 + 200 · 0.8 + 50 · (0.8 + 0.85) / 2 = 361.25, 0.7225: +0.0625.
    # Mean 0.06625, sd 0.0053033, half 12.7062 · 0.00375 = 0.047648: [+0.019, +0.114], better
    assert gae[7] == "+0.066 [+0.019, +0.114]" and gae[8] == "better"
    assert gae[9] == "50 / 0"
    # tokens to 0.57: grpo at 0 + 0.07 / 0.1 · 100 = 70; gae at 50 + 0.07 / 0.2 · 100 = 85: +15 on both seeds
    assert gae[11] == "+15 [+15, +15]"
    # A/A: tether − gae, endpoint 0.704 − 0.7 = +0.004, 0.776 − 0.8 = −0.024: mean −0.010, sd 0.019799,
    # half 12.7062 · 0.014 = 0.177887
    aa = rows["A/A: tether_g1 − gae_g1"]
    assert aa[2] == "-0.010 [-0.188, +0.168]" and aa[3] == "inconclusive" and aa[9] == "50 / 50"
    floor = next(ln for ln in lines if ln.startswith("- A/A"))
    # final: 0.72 − 0.7 = +0.02, 0.78 − 0.9 = −0.12: the largest |difference| of one configuration with itself
    assert "endpoint +0.004, -0.024; final accuracy +0.020, -0.120" in floor and floor.endswith("0.120.")
    assert any(ln.startswith("- SD of the paired endpoint differences, pooled") for ln in lines)


def test_the_aa_floor_is_reported_like_any_other_difference():
    """Two names of one configuration go through `compare` as any pair of cells: their verdict is a false positive
    unless 'equivalent' or 'inconclusive'."""
    c = bs.compare([-0.006, -0.038])  # arith_chain tether_g1 − gae_g1, final accuracy
    # mean −0.022, sd 0.032 / √2 = 0.022627, half 12.7062 · 0.016 = 0.203299
    assert c["mean"] == pytest.approx(-0.022) and c["lo"] == pytest.approx(-0.225299, abs=1e-5)
    assert c["verdict"] == "inconclusive" and c["pairs"] == 2
    one = bs.compare([0.01, None])
    assert one["lo"] is None and bs.fmt(one, "+.3f") == "+0.010 (one pair) (1 unpaired)"


def test_equal_budget_names_unstamped_records_and_finds_the_aa_pair(tmp_path):
    from bench import equal_budget as eb

    assert eb.aa_pairs({"gae_g1", "tether_g1", "tether_g1_policy.lr2e-4", "grpo_g8", "tether_g16", "gae_g16"}) == [
        ("tether_g1", "gae_g1", "A/A: tether_g1 − gae_g1")]  # the lr variant has no gae twin; G = 16 has a group mean
    assert eb.aa_pairs({"mean_g1", "mean_g1_seed_offset1000", "gae_g1_seed_offset7"}) == [
        ("mean_g1_seed_offset1000", "mean_g1", "A/A: mean_g1_seed_offset1000 − mean_g1 (other RL seeds)")]
    old = {**RUNS[0], "checkpoint_sha": "abc"}
    new = {**old, "commit": "5e31f64", "date": "2026-12-06", "cpu": "AMD EPYC", "cpu_flags": ["avx2"]}
    assert bs.unstamped([old, new]) == {"commit": 1, "date": 1, "cpu": 1, "cpu_flags": 1}
    assert bs.unstamped([new]) == {}
    line = eb.stamps_line([old, new], tmp_path)
    assert line.startswith("2 records **unstamped**: they lack commit (1), date (1), cpu (1), cpu_flags (1)")
    assert "commits 5e31f64" in line and "not kept for 0-abc" in line
    stamp = common.stamp(date="2026-12-01")
    assert stamp["commit"] and isinstance(stamp["commit_dirty"], bool) and stamp["cpu"]
    assert stamp["date"] == "2026-12-01"  # a record's own date (its run's end) wins over today's
    assert stamp["cpu_flags"] is None or stamp["cpu_flags"] == sorted(stamp["cpu_flags"])
    assert all(f.startswith(("avx", "amx")) for f in stamp["cpu_flags"] or ())


def test_the_committed_grids_restate_from_their_records():
    """`python -m bench.equal_budget --restate` from the committed records: the arith_chain checkpoint whose base was
    not kept (its two seeds cannot be continued, so these figures stay) with its A/A pair."""
    from bench import equal_budget as eb

    text = eb.restate()
    chain = text.split("### Checkpoint 0-9d4f8fbd6f6a")[1].split("##")[0]
    assert "20 records **unstamped**" in chain and "not kept for 0-9d4f8fbd6f6a" in chain
    # tether_g1 − gae_g1 final accuracy per seed: 0.710 − 0.716 = −0.006, 0.676 − 0.714 = −0.038
    assert "A/A: tether_g1 − gae_g1 per seed: endpoint -0.004, -0.022; final accuracy -0.006, -0.038" in chain
    # gae_g1 − mean_g1 final accuracy: +0.008 [−0.017, +0.033] (test_t_interval_by_hand)
    row = next(ln for ln in chain.splitlines() if ln.startswith("| gae_g1 − mean_g1"))
    assert "| +0.008 [-0.017, +0.033] |" in row
    assert "Kept bases of arith_chain without runs: 0-8753c3bd4f5f." in text
    assert "+0.030 [-0.110, +0.170] (-0.005, +0.000, +0.095) | inconclusive" in text  # SmolLM2, batch mean − critic
