"""`gtpo eval`'s transformers backend without waste (issue 30) against the path before it (`fast=False`:
`model.generate` on the left-padded batch).

Invariants: with the per-sample seeds, every (problem, sample) gets exactly the completion the `generate` path gives
it (sampled at temperature 1, with top-p/top-k, and greedy), so pass@k cannot move; a problem's prompt is prefilled
once for its n samples and ended rows cost nothing (counted row-steps); batches hold whole problems.
"""

from __future__ import annotations

import pytest

from gtpo.eval.backends import SamplingSettings, TransformersBackend
from gtpo.eval.runner import EvalConfig, evaluate, load_problems, unit_seed, whole_problems


@pytest.fixture(scope="module")
def problems(shared_data):
    return load_problems("gsm8k", "test", str(shared_data / "gsm8k" / "test.jsonl"), limit=3)


@pytest.fixture(scope="module")
def backends():
    """Both paths, with token 421 (a few % of the tiny model's tokens on these prompts) also ending a completion,
    so that rows end at many different steps (its own EOS is rare within 16 tokens)."""
    pair = TransformersBackend("tiny"), TransformersBackend("tiny", fast=False)
    for backend in pair:
        backend.eos_ids = [*backend.eos_ids, 421]
    return pair


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingSettings(max_new_tokens=16),
        SamplingSettings(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=16),
        SamplingSettings(temperature=0, max_new_tokens=16),
    ],
)
def test_fast_path_gives_every_sample_the_completion_of_the_generate_path(problems, backends, sampling):
    fast, plain = backends
    n = 4
    prompts = [p.prompt for p in problems for _ in range(n)]
    seeds = [unit_seed(7, p.id, s) for p in problems for s in range(n)]
    fast.stats.__init__()
    got = fast.generate(prompts, seeds, sampling)
    assert got == plain.generate(prompts, seeds, sampling)
    assert fast.stats.prefill_rows == len(problems) and fast.stats.prompt_rows == len(prompts)
    assert fast.stats.row_steps == sum(c.length for c in got)  # nothing computed after a row's EOS
    if sampling.temperature > 0:
        assert len({c.text for c in got}) > len(problems)  # samples of a problem differ
        assert any(not c.truncated for c in got) and any(c.truncated for c in got)  # rows ended at different steps


@pytest.mark.parametrize("batch_size, n, rows", [(5, 4, 4), (100, 8, 96), (3, 4, 4), (64, 8, 64), (16, 32, 32)])
def test_batches_hold_whole_problems(batch_size, n, rows):
    assert whole_problems(EvalConfig(model="tiny", output_dir="x", batch_size=batch_size, num_samples=n)) == rows


def test_an_evaluation_gives_the_same_records_and_pass_at_k_on_both_paths(tmp_path, shared_data, monkeypatch):
    """End to end through `evaluate` (batches of whole problems, per-sample seeds): the records and pass@k of the
    fast path are those of the generate path."""
    import gtpo.eval.backends as backends_module

    source = str(shared_data / "gsm8k" / "test.jsonl")
    results = []
    for fast in (True, False):
        monkeypatch.setattr(
            backends_module, "_make_transformers", lambda m, d, s, f=fast: TransformersBackend(m, d, fast=f)
        )
        monkeypatch.setitem(backends_module.BACKENDS, "transformers", backends_module._make_transformers)
        config = EvalConfig(
            model="tiny", output_dir=tmp_path / str(fast), source=source, num_samples=4, limit=3, batch_size=8,
            sampling=SamplingSettings(max_new_tokens=16), backend="transformers", progress=False, seed=3,
        )  # fmt: skip
        results.append(evaluate(config))
    assert results[0]["pass@k"] == results[1]["pass@k"] and results[0]["maj@k"] == results[1]["maj@k"]
    lines = [(tmp_path / str(f) / "samples.jsonl").read_text().splitlines() for f in (True, False)]
    assert sorted(lines[0]) == sorted(lines[1])


@pytest.mark.parametrize("settings", [SamplingSettings(), SamplingSettings(temperature=0.7, top_k=50, top_p=0.9)])
def test_per_row_sampler_draws_what_it_drew_before_issue_30(settings):
    """Samples recorded before the sampler was reworked (in place, no division by temperature 1) must come out the
    same on resume: the draw is compared with the formula as it was written then, step after step."""
    import torch
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    from gtpo.eval.backends import per_row_sampler

    seeds = [3, 141, 59, 26]
    sampler = per_row_sampler(seeds, settings, "cpu")
    generators = [torch.Generator().manual_seed(s) for s in seeds]
    warpers = [TemperatureLogitsWarper(settings.temperature)]
    warpers += [TopKLogitsWarper(settings.top_k)] if settings.top_k else []
    warpers += [TopPLogitsWarper(settings.top_p)] if settings.top_p < 1 else []
    torch.manual_seed(0)
    for _ in range(5):
        scores = torch.randn(len(seeds), 5000) * 3
        warped = scores
        for warper in warpers:
            warped = warper(None, warped)
        log_probs = torch.log_softmax(warped.float(), dim=-1)
        uniform = torch.stack([torch.rand(5000, generator=g) for g in generators])
        gumbel = -torch.log(-torch.log(uniform.clamp_(min=torch.finfo(torch.float32).tiny)))
        assert torch.equal(sampler.choose(scores.clone()), torch.argmax(log_probs + gumbel, dim=-1))
