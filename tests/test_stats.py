"""Intervals and paired tests against hand-computed values, ties, all-pass and all-fail."""
from __future__ import annotations

import math

import pytest

from flows.stats import bootstrap_mean, interval, paired, sign_test_p, wilson


def test_wilson_matches_hand_computed_values():
    # 5/10: centre (0.5 + z^2/20) / (1 + z^2/10) = 0.5; half-width z*sqrt(0.025 + z^2/400) / (1 + z^2/10)
    z2 = 1.959963984540054 ** 2
    half = math.sqrt(z2) * math.sqrt(0.025 + z2 / 400) / (1 + z2 / 10)
    assert wilson(5, 10) == pytest.approx((0.5 - half, 0.5 + half))
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    # the edges stay inside [0, 1] and are not degenerate (unlike the normal approximation)
    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    assert wilson(0, 0) == (0.0, 0.0)
    lo, hi = wilson(82, 164)
    assert lo < 0.5 < hi and hi - lo == pytest.approx(0.1513, abs=1e-3)  # about +-7.6 points at n=164


def test_exact_mcnemar_sign_test():
    assert sign_test_p(5, 0) == pytest.approx(2 / 32)
    assert sign_test_p(0, 5) == pytest.approx(2 / 32)
    assert sign_test_p(1, 9) == pytest.approx(2 * (1 + 10) / 1024)
    assert sign_test_p(3, 3) == 1.0  # a tie
    assert sign_test_p(0, 0) == 1.0  # no discordant task: no evidence either way


def test_paired_counts_difference_and_verdict():
    a = [True] * 10 + [False] * 10
    b = [True] * 4 + [False] * 6 + [True] * 1 + [False] * 9  # A fixes 6 that B does not, B fixes 1 that A does not
    p = paired(a, b)
    assert (p.n, p.a_passed, p.b_passed, p.only_a, p.only_b) == (20, 10, 5, 6, 1)
    assert p.diff == pytest.approx(0.25)
    assert p.low < p.diff < p.high and -1 <= p.low and p.high <= 1
    assert p.p_value == pytest.approx(2 * (1 + 7) / 128)  # 0.125: not significant at 5%
    assert p.verdict("reflection", "single_shot").startswith("no significant difference")
    # swapping the runs mirrors the interval
    q = paired(b, a)
    assert (q.diff, q.low, q.high) == pytest.approx((-p.diff, -p.high, -p.low))
    strong = paired([True] * 30 + [False] * 10, [False] * 30 + [False] * 10)
    assert strong.p_value < 1e-6 and strong.verdict("A", "B").startswith("A beats B by 75.0 points")
    # the loser named first: the verdict still speaks from the winner's side, interval and counts included
    mirrored = paired([False] * 30 + [False] * 10, [True] * 30 + [False] * 10).verdict("A", "B")
    assert mirrored.startswith("B beats A by 75.0 points (95% CI +") and "30 vs 0 tasks" in mirrored


@pytest.mark.parametrize("value", [True, False])
def test_paired_all_pass_and_all_fail_are_ties(value):
    p = paired([value] * 12, [value] * 12)
    assert p.diff == 0 and p.only_a == p.only_b == 0 and p.p_value == 1.0
    assert p.low <= 0 <= p.high
    assert "no significant difference" in p.verdict()


def test_interval_picks_wilson_for_0_1_and_bootstrap_otherwise():
    ci, method = interval([1, 0, 1, 1])
    assert method == "wilson" and ci == wilson(3, 4)
    ci, method = interval([0.5, 1.0, 0.0, 0.5])
    assert method == "bootstrap" and ci[0] <= 0.5 <= ci[1]
    assert bootstrap_mean([0.25] * 10) == (0.25, 0.25)  # no spread, no width
    assert bootstrap_mean([0.0, 1.0] * 20, seed=1) == bootstrap_mean([0.0, 1.0] * 20, seed=1)  # reproducible
