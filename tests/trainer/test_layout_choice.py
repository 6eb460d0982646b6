"""The packed-or-padded choice (issue 58, item 1): one function, `layout_choice.choose_layout`, decides for every
micro-batch, from the FLOPs, the device's fixed costs (`layout_choice.LAYOUT_COSTS`) and the user's override
(`GTPO_PREFIX_LAYOUT`).

Invariants: on a CPU the choice is the FLOP count's, as before this seam (both layouts exact, tested in
test_prefix_sharing.py, so only time is at stake); a device's costs move the choice the way its overhead says; the
override wins over the costs both ways ("packed" packs where the costs would pad, "padded" never packs), reaches the
trainer's scoring, and gives the same numbers; a bad value is refused in one line when the config is made.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))

from gtpo import GTPOConfig, GTPOTrainer  # noqa: E402
from gtpo.forward import layout_choice  # noqa: E402
from gtpo.forward.layout_choice import LAYOUT_ENV, LayoutCosts, choose_layout, packed_is_cheaper  # noqa: E402
from gtpo.trainer import prefix_sharing  # noqa: E402
from trainer_helpers import make_dataset, table_reward  # noqa: E402

# Qwen2.5-1.5B's layer shapes, and issue 39's lengths: a 203-token prompt, G = 8 completions of 143-251 tokens.
QWEN_15B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                num_key_value_heads=2, head_dim=128)  # fmt: skip
PAPER_VOCAB = dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=64)  # fmt: skip
PROMPT, LENGTHS = 203, [143 + 15 * i for i in range(8)]
PADDED = PROMPT + max(LENGTHS)  # TRL's L
PACKED = PROMPT - 1 + sum(LENGTHS)  # N: the prompt once (less its last token), each completion token once


@pytest.fixture(autouse=True)
def no_layout_env(monkeypatch):
    monkeypatch.delenv(LAYOUT_ENV, raising=False)


def _config(**width):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=151936, tie_word_embeddings=True, **width)


def _flops(config, batch, length, packed_length):
    """(padded, packed) forward FLOPs of the decoder layers, recomputed here from the config by hand."""
    head_dim, heads, kv = config.head_dim, config.num_attention_heads, config.num_key_value_heads
    params = config.hidden_size * (2 * heads * head_dim + 2 * kv * head_dim) + 3 * config.hidden_size * (
        config.intermediate_size
    )
    per_token, per_pair = 2 * params * config.num_hidden_layers, 4 * heads * head_dim * config.num_hidden_layers
    padded = batch * length * (per_token + length * per_pair)
    return padded, packed_length * (per_token + packed_length * per_pair)


@pytest.mark.parametrize("width", [QWEN_15B, PAPER_VOCAB], ids=["qwen1.5b", "paper-vocab"])
@pytest.mark.parametrize("packed_length", [PACKED, 8 * PADDED], ids=["shared-prompt", "nothing-shared"])
def test_on_a_cpu_fewer_flops_decide_as_before(width, packed_length):
    """No CPU entry in LAYOUT_COSTS: the layout with fewer FLOPs, by a count made here independently."""
    assert "cpu" not in layout_choice.LAYOUT_COSTS
    config = _config(**width)
    padded, packed = _flops(config, 8, PADDED, packed_length)
    expected = "packed" if packed <= padded else "padded"
    assert choose_layout(config, 8, PADDED, packed_length, "cpu") == expected
    assert expected == ("packed" if packed_length == PACKED else "padded")  # both outcomes are exercised


def test_a_device_cost_weighs_fixed_overhead_against_the_flops_saved(monkeypatch):
    """With a device entry, packing wins only where 3 x the forward FLOPs it saves, at the device's rate, take longer
    than its overhead: an overhead just under that saving packs, just over it pads; the same device type without an
    entry packs by FLOPs; `costs=` overrides the table for one call."""
    config = _config(**QWEN_15B)
    padded, packed = _flops(config, 8, PADDED, PACKED)
    saved_s = 3.0 * (padded - packed) / 1e14
    for overhead, expected in [(0.99 * saved_s, "packed"), (1.01 * saved_s, "padded")]:
        monkeypatch.setitem(layout_choice.LAYOUT_COSTS, "xpu", LayoutCosts(flops_per_s=1e14, overhead_s=overhead))
        assert choose_layout(config, 8, PADDED, PACKED, "xpu") == expected
        assert packed_is_cheaper(config, 8, PADDED, PACKED, "cpu", costs=layout_choice.LAYOUT_COSTS["xpu"]) == (
            expected == "packed"
        )
    assert choose_layout(config, 8, PADDED, PACKED, "mps") == "packed"


def test_the_cuda_entry_is_the_calibrated_one():
    """The "cuda" costs are unchanged by the seam: 250 TFLOP/s and 3.4 ms (the H200 record of 2026-11-26)."""
    assert layout_choice.LAYOUT_COSTS["cuda"] == LayoutCosts(flops_per_s=2.5e14, overhead_s=3.4e-3)


@pytest.mark.parametrize("bad", [dict(flops_per_s=0.0, overhead_s=1e-3), dict(flops_per_s=1e14, overhead_s=-1.0)])
def test_layout_costs_refuse_impossible_values(bad):
    with pytest.raises(ValueError, match=r"^LayoutCosts needs flops_per_s > 0 and overhead_s >= 0"):
        LayoutCosts(**bad)


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_the_override_wins_over_the_costs_both_ways(monkeypatch, how):
    """At the 2-layer shape on CUDA the costs pad (packing cannot save 3.4 ms there), at 1.5B on a CPU they pack:
    "packed" packs the first, "padded" pads the second, whether given as the argument or in GTPO_PREFIX_LAYOUT."""
    small, large = _config(**PAPER_VOCAB), _config(**QWEN_15B)
    assert choose_layout(small, 8, PADDED, PACKED, "cuda") == "padded"
    assert choose_layout(large, 8, PADDED, PACKED, "cpu") == "packed"
    for layout, config, device in [("packed", small, "cuda"), ("padded", large, "cpu")]:
        if how == "argument":
            assert choose_layout(config, 8, PADDED, PACKED, device, override=layout) == layout
        else:
            monkeypatch.setenv(LAYOUT_ENV, layout)
            assert choose_layout(config, 8, PADDED, PACKED, device) == layout
    monkeypatch.setenv(LAYOUT_ENV, "auto")
    assert choose_layout(small, 8, PADDED, PACKED, "cuda") == "padded"


def test_a_bad_override_is_refused_in_one_line_when_the_config_is_made(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match=r"^layout='pack' is not one of \['auto', 'packed', 'padded'\]$"):
        choose_layout(_config(**QWEN_15B), 8, PADDED, PACKED, "cpu", override="pack")
    monkeypatch.setenv(LAYOUT_ENV, "fastest")
    with pytest.raises(ValueError, match=r"^GTPO_PREFIX_LAYOUT='fastest' is not one of \['auto', 'packed', 'padded'\]"):
        GTPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[])


def _batch(vocab, rows=8, prompt=5, width=6):
    """One prompt of ``prompt`` tokens for every row, completions of 1..width tokens (right-padded)."""
    generator = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(3, vocab, (1, prompt), generator=generator).expand(rows, prompt)
    completion_mask = torch.zeros(rows, width, dtype=torch.long)
    for row in range(rows):
        completion_mask[row, : 1 + row % width] = 1
    completions = torch.randint(3, vocab, (rows, width), generator=generator) * completion_mask
    ids = torch.cat([prompt_ids, completions], dim=1)
    return ids, torch.cat([torch.ones(rows, prompt, dtype=torch.long), completion_mask], dim=1)


def _scoring_stand_in(monkeypatch, device_costs):
    """The trainer's scoring on stand-ins: which path (packed or TRL's padded) each micro-batch took."""
    monkeypatch.setattr(prefix_sharing, "problem", lambda *a: None)
    if device_costs is not None:
        monkeypatch.setitem(layout_choice.LAYOUT_COSTS, "cpu", device_costs)
    taken = []

    def packed_logps(trainer, model, packed, mask, width):
        taken.append("packed")
        return torch.zeros(mask.size(0), width), torch.zeros(mask.size(0), width)

    def padded(model, ids, mask, width, *args, **kwargs):
        taken.append("padded")
        return torch.zeros(ids.size(0), width), torch.zeros(ids.size(0), width), None

    monkeypatch.setattr(prefix_sharing, "packed_logps", packed_logps)
    config = _config(**QWEN_15B)
    config._attn_implementation = "sdpa"
    trainer = SimpleNamespace(accelerator=SimpleNamespace(unwrap_model=lambda m: m))
    model = SimpleNamespace(config=config)
    ids, mask = _batch(config.vocab_size)

    def score():
        prefix_sharing.per_token_logps_and_entropies(trainer, padded, model, ids, mask, 6, 4, True, False, {})
        return taken

    return score


@pytest.mark.parametrize(
    "layout, costs, expected",
    [
        (None, None, ["packed", "packed"]),  # a CPU: fewer FLOPs, both micro-batches packed
        ("padded", None, ["padded"]),  # decided once from the shapes, before any layout check or `pack`
        (None, LayoutCosts(flops_per_s=1e14, overhead_s=1.0), ["padded"]),  # a device whose overhead never pays
        ("packed", LayoutCosts(flops_per_s=1e14, overhead_s=1.0), ["packed", "packed"]),  # the user's choice wins
    ],
)  # fmt: skip
def test_the_trainers_scoring_goes_through_the_choice(monkeypatch, layout, costs, expected):
    if layout is not None:
        monkeypatch.setenv(LAYOUT_ENV, layout)
    assert _scoring_stand_in(monkeypatch, costs)() == expected


def test_the_override_gives_the_same_scores_in_either_layout(tmp_path, tiny_model_path, monkeypatch, caplog):
    """The tiny model through GTPOTrainer's scoring: GTPO_PREFIX_LAYOUT=padded takes TRL's path and says why in its
    log line, "packed" the packed one; their log-probs and entropies agree within 1e-5 (float32)."""
    import logging

    args = GTPOConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], num_generations=4,
        per_device_train_batch_size=8, max_completion_length=6,
    )  # fmt: skip
    trainer = GTPOTrainer(model=tiny_model_path, reward_funcs=table_reward, args=args, train_dataset=make_dataset(8))
    ids, mask = _batch(trainer.model.config.vocab_size)
    calls = []
    original = prefix_sharing.packed_logps
    monkeypatch.setattr(prefix_sharing, "packed_logps", lambda *a: calls.append(1) or original(*a))
    scores = {}
    for layout in ("padded", "packed"):
        monkeypatch.setenv(LAYOUT_ENV, layout)
        with torch.no_grad(), caplog.at_level(logging.INFO, logger=prefix_sharing.__name__):
            scores[layout] = trainer._get_per_token_logps_and_entropies(
                trainer.model, ids, mask, 6, compute_entropy=True
            )
        assert bool(calls) == (layout == "packed")
    assert "prefix sharing off (GTPO_PREFIX_LAYOUT=padded)" in caplog.text
    for padded, packed in zip(scores["padded"][:2], scores["packed"][:2], strict=True):
        assert torch.allclose(padded, packed, atol=1e-5, rtol=1e-5), (padded - packed).abs().max()
