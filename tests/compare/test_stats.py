"""gtpo.compare.stats against values worked out by hand (and the t table of any statistics textbook)."""

from __future__ import annotations

import math

import pytest

from gtpo.compare import stats


def test_t_quantile_matches_the_textbook_table_and_tends_to_the_normal():
    assert stats.t_quantile_975(1) == 12.706
    assert stats.t_quantile_975(2) == 4.303
    assert stats.t_quantile_975(30) == 2.042
    assert stats.t_quantile_975(60) == pytest.approx(2.000, abs=0.002)  # table: 2.000
    assert stats.t_quantile_975(120) == pytest.approx(1.980, abs=0.002)  # table: 1.980
    with pytest.raises(ValueError, match="degree of freedom"):
        stats.t_quantile_975(0)


def test_mean_interval_of_three_values_is_mean_plus_minus_t2_times_s_over_root3():
    # 1, 2, 3: mean 2, s^2 = (1 + 0 + 1) / 2 = 1, half-width = 4.303 * 1 / sqrt(3) = 2.48434...
    interval = stats.mean_interval([1.0, 2.0, 3.0])
    assert interval.mean == 2.0 and interval.n == 3
    assert interval.high - interval.mean == pytest.approx(4.303 / math.sqrt(3))
    assert interval.low == pytest.approx(2.0 - 2.484338, abs=1e-6)
    assert interval.covers_zero is True


def test_mean_interval_of_identical_values_has_zero_width_and_one_value_has_none():
    same = stats.mean_interval([5.0, 5.0, 5.0, 5.0])
    assert (same.low, same.high) == (5.0, 5.0) and same.covers_zero is False
    one = stats.mean_interval([7.0])
    assert (one.mean, one.low, one.high, one.covers_zero) == (7.0, None, None, None)
    assert one.format() == "7.00 (n=1)"
    with pytest.raises(ValueError):
        stats.mean_interval([])


def test_paired_difference_uses_only_common_seeds_and_cancels_the_shared_seed_effect():
    # Seed effects 0, 10, 20 shared by both arms; a is b + 1 +- 0.5: differences 1.5, 0.5, 1.0.
    a = {0: 1.5, 1: 10.5, 2: 21.0, 3: 99.0}
    b = {0: 0.0, 1: 10.0, 2: 20.0}
    diff = stats.paired_difference(a, b)
    assert diff.n == 3 and diff.mean == pytest.approx(1.0)
    # s^2 = (0.25 + 0.25 + 0) / 2 = 0.25, s = 0.5, half = 4.303 * 0.5 / sqrt(3) = 1.242169
    assert diff.low == pytest.approx(1.0 - 1.242169, abs=1e-6)
    assert stats.verdict(diff, "a", "b") == "no detectable difference"
    # The unpaired intervals are wide (seed effects); paired, a clearer shift is detected.
    # Differences 2.0, 2.5, 1.5: s = 0.5, half = 4.303 * 0.5 / sqrt(3) = 1.242169, interval [0.76, 3.24].
    steps = {0: 2.0, 1: 2.5, 2: 1.5}
    shifted = stats.paired_difference({s: v + steps[s] for s, v in b.items()}, b)
    assert (shifted.low, shifted.high) == pytest.approx((2.0 - 1.242169, 2.0 + 1.242169), abs=1e-6)
    assert stats.verdict(shifted, "a", "b") == "a higher"
    assert stats.verdict(stats.paired_difference(b, {s: v + steps[s] for s, v in b.items()}), "a", "b") == "b higher"
    assert stats.paired_difference({0: 1.0}, {1: 1.0}) is None


def test_equal_differences_are_read_by_the_sign_test_not_a_zero_width_interval():
    """Study B at 2 seeds read "gtpo higher" from accuracy differences of exactly 1.25 and 1.25 (one more correct
    completion of 80 in each): s = 0 makes the t-interval [1.25, 1.25]. With s = 0 the reading is the exact sign
    test's: n equal-signed differences reject at 5% only when 2 * 0.5**n < 0.05, i.e. from n = 6 (0.03125) on;
    n = 5 gives 0.0625."""
    assert 2 * 0.5**5 >= 0.05 > 2 * 0.5**6
    for n in (2, 3, 5):
        diff = stats.paired_difference({s: 1.25 for s in range(n)}, {s: 0.0 for s in range(n)})
        assert (diff.low, diff.high) == (1.25, 1.25)
        assert stats.verdict(diff, "gtpo", "grpo") == (
            f"all {n} differences equal (s = 0): too few seeds to read (a sign test needs 6)"
        )
    # Rounding of a - b (0.4 - 0.1 = 0.30000000000000004, 0.7 - 0.4 = 0.29999999999999993) is no spread either.
    rounded = stats.paired_difference({0: 0.4, 1: 0.7}, {0: 0.1, 1: 0.4})
    assert 0 < rounded.high - rounded.low < 1e-9 and stats.verdict(rounded, "a", "b").startswith("all 2")
    six = stats.paired_difference({s: 0.0 for s in range(6)}, {s: 1.25 for s in range(6)})
    assert stats.verdict(six, "gtpo", "grpo") == "grpo higher"
    # Equal differences of 0 are no difference at any n; unequal ones are read by their interval as before.
    zero = stats.paired_difference({0: 3.0, 1: 4.0}, {0: 3.0, 1: 4.0})
    assert stats.verdict(zero, "gtpo", "grpo") == "no detectable difference"


def test_band_is_the_pointwise_interval_over_curves():
    means, lows, highs = stats.band([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]])
    assert means == [2.0, 3.0]
    # each column: s = 2, half = 4.303 * 2 / sqrt(3)
    half = 4.303 * 2 / math.sqrt(3)
    assert lows == pytest.approx([2.0 - half, 3.0 - half]) and highs == pytest.approx([2.0 + half, 3.0 + half])
    assert stats.band([[1.0, 2.0]]) == ([1.0, 2.0], [1.0, 2.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="same length"):
        stats.band([[1.0], [1.0, 2.0]])
