"""The packed layout with FlexAttention's block mask (opt-in: GTPO_PACKED_ATTENTION=flex; gtpo.forward.flex, run by
gtpo.trainer.prefix_sharing): the same numbers as TRL's padded path, the attention skipping masked blocks.

Invariants, each against TRL's own padded path (`GRPOTrainer._get_per_token_logps_and_entropies`, or the same run with
`use_prefix_sharing=False`) on the tiny model in float32, with the tolerances test_shared_prefix.py holds the dense
packed layout to (they bound float summation order, which changes with the layout: max(1e-5, twice what TRL's own
path moves between scoring the rows one at a time and all 8 together) for log-probs and entropies, ‖Δg‖/‖g‖ ≤ 1e-4
per parameter tensor):
- the flex packed forward's per-token log-probs and entropies, and the gradients after backward (full fine-tuning and
  LoRA), equal TRL's;
- a whole training step with gradient checkpointing (TRL's default, whose recompute runs in the backward with the same
  block mask) gives TRL's update;
- where flex cannot run it says why in one log line and the dense packed mask scores the batch, with TRL's numbers;
- unasked, nothing changes: the "sdpa" attention function stays transformers' own, and a dense mask gives bitwise the
  same scores through the wrapper as without it;
- a bad value is refused in one line when the config is made.

On a CPU, transformers compiles flex attention with inductor's C++ template (about 15 s per new length on a 2-core
machine, and forward only): the tests here run torch's uncompiled flex_attention in its place (torch's reference:
the same block mask and predicate, the scores materialised), except the slow test, which runs the compiled kernel.
torch 2.13 refuses FlexAttention's backward on a CPU at its API; the gradient tests lift that check, so torch's own
math backward of the flex operator runs (a GPU runs the Triton kernels: the gpu-marked test).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))

from test_shared_prefix import (  # noqa: E402
    _batch,
    _check_packed_equals_trl_padded,
    _trainer,
    _trl,
    assert_same_update,
    one_step_update,
)

from gtpo import GTPOConfig  # noqa: E402
from gtpo.forward import flex, layout_choice  # noqa: E402
from gtpo.trainer import prefix_sharing  # noqa: E402

K = 6


@pytest.fixture(autouse=True)
def flex_env(monkeypatch):
    """GTPO_PACKED_ATTENTION=flex and the packed layout forced; the dispatcher removed after each test."""
    monkeypatch.setenv(layout_choice.ATTENTION_ENV, "flex")
    monkeypatch.setenv(layout_choice.LAYOUT_ENV, "packed")
    yield
    flex.uninstall()


@pytest.fixture
def flex_calls(monkeypatch):
    """Run torch's uncompiled flex_attention where transformers compiles it (the module docstring says why); count
    the calls of transformers' flex attention (one per layer and forward, the recompute included)."""
    import transformers.integrations.flex_attention as integration
    from torch.nn.attention.flex_attention import flex_attention

    calls = []
    forward = integration.flex_attention_forward
    monkeypatch.setattr(integration, "compile_friendly_flex_attention",
                        lambda q, k, v, training=False, **kwargs: flex_attention(q, k, v, **kwargs))  # fmt: skip
    monkeypatch.setattr(integration, "flex_attention_forward", lambda *a, **k: calls.append(1) or forward(*a, **k))
    return calls


@pytest.fixture
def cpu_backward(monkeypatch):
    """Lift torch 2.13's refusal of FlexAttention's backward on a CPU (and gtpo's fallback for it): torch's math
    backward of the flex operator runs."""
    import torch.nn.attention.flex_attention as api

    validate = api._validate_device
    monkeypatch.setattr(api, "_validate_device", lambda q, k, v: validate(q.detach(), k.detach(), v.detach()))
    monkeypatch.setattr(flex, "NO_BACKWARD", ())


@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
def test_flex_scores_and_gradients_equal_trl_padded_ones(tmp_path, tiny_model_path, peft, flex_calls, cpu_backward):
    """test_shared_prefix's comparison, unchanged, with the packed layout's attention by FlexAttention: log-probs and
    entropies within max(1e-5, 2 x TRL's own batch-vs-rows spread), padding scoring 0, gradients within 1e-4."""
    _check_packed_equals_trl_padded(tmp_path, tiny_model_path, peft, use_cpu=True)
    layers = 2 * 2  # the tiny model's 2 layers, in the scoring call and in the first gradient call
    assert len(flex_calls) >= layers


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
def test_flex_scores_and_gradients_equal_trl_padded_ones_on_cuda(tmp_path, tiny_model_path, peft):
    """The same on CUDA in float32, through transformers' compiled flex attention (Triton kernels that skip the
    absent blocks and leave full ones unmasked), against TRL's padded layout on SDPA."""
    torch.backends.cuda.matmul.allow_tf32 = False  # torch's default for float32, which the tolerances assume
    calls = []
    import transformers.integrations.flex_attention as integration

    forward = integration.flex_attention_forward
    integration.flex_attention_forward = lambda *a, **k: calls.append(1) or forward(*a, **k)
    try:
        _check_packed_equals_trl_padded(tmp_path, tiny_model_path, peft, use_cpu=False)
    finally:
        integration.flex_attention_forward = forward
    assert calls  # flex ran, not the dense fallback


def test_scoring_without_gradients_runs_flex_on_a_cpu(tmp_path, tiny_model_path, flex_calls, caplog):
    """Under no_grad (the old and reference log-probs) a CPU runs flex without lifting anything: TRL's log-probs and
    entropies within 1e-5, and the announcement says which attention ran."""
    trainer = _trainer(tmp_path, tiny_model_path)
    ids, mask = _batch(trainer.model.config.vocab_size)
    with torch.no_grad(), caplog.at_level(logging.INFO, logger=prefix_sharing.__name__):
        logps, entropies, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, mask, K, compute_entropy=True
        )
        trl_logps, trl_entropies, _ = _trl(trainer, trainer.model, ids, mask, compute_entropy=True)
    assert len(flex_calls) == 2  # one forward, 2 layers
    assert "attention by FlexAttention's block mask (GTPO_PACKED_ATTENTION=flex)" in caplog.text
    torch.testing.assert_close(logps, trl_logps, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropies, trl_entropies, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "overrides",
    [dict(), dict(num_iterations=2, max_steps=2, learning_rate=0.05)],
    ids=["default", "two-iterations"],
)
def test_training_update_with_gradient_checkpointing_equals_the_padded_layout(
    tmp_path, tiny_model_path, overrides, flex_calls, cpu_backward
):
    """Whole `trainer.train()` steps (gradient checkpointing on, as TRL's config defaults it: the recompute runs in
    the backward, after the forward returned) with flex against `use_prefix_sharing=False`: the same update within
    ‖Δ‖/‖update‖ ≤ 1e-4 per tensor, as test_shared_prefix holds the dense packed layout to."""
    updates = []
    for sharing in (True, False):
        flex_calls.clear()
        trainer, update = one_step_update(tmp_path, tiny_model_path, sharing, overrides)
        assert trainer.model.is_gradient_checkpointing
        updates.append(update)
        assert bool(flex_calls) == sharing
    assert_same_update(*updates)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ("cpu-backward", "FlexAttention has no backward on cpu"),
        ("eager", "routed from sdpa's attention function, not 'eager''s"),
        ("no-flex-support", "does not support flex_attention in transformers"),
    ],
)
def test_where_flex_cannot_run_the_dense_mask_scores_and_says_why_once(
    tmp_path, tiny_model_path, caplog, monkeypatch, change, reason, flex_calls
):
    """On a CPU with gradients (torch refuses flex's backward there), with eager attention (the block mask is routed
    from sdpa's function), and for a model transformers does not run flex for: one log line naming the reason, the
    dense packed layout runs (not TRL's padded one), and its log-probs are TRL's within 1e-5."""
    trainer = _trainer(tmp_path, tiny_model_path)
    model = trainer.model
    if change == "eager":
        monkeypatch.setattr(model.config, "_attn_implementation_internal", "eager")
    if change == "no-flex-support":
        monkeypatch.setattr(type(model), "_supports_flex_attn", False)
    ids, mask = _batch(model.config.vocab_size)
    packed_calls = []
    original = prefix_sharing.packed_logps
    monkeypatch.setattr(prefix_sharing, "packed_logps", lambda *a: packed_calls.append(len(a)) or original(*a))
    with caplog.at_level(logging.INFO, logger=prefix_sharing.__name__):
        for _ in range(2):
            logps, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, K)
    assert packed_calls == [5, 5] and not flex_calls  # the dense packed layout, each time
    lines = [r.getMessage() for r in caplog.records if "GTPO_PACKED_ATTENTION=flex off" in r.getMessage()]
    assert len(lines) == 1 and reason in lines[0], lines
    assert lines[0].endswith("the packed layout's dense mask scores this batch")
    torch.testing.assert_close(logps.detach(), _trl(trainer, model, ids, mask)[0].detach(), atol=1e-5, rtol=0)


def test_unasked_nothing_changes_and_the_wrapper_passes_dense_masks_through(tmp_path, tiny_model_path, monkeypatch):
    """Without GTPO_PACKED_ATTENTION the "sdpa" function stays transformers' own after a scoring; with the wrapper
    installed, the dense packed layout's scores are bitwise those without it."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    monkeypatch.delenv(layout_choice.ATTENTION_ENV)
    trainer = _trainer(tmp_path, tiny_model_path)
    ids, mask = _batch(trainer.model.config.vocab_size)
    with torch.no_grad():
        before = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, K, compute_entropy=True)
        assert ALL_ATTENTION_FUNCTIONS["sdpa"] is sdpa_attention_forward
        flex.install()
        assert ALL_ATTENTION_FUNCTIONS["sdpa"] is not sdpa_attention_forward
        after = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, K, compute_entropy=True)
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])
    flex.uninstall()
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is sdpa_attention_forward


def test_a_bad_attention_value_is_refused_in_one_line_when_the_config_is_made(monkeypatch, tmp_path):
    monkeypatch.setenv(layout_choice.ATTENTION_ENV, "sparse")
    with pytest.raises(ValueError, match=r"^GTPO_PACKED_ATTENTION='sparse' is not one of \['dense', 'flex'\]$"):
        GTPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[])


@pytest.mark.slow
def test_the_compiled_cpu_kernel_gives_trl_scores(tmp_path, tiny_model_path):
    """transformers' own path, compiled by inductor for a CPU (its C++ flex template reads the block mask's partial and
    full blocks), forward only: TRL's log-probs and entropies within 1e-5. Slow: the compile takes ~15 s."""
    trainer = _trainer(tmp_path, tiny_model_path)
    ids, mask = _batch(trainer.model.config.vocab_size)
    with torch.no_grad():
        logps, entropies, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, mask, K, compute_entropy=True
        )
        trl_logps, trl_entropies, _ = _trl(trainer, trainer.model, ids, mask, compute_entropy=True)
    torch.testing.assert_close(logps, trl_logps, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropies, trl_entropies, atol=1e-5, rtol=0)
