"""`gtpo.core.metrics.loss_metrics` computes every fraction of docs/core.md's "Metrics" table from one table of counts
(a few kernels, for a launch-bound GPU step). Invariant: each metric equals its formula written out one reduction at
a time (the implementation before that change, kept here as the oracle), on random groups and on the edge cases (no
active row, no negative row, empty completions, every row filtered, no ⟨H⟩, no rows at all)."""

from __future__ import annotations

import pytest
import torch

from gtpo.core.metrics import loss_metrics


def _ratio(num, den):
    return num.float() / den.float().clamp(min=1)


def reference_metrics(valid, signs, fw, bw, lam, keep, mean_h, a_used):
    """docs/core.md's formulas, one reduction per count."""
    active = (signs != 0).unsqueeze(-1)
    negative = (signs < 0).unsqueeze(-1)
    n_active = active.sum()
    metrics = {
        "gtpo/conflict_token_frac": _ratio(((fw | bw) & active).sum(), (valid & active).sum()),
        "gtpo/forward_span_len": _ratio((fw & active).sum(), n_active),
        "gtpo/backward_span_len": _ratio((bw & active).sum(), n_active),
        "gtpo/protected_negative_frac": _ratio(((lam == 0) & valid & negative).sum(), (valid & negative).sum()),
        "gtpo/filtered_frac": (~keep).sum().float() / max(keep.numel(), 1),
        "gtpo/mean_lambda": _ratio(torch.where(valid, lam, 0.0).sum(), valid.sum()),
        "gtpo/sign_flipped_frac": _ratio((keep & (signs > 0) & (a_used < 0)).sum(), (keep & (signs != 0)).sum()),
    }
    if mean_h is not None:
        nonempty = valid.any(dim=-1)
        metrics["gtpo/mean_entropy"] = _ratio(torch.where(nonempty, mean_h, 0.0).sum(), nonempty.sum())
    return metrics


def _group(generator, n, t, *, empty_rows=0, signs=None, keep_all=None, weights=(0.0, 1.0, 2.0)):
    lengths = torch.randint(1, t + 1, (n,), generator=generator)
    lengths[:empty_rows] = 0
    valid = torch.arange(t)[None] < lengths[:, None]
    fw = (torch.arange(t)[None] < torch.randint(0, 6, (n, 1), generator=generator)) & valid
    bw = (torch.arange(t)[None] >= (lengths - torch.randint(0, 3, (n,), generator=generator))[:, None]) & valid
    if signs is None:
        signs = torch.randint(-1, 2, (n,), generator=generator).float()
    choices = torch.tensor(weights)
    lam = torch.where(fw | bw, choices[torch.randint(0, len(weights), (n, t), generator=generator)], 1.0)
    keep = torch.rand(n, generator=generator) > 0.3 if keep_all is None else torch.full((n,), keep_all)
    mean_h = torch.rand(n, generator=generator) * 2
    a_used = torch.randn(n, generator=generator)
    return valid, signs, fw, bw, lam, keep, mean_h, a_used


def _assert_equal_metrics(args):
    got, want = loss_metrics(*args), reference_metrics(*args)
    assert list(got) == list(want)  # the same keys, in the same order (the logged columns)
    for key in want:
        assert got[key].dtype == torch.float32 and got[key].shape == ()
        torch.testing.assert_close(got[key], want[key], rtol=1e-6, atol=1e-7, msg=key)


@pytest.mark.parametrize("seed", range(20))
def test_each_metric_equals_its_formula_on_random_groups(seed):
    generator = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 17, (1,), generator=generator))
    _assert_equal_metrics(_group(generator, n, 64, empty_rows=seed % 3))


@pytest.mark.parametrize(
    "case",
    ["no-active-row", "no-negative-row", "every-row-filtered", "all-rows-empty", "no-entropy", "fractional-weights"],
)
def test_edge_cases_equal_the_formulas(case):
    generator = torch.Generator().manual_seed(7)
    n = 6
    kwargs = {
        "no-active-row": dict(signs=torch.zeros(n)),
        "no-negative-row": dict(signs=torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])),
        "every-row-filtered": dict(keep_all=False),
        "all-rows-empty": dict(empty_rows=n),
        "no-entropy": {},
        "fractional-weights": dict(weights=(0.0, 0.3, 1.7)),
    }[case]
    args = list(_group(generator, n, 32, **kwargs))
    if case == "no-entropy":
        args[6] = None
    _assert_equal_metrics(args)
    if case == "no-active-row":
        got = loss_metrics(*args)
        assert got["gtpo/conflict_token_frac"] == 0 and got["gtpo/forward_span_len"] == 0  # empty: 0, not nan


def test_no_rows_at_all_gives_zeros_not_nan():
    empty = torch.zeros(0, 5, dtype=torch.bool)
    args = (empty, torch.zeros(0), empty, empty, torch.ones(0, 5), torch.zeros(0, dtype=torch.bool), torch.zeros(0),
            torch.zeros(0))  # fmt: skip
    _assert_equal_metrics(args)
    assert all(v == 0 for v in loss_metrics(*args).values())
