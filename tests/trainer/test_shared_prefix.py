"""The packed layout (gtpo.forward.packing; the trainer's hook, gtpo.trainer.prefix_sharing): each distinct prompt
encoded once, no padding, TRL's numbers.

Invariants, each against TRL's own padded path (`GRPOTrainer._get_per_token_logps_and_entropies`, or the same run
with `use_prefix_sharing=False`) in float32:
- per-token log-probs and entropies agree within max(1e-5, twice what TRL's path itself changes between scoring
  the rows one at a time and all 8 together);
- parameter gradients agree within ‖Δg‖/‖g‖ ≤ 1e-4 per tensor (LoRA and full fine-tuning);
- whole training runs give the same update with groups split over micro-batches, gradient accumulation,
  num_iterations=2 and beta > 0;
- where it cannot apply it falls back to TRL's path and says why in one log line.
- rows that mask_truncated_completions masks score 0 and add no loss or gradient, as in TRL's layout, even when a
  whole micro-batch is masked and packs into no position (issue 39).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch
from trl import GRPOTrainer

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))

from gtpo import GTPOConfig, GTPOTrainer  # noqa: E402
from gtpo.forward import layout_choice, packing  # noqa: E402
from gtpo.trainer import prefix_sharing  # noqa: E402
from trainer_helpers import FixedGeneration, make_dataset, table_reward, trainable_state  # noqa: E402

K = 6  # completion width
PROMPT = 7  # prompt width, left-padded


def _batch(vocab: int, seed: int = 0):
    """8 rows, 3 distinct prompts of lengths 7, 4 and 5 (left-padded to 7), shuffled as TRL shuffles rows;
    completions of lengths 6, 2, 0, 4, 6, 1, 3, 5 (right-padded), one empty."""
    generator = torch.Generator().manual_seed(seed)
    prompts = torch.randint(3, vocab, (3, PROMPT), generator=generator)
    prompt_mask = torch.ones(3, PROMPT, dtype=torch.long)
    prompt_mask[1, :3] = 0
    prompt_mask[2, :2] = 0
    prompts = prompts * prompt_mask
    rows = [0, 1, 2, 0, 1, 2, 0, 1]
    completions = torch.randint(3, vocab, (8, K), generator=generator)
    completion_mask = torch.ones(8, K, dtype=torch.long)
    for row, length in enumerate([6, 2, 0, 4, 6, 1, 3, 5]):
        completion_mask[row, length:] = 0
    ids = torch.cat([prompts[rows], completions * completion_mask], dim=1)
    return ids, torch.cat([prompt_mask[rows], completion_mask], dim=1)


def test_pack_lays_out_prefixes_segments_positions_and_labels_by_hand():
    # Prompt A = [11, 12, 13] (rows 0 and 2), prompt B = [pad, 21, 22] (row 1); completions of widths 2.
    ids = torch.tensor([[11, 12, 13, 31, 32], [0, 21, 22, 41, 0], [11, 12, 13, 51, 52]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    packed = packing.pack(ids, mask, 2)
    # A's prefix [11 12], row 0's segment [13 31], row 2's [13 51]; B's prefix [21], row 1's segment [22].
    assert packed.input_ids.tolist() == [[11, 12, 13, 31, 13, 51, 21, 22]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 2, 3, 1, 2]]  # each token's column in TRL's row
    assert packed.shift_labels.tolist() == [[-100, -100, 31, 32, 51, 52, -100, 41]]
    assert packed.source.tolist() == [[2, 3], [7, -1], [4, 5]]
    assert packed.prompts == 2 and packed.length == 8
    # The N x N mask is built on first use only, so a batch the cost check sends to TRL's layout never allocates it.
    assert "attention_mask" not in vars(packed)
    visible = packed.attention_mask[0, 0].int().tolist()
    assert visible == [
        [1, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0],
        [1, 1, 0, 0, 1, 0, 0, 0],  # row 2's segment sees A's prefix and itself, not row 0's segment
        [1, 1, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 0, 0, 1, 0],  # B's prefix sees nothing of A
        [0, 0, 0, 0, 0, 0, 1, 1],
    ]
    additive = packing.pack(ids, mask, 2, mask_dtype=torch.float32).attention_mask
    assert torch.equal(additive == 0, packed.attention_mask)  # eager attention's additive form of the same mask


def _pack_one_row_at_a_time(input_ids, attention_mask, logits_to_keep):
    """`pack` as it was before it was planned on the host and gathered on the device (a loop over rows, ~10 small
    tensors a row): the oracle the vectorised layout must equal, field for field."""
    device = input_ids.device
    batch, length = input_ids.shape
    prompt_width = length - logits_to_keep
    prompt_ids, prompt_mask = input_ids[:, :prompt_width], attention_mask[:, :prompt_width]
    completion_ids = input_ids[:, prompt_width:]
    completion_lengths = attention_mask[:, prompt_width:].sum(dim=1).tolist()
    pads = (prompt_width - prompt_mask.sum(dim=1)).tolist()
    keys = torch.cat([prompt_ids * prompt_mask, prompt_mask], dim=1)
    group_of_row = torch.unique(keys, dim=0, return_inverse=True)[1].tolist()
    order: dict[int, list[int]] = {}
    for row, group in enumerate(group_of_row):
        order.setdefault(group, []).append(row)
    ids, positions, labels, segment, prompt_of = [], [], [], [], []
    source = torch.full((batch, logits_to_keep), -1, dtype=torch.long)
    offset = 0
    for number, rows in enumerate(order.values()):
        first, pad = rows[0], pads[rows[0]]
        prefix = prompt_ids[first, pad : prompt_width - 1]
        ids.append(prefix)
        positions.append(torch.arange(pad, prompt_width - 1, device=device))
        labels.append(torch.full((prefix.numel(),), -100, dtype=torch.long, device=device))
        segment.append(torch.full((prefix.numel(),), -1, dtype=torch.long, device=device))
        prompt_of.append(torch.full((prefix.numel(),), number, dtype=torch.long, device=device))
        offset += prefix.numel()
        last = prompt_ids[first, prompt_width - 1 :]
        for row in rows:
            n = completion_lengths[row]
            if n == 0:
                continue
            ids.append(torch.cat([last, completion_ids[row, : n - 1]]))
            positions.append(torch.arange(prompt_width - 1, prompt_width - 1 + n, device=device))
            labels.append(completion_ids[row, :n])
            segment.append(torch.full((n,), row, dtype=torch.long, device=device))
            prompt_of.append(torch.full((n,), number, dtype=torch.long, device=device))
            source[row, :n] = torch.arange(offset, offset + n)
            offset += n
    return dict(
        input_ids=torch.cat(ids).unsqueeze(0), position_ids=torch.cat(positions).unsqueeze(0),
        shift_labels=torch.cat(labels).unsqueeze(0), source=source, prompts=len(order), segment=torch.cat(segment),
        prompt_of=torch.cat(prompt_of),
    )  # fmt: skip


@pytest.mark.parametrize("seed", range(12))
def test_pack_equals_the_row_by_row_layout_on_random_batches(seed):
    """Random micro-batches: 1-4 distinct prompts of 1-7 tokens (left-padded, so one-token prompts give empty
    prefixes), rows shuffled, completions of 0..K tokens (0: a masked or empty row)."""
    generator = torch.Generator().manual_seed(seed)
    batch, prompt_width, width = int(torch.randint(1, 9, (1,), generator=generator)), 7, 6

    def draw(low, high):
        return int(torch.randint(low, high, (1,), generator=generator))

    prompts = [torch.randint(3, 50, (draw(1, prompt_width + 1),), generator=generator) for _ in range(draw(1, 5))]
    ids = torch.zeros(batch, prompt_width + width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row in range(batch):
        prompt = prompts[int(torch.randint(0, len(prompts), (1,), generator=generator))]
        ids[row, prompt_width - len(prompt) : prompt_width] = prompt
        mask[row, prompt_width - len(prompt) : prompt_width] = 1
        n = int(torch.randint(0, width + 1, (1,), generator=generator))
        ids[row, prompt_width : prompt_width + n] = torch.randint(3, 50, (n,), generator=generator)
        mask[row, prompt_width : prompt_width + n] = 1
    assert packing.layout_problem(mask, width) is None
    packed = packing.pack(ids, mask, width)
    expected = _pack_one_row_at_a_time(ids, mask, width)
    for name, value in expected.items():
        got = getattr(packed, name)
        if isinstance(value, int):
            assert got == value, name
        else:
            assert got.dtype == value.dtype and torch.equal(got, value), name


def test_pack_dispatches_as_many_operators_for_16_rows_as_for_2():
    """The layout is planned in Python on the host and built with a fixed number of tensor operations (each one a
    kernel launch on a GPU, where a small model's step waits on the host); the loop it replaced made ~10 small
    tensors per row."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.calls += 1
            return func(*args, **(kwargs or {}))

    def calls(rows):
        prompt, width = torch.tensor([11, 12, 13]), 4
        ids = torch.cat([prompt.repeat(rows, 1), torch.randint(20, 40, (rows, width))], dim=1)
        mask = torch.ones_like(ids)
        mask[::2, -1] = 0  # completions of two lengths
        Count.calls = 0
        with Count():
            packing.pack(ids, mask, width)
        return Count.calls

    assert calls(16) == calls(2)


def test_layout_problem_names_what_packing_cannot_represent():
    assert packing.layout_problem(torch.tensor([[1, 1, 1, 1, 0], [0, 1, 1, 1, 1]]), 2) is None
    assert "hole" in packing.layout_problem(torch.tensor([[1, 1, 1, 0, 1], [1, 1, 1, 1, 1]]), 2)
    assert "left-padded" in packing.layout_problem(torch.tensor([[1, 0, 1, 1, 1], [1, 1, 1, 1, 1]]), 2)


def _trainer(tmp_path, tiny_model_path, **overrides):
    args = GTPOConfig(
        output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to=[], num_generations=4,
        per_device_train_batch_size=8, max_completion_length=K, **overrides,
    )  # fmt: skip
    return GTPOTrainer(model=tiny_model_path, reward_funcs=table_reward, args=args, train_dataset=make_dataset(8))


def _trl(trainer, model, ids, mask, **kwargs):
    return GRPOTrainer._get_per_token_logps_and_entropies(trainer, model, ids, mask, K, **kwargs)


@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
def test_packed_scores_and_gradients_equal_trl_padded_ones(tmp_path, tiny_model_path, peft):
    _check_packed_equals_trl_padded(tmp_path, tiny_model_path, peft, use_cpu=True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
def test_packed_scores_and_gradients_equal_trl_padded_ones_on_cuda(tmp_path, tiny_model_path, peft):
    """The same on CUDA in float32: sdpa's CUDA kernels with the packed 4D mask, TRL's Triton head on both sides."""
    torch.backends.cuda.matmul.allow_tf32 = False  # torch's default for float32, which the tolerances assume
    _check_packed_equals_trl_padded(tmp_path, tiny_model_path, peft, use_cpu=False)


def _check_packed_equals_trl_padded(tmp_path, tiny_model_path, peft, use_cpu):
    from peft import LoraConfig

    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False) if peft else None
    trainer = GTPOTrainer(
        model=tiny_model_path, reward_funcs=table_reward, train_dataset=make_dataset(8), peft_config=config,
        args=GTPOConfig(output_dir=str(tmp_path), use_cpu=use_cpu, bf16=False, report_to=[], num_generations=4,
                        per_device_train_batch_size=8, max_completion_length=K),
    )  # fmt: skip
    model = trainer.model
    assert model.device.type == ("cpu" if use_cpu else "cuda")
    ids, mask = (x.to(model.device) for x in _batch(model.config.vocab_size))
    packed = packing.pack(ids, mask, K)
    assert packed.prompts == 3 and packed.input_ids.size(1) == 6 + 3 + 4 + 27  # prefixes + completion tokens

    logps, entropies, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, K, compute_entropy=True)
    trl_logps, trl_entropies, _ = _trl(trainer, model, ids, mask, compute_entropy=True)
    one_by_one = torch.cat([_trl(trainer, model, ids[i : i + 1], mask[i : i + 1])[0] for i in range(8)])
    tolerance = max(1e-5, 2 * (one_by_one - trl_logps).abs().max().item())
    assert (logps - trl_logps).abs().max().item() <= tolerance
    assert (entropies - trl_entropies).abs().max().item() <= tolerance
    assert (logps[mask[:, PROMPT:] == 0] == 0).all()  # padding scores 0, as TRL's

    weights = torch.randn(8, K, generator=torch.Generator().manual_seed(1)).to(model.device)
    gradients = []
    for score in (trainer._get_per_token_logps_and_entropies, lambda *a, **k: _trl(trainer, *a[:3], **k)):
        model.zero_grad()
        out, ent, _ = score(model, ids, mask, K, compute_entropy=True)
        ((out * weights).sum() + ent.sum()).backward()
        gradients.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert gradients[0].keys() == gradients[1].keys() and len(gradients[0]) > 0
    for name, expected in gradients[1].items():
        assert (gradients[0][name] - expected).norm() <= 1e-4 * expected.norm(), name


def test_eager_attention_packs_with_an_additive_mask(tmp_path, tiny_model_path, caplog):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, attn_implementation="eager")
    args = GTPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], num_generations=4,
                      per_device_train_batch_size=8, max_completion_length=K)  # fmt: skip
    trainer = GTPOTrainer(model=model, reward_funcs=table_reward, args=args, train_dataset=make_dataset(8))
    ids, mask = _batch(model.config.vocab_size, seed=2)
    with caplog.at_level(logging.INFO, logger="gtpo.trainer.prefix_sharing"):
        logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, K)
    assert "prefix sharing: 8 rows (3 distinct prompts) packed into 40 positions" in caplog.text
    torch.testing.assert_close(logps, _trl(trainer, trainer.model, ids, mask)[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (dict(use_prefix_sharing=False), "use_prefix_sharing=False"),
        ("sliding", "sliding-window attention"),
        ("flash", "ignores custom 4D masks"),
        ("hole", "a completion's attention mask has a hole"),
    ],
)
def test_falls_back_to_trl_and_says_why_once(tmp_path, tiny_model_path, caplog, monkeypatch, change, reason):
    trainer = _trainer(tmp_path, tiny_model_path, **(change if isinstance(change, dict) else {}))
    ids, mask = _batch(trainer.model.config.vocab_size)
    if change == "sliding":
        monkeypatch.setattr(trainer.model.config, "sliding_window", 4, raising=False)
    if change == "flash":
        monkeypatch.setattr(trainer.model.config, "_attn_implementation", "flash_attention_2")
    if change == "hole":
        mask[0, PROMPT + 2] = 0
    calls = []
    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", lambda *a, **k: calls.append(1))
    with caplog.at_level(logging.INFO, logger="gtpo.trainer.prefix_sharing"):
        for _ in range(2):
            trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, K)
    assert len(calls) == 2  # TRL's path, each time
    lines = [r.getMessage() for r in caplog.records if "prefix sharing off" in r.getMessage()]
    assert len(lines) == 1 and reason in lines[0], lines  # one line per reason, not one per batch


class _Fixed(FixedGeneration, GTPOTrainer):
    pass


SGD = dict(optim="sgd", learning_rate=1.0, max_grad_norm=0.0, lr_scheduler_type="constant")


@pytest.mark.parametrize(
    "overrides",
    [
        dict(),
        dict(per_device_train_batch_size=2, steps_per_generation=4),  # each group spread over 2 micro-batches
        dict(per_device_train_batch_size=4, gradient_accumulation_steps=2),
        dict(num_iterations=2, max_steps=2, learning_rate=0.05),  # old log-probs, clipping on a moved policy
        dict(beta=0.04, algorithm="grpo"),  # the reference model's log-probs go through the same method
        dict(temperature=0.7, entropy_term="differentiable", entropy_gamma=0.1),  # the single-pass head's gradient
    ],
    ids=["default", "group-split", "accumulation", "two-iterations", "beta-grpo", "T0.7-differentiable"],
)
def test_training_update_equals_the_padded_layout(tmp_path, tiny_model_path, overrides, monkeypatch):
    packed_calls = []
    original = prefix_sharing.packed_logps
    monkeypatch.setattr(prefix_sharing, "packed_logps", lambda *a: packed_calls.append(1) or original(*a))
    updates = []
    for sharing in (True, False):
        packed_calls.clear()
        updates.append(one_step_update(tmp_path, tiny_model_path, sharing, overrides)[1])
        assert bool(packed_calls) == sharing  # the packed path ran in the first run only
    assert_same_update(*updates)


def one_step_update(tmp_path, model_path, sharing: bool, overrides: dict):
    """One `trainer.train()` step on TABLE's groups (`_Fixed`), SGD, with or without prefix sharing. Returns the
    trainer and its update, {name: after - before} of every trainable tensor."""
    config = dict(
        output_dir=str(tmp_path / f"out-{sharing}"), per_device_train_batch_size=8, num_generations=4,
        max_completion_length=8, max_steps=1, report_to=[], use_cpu=True, bf16=False, save_strategy="no",
        seed=0, disable_tqdm=True, initial_entropy=1.0, use_prefix_sharing=sharing, **SGD,
    )  # fmt: skip
    config.update(overrides)
    trainer = _Fixed(
        model=model_path, reward_funcs=table_reward, args=GTPOConfig(**config), train_dataset=make_dataset()
    )
    before = trainable_state(trainer.model)
    trainer.train()
    after = trainable_state(trainer.model)
    return trainer, {name: after[name] - before[name] for name in before}


def assert_same_update(packed: dict, padded: dict) -> None:
    """The step moved the weights (some entry above 1e-3), and the packed layout's update equals the padded one's
    within ‖Δ‖ ≤ 1e-4 ‖update‖ (+ 1e-7) per tensor: float summation in another order, nothing more."""
    assert max(u.abs().max().item() for u in padded.values()) > 1e-3  # the step moved the weights
    for name, expected in padded.items():
        assert (packed[name] - expected).norm() <= 1e-4 * expected.norm() + 1e-7, name


def _masked_batch(vocab: int, case: str):
    """`_batch` with `mask_truncated_completions`' masking (TRL's `_generate_and_score_completions`): a truncated
    row runs to K tokens and keeps them, its completion mask is zeroed. "partly": rows 0, 3 and 6 (one prompt's
    three rows) and row 4; "all": every row; "all-one-token": every row, each prompt cut to its last token, so that
    the packed sequence would hold no position at all (issue 39's crash)."""
    ids, mask = _batch(vocab, seed=3)
    truncated = torch.ones(8, dtype=torch.bool)
    if case == "partly":
        truncated[:] = False
        truncated[[0, 3, 4, 6]] = True
    full = torch.randint(3, vocab, (8, K), generator=torch.Generator().manual_seed(4))
    ids[truncated, PROMPT:] = full[truncated]
    mask[truncated, PROMPT:] = 0
    if case == "all-one-token":
        ids, mask = ids[:, PROMPT - 1 :], mask[:, PROMPT - 1 :]
    return ids, mask


@pytest.mark.parametrize("algorithm", ["gtpo", "grpo"])
@pytest.mark.parametrize("case", ["partly", "all", "all-one-token"])
def test_masked_completions_give_trl_padded_scores_loss_and_gradients(
    tmp_path, tiny_model_path, monkeypatch, case, algorithm
):
    """A row that mask_truncated_completions masks scores 0 and adds no loss and no gradient, as in TRL's padded
    layout. With the packed layout forced, a micro-batch with some rows masked, all of them, or all of them with
    one-token prompts (which pack into no position: there TRL's path must run, not crash) gives TRL's padded
    per-token log-probs and entropies (within 1e-5) and, through `_compute_loss` (dapo, off-policy so the ratio
    moves), the loss of the same call with `use_prefix_sharing=False` (within 1e-5) and its parameter gradients
    (‖Δg‖/‖g‖ ≤ 1e-4 per tensor, so exactly zero where TRL's are, and on the same parameters)."""
    monkeypatch.setenv(layout_choice.LAYOUT_ENV, "packed")  # the user's override: pack whatever the costs say
    packed_calls = []
    original = prefix_sharing.packed_logps
    monkeypatch.setattr(prefix_sharing, "packed_logps", lambda *a: packed_calls.append(1) or original(*a))
    trainer = _trainer(
        tmp_path, tiny_model_path, algorithm=algorithm, loss_type="dapo", mask_truncated_completions=True,
        initial_entropy=1.0,
    )  # fmt: skip
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train, which this test does not run
    model = trainer.model
    ids, mask = _masked_batch(model.config.vocab_size, case)
    prompt = ids.size(1) - K

    logps, entropies, _ = trainer._get_per_token_logps_and_entropies(model, ids, mask, K, compute_entropy=True)
    trl_logps, trl_entropies, _ = _trl(trainer, model, ids, mask, compute_entropy=True)
    assert bool(packed_calls) == (case != "all-one-token")  # the packed layout ran wherever it has positions
    torch.testing.assert_close(logps, trl_logps, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropies, trl_entropies, atol=1e-5, rtol=0)

    generator = torch.Generator().manual_seed(5)
    inputs = dict(
        prompt_ids=ids[:, :prompt], prompt_mask=mask[:, :prompt], completion_ids=ids[:, prompt:],
        completion_mask=mask[:, prompt:], advantages=torch.randn(8, generator=generator),
        num_items_in_batch=mask[:, prompt:].sum(),
        old_per_token_logps=trl_logps.detach() + 0.1 * torch.randn(8, K, generator=generator),
    )  # fmt: skip
    losses, gradients = [], []
    for sharing in (True, False):
        trainer.args.use_prefix_sharing = sharing
        model.zero_grad()
        loss = trainer._compute_loss(model, inputs)
        loss.backward()
        losses.append(loss.detach())
        gradients.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    torch.testing.assert_close(losses[0], losses[1], atol=1e-5, rtol=0)
    assert gradients[0].keys() == gradients[1].keys() and len(gradients[0]) > 0
    for name, expected in gradients[1].items():
        assert (gradients[0][name] - expected).norm() <= 1e-4 * expected.norm(), name


class _Truncated(GTPOTrainer):
    """Every completion runs to max_completion_length without EOS or padding, so TRL counts each as truncated."""

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        special = set(self._tokenizer.all_special_ids)
        tokens = [t for t in range(self.model.config.vocab_size) if t not in special][: self.max_completion_length]
        return [tokens[row % 2 :] + tokens[: row % 2] for row in range(len(prompt_ids))], None


@pytest.mark.parametrize("algorithm", ["gtpo", "grpo"])
def test_training_step_with_every_completion_truncated_and_masked(tmp_path, tiny_model_path, algorithm):
    """TRL's test_train_with_mask_truncated_completions*, run with GTPOTrainer (issue 39): with
    mask_truncated_completions=True, loss_type="dapo", G = 3 and every completion truncated, a training step on
    one-token prompts (each micro-batch packs into no position) runs, and its update equals the one TRL's padded
    layout gives (use_prefix_sharing=False)."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    prompts = ["a", "b", "C", "x"]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    assert all(len(tokenizer(p, add_special_tokens=False).input_ids) == 1 for p in prompts)  # the crash's premise
    updates = []
    for sharing in (True, False):
        args = GTPOConfig(
            output_dir=str(tmp_path / f"out-{sharing}"), use_cpu=True, bf16=False, report_to=[], num_generations=3,
            per_device_train_batch_size=3, max_completion_length=8, max_steps=1, save_strategy="no", seed=0,
            disable_tqdm=True, algorithm=algorithm, loss_type="dapo", mask_truncated_completions=True,
            initial_entropy=1.0, use_prefix_sharing=sharing, **SGD,
        )  # fmt: skip
        trainer = _Truncated(
            model=tiny_model_path, reward_funcs=table_reward, args=args,
            train_dataset=Dataset.from_dict({"prompt": prompts}),
        )  # fmt: skip
        before = trainable_state(trainer.model)
        trainer.train()
        assert trainer.state.log_history[0]["completions/clipped_ratio"] == 1.0  # every completion truncated
        after = trainable_state(trainer.model)
        updates.append({name: after[name] - before[name] for name in before})
    for name, expected in updates[1].items():
        assert (updates[0][name] - expected).norm() <= 1e-4 * expected.norm() + 1e-7, name


# ------------------------------------------------------------------ the layout rule, against the GPU figures on record
GPU_LOGS = Path(__file__).resolve().parents[2] / "docs" / "measurements" / "gpu-h200-20261126"


def _recorded_step(log: str) -> tuple[dict, int, list[int]]:
    """Forward + backward ms per arm, the prompt length and the completion lengths of a bench_loss_step.py log."""
    import re

    text = (GPU_LOGS / log).read_text()
    times = {m[0]: float(m[1]) for m in re.findall(r"^(\S+)\s+forward .* forward\+backward ([\d.]+) ms", text, re.M)}
    prompt = int(re.search(r"prompt (\d+) tokens", text)[1])
    lengths = [int(n) for n in re.search(r"completion lengths \[([\d, ]+)\]", text)[1].split(",")]
    return times, prompt, lengths


def _qwen_config(**width):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=151936, tie_word_embeddings=True, **width)


PAPER_VOCAB = dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=64)  # fmt: skip
QWEN_15B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                num_key_value_heads=2, head_dim=128)  # fmt: skip
QWEN_3B = dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
               num_key_value_heads=2, head_dim=128)  # fmt: skip


@pytest.mark.parametrize("log, width", [("step-t07.log", PAPER_VOCAB), ("qwen-t07.log", QWEN_15B)])
def test_layout_rule_picks_the_layout_that_was_faster_on_the_gpu(log, width):
    """On CUDA the rule packs only where packing measured faster on the H200 (docs/measurements/gpu-h200-20261126):
    not at the host-bound 2-layer paper-vocabulary shape (1.37x TRL packed, 1.11x padded), yes at Qwen2.5-1.5B's
    config (0.91x against 1.05x). Its overhead constant is that log's packed - padded difference; on a CPU the FLOP
    count alone decides, and packs both."""
    times, prompt, lengths = _recorded_step(log)
    padded_length = prompt + max(lengths)  # TRL's (B, L): every row the prompt plus the longest completion
    packed_length = prompt - 1 + sum(lengths)  # each prompt once (less its last token), each completion token once
    config = _qwen_config(**width)
    faster_packed = times["gtpo"] < times["gtpo-padded"]
    assert layout_choice.packed_is_cheaper(config, 8, padded_length, packed_length, "cuda") == faster_packed
    assert layout_choice.packed_is_cheaper(config, 8, padded_length, packed_length, "cpu")
    if log == "step-t07.log":
        measured = (times["gtpo"] - times["gtpo-padded"]) / 1e3
        assert layout_choice.LAYOUT_COSTS["cuda"].overhead_s == pytest.approx(measured, abs=1e-4)


def test_layout_rule_packs_qwen3b_and_long_completions_on_cuda():
    """Qwen2.5-3B's config with completions of 256-512 tokens after a 203-token prompt (issue 39's 3B shape): packing
    saves far more than its overhead; and a group of identical lengths saves nothing, so stays padded."""
    lengths = [256 + 32 * i for i in range(8)]
    config = _qwen_config(**QWEN_3B)
    assert layout_choice.packed_is_cheaper(config, 8, 203 + 512, 202 + sum(lengths), "cuda")
    assert not layout_choice.packed_is_cheaper(config, 8, 203 + 256, 8 * (203 + 256), "cuda")


def test_a_batch_that_cannot_pay_for_packing_skips_the_layout_checks_and_pack(monkeypatch):
    """Where even the best packing (one prompt, one-token completions) would not save its overhead, the decision is
    made from the shapes alone: neither the layout checks nor `pack` (their host syncs) run, and TRL's padded path
    scores the batch. Simulated on the CPU by giving "cpu" the GPU's overhead."""
    from types import SimpleNamespace

    monkeypatch.setitem(layout_choice.LAYOUT_COSTS, "cpu", layout_choice.LAYOUT_COSTS["cuda"])
    for name in ("layout_problem", "pack"):
        monkeypatch.setattr(prefix_sharing, name, lambda *a, **k: pytest.fail("ran before the shape-only decision"))
    monkeypatch.setattr(prefix_sharing, "problem", lambda *a: None)
    config = _qwen_config(**PAPER_VOCAB)
    trainer = SimpleNamespace(accelerator=SimpleNamespace(unwrap_model=lambda m: m))
    model = SimpleNamespace(config=config)
    calls = []

    def padded(*args, **kwargs):
        calls.append(args[1].shape)
        return "padded"

    ids, mask = torch.zeros(8, 454, dtype=torch.long), torch.ones(8, 454, dtype=torch.long)
    result = prefix_sharing.per_token_logps_and_entropies(trainer, padded, model, ids, mask, 251, None, True, False, {})
    assert result == "padded" and calls == [(8, 454)]


def test_packed_sampling_entropies_land_where_trl_padded_ones_do(tmp_path, tiny_model_path):
    """At T = 0.7 the single-pass head sets aside the tempered (sampling) entropies, TRL's `entropy` metric, for the
    rows it projects; the packed layout projects only its scored positions and lays them back out in TRL's (B, L-1)
    layout (by host-planned indices, no sync). Each completion token's value must be the one TRL's padded layout gives
    that token: a permutation among the scored positions would keep every mean and move every token."""
    from gtpo.forward import untempered

    trainer = GTPOTrainer(
        model=tiny_model_path, reward_funcs=table_reward, train_dataset=make_dataset(8),
        args=GTPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], num_generations=4,
                        per_device_train_batch_size=8, max_completion_length=K, temperature=0.7),
    )  # fmt: skip
    model = trainer.model
    ids, mask = _batch(model.config.vocab_size)
    scored = untempered.scored_positions(mask, K)
    laid_out = []
    for score in (trainer._get_per_token_logps_and_entropies, lambda *a, **k: _trl(trainer, *a[:3], **k)):
        with untempered.untempered_entropy(True, False, scored) as capture:
            score(model, ids, mask, K, compute_entropy=True)
        assert len(capture.sampling) == 1
        laid_out.append(untempered.completion_layout(capture.sampling[0], mask, K))  # (B, K)
    packed, padded = laid_out
    assert (padded[mask[:, PROMPT:] == 1] > 0).all()  # real entropies, distinct per token
    assert torch.allclose(packed, padded, rtol=1e-5, atol=1e-6), (packed - padded).abs().max()
