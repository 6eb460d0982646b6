"""studies/tools/lockin_tokens.py's per-group pushes on a hand-built group (the study document's mechanism tables are
checked against the committed records in tests/test_lockin_page.py; this checks the arithmetic those tables rest on).

Invariant: the entropy part (A'_i - A_i) is the filter part (δ_i·A_i - A_i: what Eq. 6 removed) plus the γ part
(A'_i - δ_i·A_i: Eq. 7's shift), and the filter's flip compares the group's evidence on the opening (Σ A_i·w_i over its
tokens) with what is left after δ."""

from __future__ import annotations

import pytest

from cli_helpers import load_script

lockin_tokens = load_script("lockin_tokens")

SINGLE = ["<reasoning>", "9 + 5 + 7 ", "= 21", "."]  # the single-equation form: opening = the first 3 tokens
TWO_STEP = ["<reasoning>", "9 + 5 ", "= 14", "."]  # two numbers before "=": no opening


def _group(advantages, filtered, gamma_h=0.1):
    """Four 4-token completions, λ = 1 everywhere, no spans; A'_i = δ_i (A_i - γ⟨H⟩_i) with γ⟨H⟩_i = gamma_h."""
    tokens = [SINGLE, SINGLE, TWO_STEP, TWO_STEP]
    return {
        "completion_ids": [[1, 2, 3, 4], [1, 2, 3, 4], [1, 5, 6, 4], [1, 5, 6, 4]],
        "completion_tokens": tokens,
        "advantage": advantages,
        "advantage_used": [0.0 if f else a - gamma_h for a, f in zip(advantages, filtered, strict=True)],
        "entropy_filtered": filtered,
        "forward_span": [0, 0, 0, 0],
        "backward_span": [0, 0, 0, 0],
        "lambda_positions": [[], [], [], []],
        "lambda_values": [[], [], [], []],
    }


def test_the_single_equation_opening_ends_at_the_first_equals_sign():
    assert lockin_tokens.single_equation_opening(SINGLE) == 3
    assert lockin_tokens.single_equation_opening(TWO_STEP) == 0


def test_the_filter_part_is_what_eq6_removed_and_flips_the_openings_evidence():
    """By hand, w_i = 1/4, the opening is 3 tokens of completions 0 (A = +1, kept) and 1 (A = -1, filtered):
    A' = 0.9, 0, -1.1, 0.9. Opening push Σ λ A' w = 3·0.9/4 = 0.675; filter part 3·(0 - (-1))/4 = 0.75; γ part
    3·(0.9 - 1)/4 = -0.075; their sum is the entropy part 3·(-0.1)/4 + 3·1/4 = 0.675. The group's evidence on the
    opening 3·(1 - 1)/4 = 0 becomes 0.75 after δ: flipped by the filter; Eq. 5 flipped nothing (λ = 1)."""
    out = lockin_tokens.group_terms(_group([1.0, -1.0, -1.0, 1.0], [False, True, False, False]), [0, 1, 2, 3], 4)
    assert out["single-equation share"] == pytest.approx(0.5)
    assert out["opening: tokens"] == 6
    assert out["opening: push"] == pytest.approx(0.675)
    assert out["opening: filter part"] == pytest.approx(0.75)
    assert out["opening: gamma part"] == pytest.approx(-0.075)
    assert out["opening: entropy part"] == pytest.approx(out["opening: filter part"] + out["opening: gamma part"])
    assert out["opening flipped by the filter"] == 1 and out["opening flipped"] == 0
    assert (out["filtered"], out["filtered negatives"], out["filtered single-equation negatives"]) == (1, 1, 1)
    assert out["single-equation negatives"] == 1
    # After the opening (no spans here: the single-equation completions' last token "."): the filter removed
    # completion 1's push down, 1·(0 - (-1))/4; completion 0's push 0.9/4 is what the loss gave.
    assert out["after the opening: tokens"] == 2
    assert out["after the opening: filter part"] == pytest.approx(0.25)
    assert out["after the opening: push"] == pytest.approx(0.225)


def test_a_filter_that_drops_a_positive_or_nothing_flips_nothing():
    """Dropping the positive single-equation completion (0) leaves the opening's evidence down: no flip, the filter
    part -3/4; dropping nothing: filter part 0, γ part alone, entropy part = γ part."""
    out = lockin_tokens.group_terms(_group([1.0, -1.0, -1.0, 1.0], [True, False, False, False]), [0, 1, 2, 3], 4)
    assert out["opening: filter part"] == pytest.approx(-0.75) and out["opening flipped by the filter"] == 0
    assert (out["filtered negatives"], out["filtered single-equation negatives"]) == (0, 0)
    none = lockin_tokens.group_terms(_group([1.0, -1.0, -1.0, 1.0], [False] * 4), [0, 1, 2, 3], 4)
    assert none["opening: filter part"] == 0.0 and none["filtered"] == 0
    assert none["opening: entropy part"] == pytest.approx(none["opening: gamma part"]) == pytest.approx(-0.15)
