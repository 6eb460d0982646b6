"""`gtpo train` warns when it is asked for bf16 on a CPU that computes bf16 in software (issue 18's finding:
350 s a step against 26-55 s in float32), and stays silent for float32 or a CPU with bf16 units."""

from __future__ import annotations

import logging

import pytest
from trl import ModelConfig

import gtpo.models
from gtpo.trainer.policy import load_policy


@pytest.mark.parametrize("dtype, has_bf16, warns", [("bfloat16", False, True), ("bfloat16", True, False),
                                                     ("float32", False, False), ("bfloat16", None, False)])  # fmt: skip
def test_bf16_on_a_cpu_without_bf16_units_warns(tiny_model_path, monkeypatch, caplog, dtype, has_bf16, warns):
    monkeypatch.setattr(gtpo.models, "cpu_computes_bf16", lambda: has_bf16)
    with caplog.at_level(logging.WARNING, logger="gtpo.trainer.policy"):
        model, _ = load_policy(ModelConfig(model_name_or_path=tiny_model_path, dtype=dtype), "gtpo train")
    assert str(model.dtype) == f"torch.{dtype}"
    warned = [r.getMessage() for r in caplog.records if "without bfloat16 units" in r.getMessage()]
    assert bool(warned) == warns
    if warns:
        assert "--dtype float32" in warned[0]


@pytest.mark.parametrize("has_bf16, expected", [(True, "bfloat16"), (False, "float32"), (None, "float32")])
def test_auto_dtype_trains_in_bf16_only_where_the_cpu_computes_it(tiny_model_path, monkeypatch, has_bf16, expected):
    """`dtype: auto` (the offline default run's): bf16 with AVX512-BF16/AMX units, float32 where bf16 would be
    emulated (about 10x slower) or the CPU is unknown; never the bf16 warning."""
    import torch

    monkeypatch.setattr(gtpo.models, "cpu_computes_bf16", lambda: has_bf16)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model, _ = load_policy(ModelConfig(model_name_or_path=tiny_model_path, dtype="auto"), "gtpo train")
    assert str(model.dtype) == f"torch.{expected}"
