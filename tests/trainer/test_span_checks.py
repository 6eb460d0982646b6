"""GTPOTrainer checks the span inputs of its first batch in full, then keeps the O(N·T) checks out of the
per-step path (issue 21: conflict_spans's cost), without losing the check a custom rollout needs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from gtpo.core import checks as core_checks
from gtpo.core import spans as core_spans
from gtpo.trainer.trainer import GTPOTrainer


class _OneProcess:
    """The accelerator calls `_gathered_spans` makes, on one process."""

    process_index = 0

    def gather(self, t):
        return t

    def pad_across_processes(self, t, dim, pad_index):
        return t


def _fake_trainer(training: bool = True, correction: bool = True):
    from collections import defaultdict

    from gtpo import GTPOConfig

    args = GTPOConfig(output_dir="unused", use_cpu=True, report_to=[], conflict_correction=correction)
    return SimpleNamespace(
        args=args,  # a real config: _gathered_spans reads the span options, and λ's for gtpo/push_against_group
        _metrics=defaultdict(lambda: defaultdict(list)),
        model=SimpleNamespace(training=training),
        num_generations=2,
        num_generations_eval=2,
        accelerator=_OneProcess(),
        _tokenizer=SimpleNamespace(pad_token_id=0),
        _span_inputs_checked=set(),
    )


def _output(mask):
    ids = torch.tensor([[5, 7, 9], [5, 8, 9]])
    return {"completion_ids": ids, "completion_mask": mask, "advantages": torch.tensor([1.0, -1.0])}


def test_first_batch_of_each_mode_is_checked_later_ones_are_not(monkeypatch):
    calls = []
    real = core_checks.validate_group_batch

    def counting(*args):
        calls.append(args[3])
        return real(*args)

    monkeypatch.setattr(core_spans, "validate_group_batch", counting)
    trainer = _fake_trainer()
    good = torch.ones(2, 3, dtype=torch.int64)
    for _ in range(3):
        gathered = GTPOTrainer._gathered_spans(trainer, _output(good))
        forward, backward = gathered["forward"], gathered["backward"]
    assert len(calls) == 1  # train mode: its first batch only
    # The spans themselves are the checked call's: token 5 leads and 9 ends both rows (hand-derived).
    assert forward.int().tolist() == [[1, 0, 0], [1, 0, 0]] and backward.int().tolist() == [[0, 0, 1], [0, 0, 1]]
    trainer.model.training = False
    GTPOTrainer._gathered_spans(trainer, _output(good))
    GTPOTrainer._gathered_spans(trainer, _output(good))
    assert len(calls) == 2  # eval mode has its own first batch (its own group size)


def test_a_left_padded_first_batch_is_refused():
    left_padded = torch.tensor([[0, 1, 1], [1, 1, 1]])
    with pytest.raises(ValueError, match="right-padded"):
        GTPOTrainer._gathered_spans(_fake_trainer(), _output(left_padded))


def test_spans_for_the_record_only_never_refuse_a_batch():
    """With the correction off (algorithm='grpo', or conflict_correction=False) the spans are computed only for the
    completion record: a layout the loss would refuse must not stop the run, so the checks are skipped."""
    left_padded = torch.tensor([[0, 1, 1], [1, 1, 1]])
    gathered = GTPOTrainer._gathered_spans(_fake_trainer(correction=False), _output(left_padded))
    assert gathered["forward"].shape == (2, 3)
