"""The completion record (completions/completions_{step:05d}.parquet): its columns, resume, and that it changes nothing.

The columns are compared with quantities derived here independently: the table's texts and rewards, TRL's
advantage formula by hand, the conflict spans by a brute-force scan of each group, λ from Eq. 5's rule, ⟨H⟩_i from a
plain forward of the model, δ and A' from Eq. 6-7 on the recorded ⟨H⟩_i.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).parent))
from test_trainer import FixedGTPO, StopAt, settings  # noqa: E402

from gtpo import GTPOConfig, GTPOTrainer  # noqa: E402
from gtpo.errors import InvalidInput  # noqa: E402
from gtpo.runs import completions as record_files  # noqa: E402
from trainer_helpers import TABLE, make_dataset, max_abs_diff, table_reward, trainable_state  # noqa: E402

G = 4
ALL = dict(log_completions_max_groups=None)  # both groups of TABLE's steps (the default keeps the first)


def _train(trainer_cls, tiny_model_path, args, dataset=None, callbacks=None):
    trainer = trainer_cls(
        model=tiny_model_path, reward_funcs=table_reward, args=args, train_dataset=dataset or make_dataset(),
        callbacks=callbacks,
    )  # fmt: skip
    trainer.train()
    return trainer


def _brute_force_spans(ids: list[list[int]], signs: list[int]) -> tuple[list[int], list[int]]:
    """Sec. 5.1 by definition: position p (from the start, or offset p from the end) is a conflict of a completion
    with A != 0 when its token also stands there in a completion with A > 0 and in one with A < 0."""

    def run(aligned):  # aligned[i][p]: completion i's token at aligned position p (None past its end)
        spans = []
        for i in range(len(ids)):
            p = 0
            while signs[i] and p < len(ids[i]):
                same = [j for j in range(len(ids)) if p < len(ids[j]) and aligned[j][p] == aligned[i][p]]
                if not ({1, -1} <= {signs[j] for j in same}):
                    break
                p += 1
            spans.append(p)
        return spans

    return run(ids), run([list(reversed(row)) for row in ids])


def test_record_columns_match_a_hand_built_group(tmp_path, tiny_model_path):
    """Every gtpo column of a recorded GTPO step equals its independent derivation (the group is TABLE's)."""
    # The threshold splits the rows: the median ⟨H⟩_i of a first, unfiltered record of the same step.
    probe = GTPOConfig(**settings(tmp_path / "probe", learning_rate=0.0, entropy_filter="never", **ALL))
    _train(FixedGTPO, tiny_model_path, probe)
    threshold = sorted(record_files.read_step(probe.output_dir, 1)["columns"]["mean_entropy"])[3]
    args = GTPOConfig(
        **settings(
            tmp_path, learning_rate=0.0, entropy_filter="always", entropy_threshold=threshold, entropy_gamma=0.1, **ALL
        )
    )
    trainer = _train(FixedGTPO, tiny_model_path, args)
    record = record_files.read_step(args.output_dir, 1)
    c, meta = record["columns"], record["metadata"]
    assert record_files.recorded_steps(args.output_dir) == [1]
    assert meta["lambda_applied"] and meta["group_size"] == G and meta["groups_in_step"] == 2 and len(c["step"]) == 8
    tokenizer = trainer.processing_class
    texts = [m[0]["content"] for m in c["completion"]]
    table = dict(TABLE)
    for i, text in enumerate(texts):
        assert c["completion_ids"][i] == tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        assert "".join(c["completion_tokens"][i]) == tokenizer.decode(c["completion_ids"][i])
        assert c["reward"][i] == c["table_reward"][i] == table[text]
        assert c["group"][i] == i // G
    # TRL's A_i (Eq. 8, scale_rewards="group"): (R - mean) / (unbiased std + 1e-4); each group holds 1, 1, 0, 0.
    a = 0.5 / (torch.tensor([1.0, 1.0, 0.0, 0.0]).std().item() + 1e-4)
    assert c["advantage"] == pytest.approx([a if r else -a for r in c["reward"]], rel=1e-6)
    # Spans by brute force over each group; λ by Eq. 5 (union): 2 on a positive's span tokens, 0 on a negative's.
    for g in range(2):
        rows = range(g * G, (g + 1) * G)
        signs = [1 if c["advantage"][i] > 0 else -1 for i in rows]
        forward, backward = _brute_force_spans([c["completion_ids"][i] for i in rows], signs)
        assert [c["forward_span"][i] for i in rows] == forward and [c["backward_span"][i] for i in rows] == backward
        for i, f, b, sign in zip(rows, forward, backward, signs, strict=True):
            n = len(c["completion_ids"][i])
            positions = sorted(set(range(f)) | set(range(n - b, n)))
            assert c["lambda_positions"][i] == positions
            assert c["lambda_values"][i] == [2.0 if sign > 0 else 0.0] * len(positions)
    assert min(c["forward_span"]) > 0 and min(c["backward_span"]) > 0  # the control: the table does conflict
    # ⟨H⟩_i: a plain forward of the (unchanged, lr 0) model over prompt + completion, temperature 1.
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path).eval()
    for i in range(8):
        text = tokenizer.apply_chat_template(c["prompt"][i], add_generation_prompt=True, tokenize=False)
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([list(prompt) + c["completion_ids"][i]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].double()
        logp = torch.log_softmax(logits, dim=-1)
        mean_h = -(logp.exp() * logp).sum(-1).mean().item()
        assert c["mean_entropy"][i] == pytest.approx(mean_h, abs=1e-4)
    # δ (Eq. 6, "always"): dropped above the threshold; A' (Eq. 7) = δ (A - γ⟨H⟩).
    assert 0 < sum(c["entropy_filtered"]) < 8  # the control: the threshold splits the rows
    rows = zip(c["mean_entropy"], c["entropy_filtered"], c["advantage"], c["advantage_used"], strict=True)
    for h, dropped, adv, used in rows:
        assert dropped == (h > threshold)
        assert used == pytest.approx(0.0 if dropped else adv - 0.1 * h, abs=1e-5)


def test_grpo_records_spans_and_lambda_for_the_record_only(tmp_path, tiny_model_path):
    """A GRPO run records the spans and λ GTPO would apply (flagged not applied), its own A_i and no filter."""
    gtpo_args = GTPOConfig(**settings(tmp_path / "gtpo", learning_rate=0.0, initial_entropy=1.0, **ALL))
    grpo_args = GTPOConfig(**settings(tmp_path / "grpo", learning_rate=0.0, algorithm="grpo", **ALL))
    _train(FixedGTPO, tiny_model_path, gtpo_args)
    _train(FixedGTPO, tiny_model_path, grpo_args)
    gtpo, grpo = (record_files.read_step(a.output_dir, 1) for a in (gtpo_args, grpo_args))
    assert gtpo["metadata"]["lambda_applied"] and not grpo["metadata"]["lambda_applied"]
    for name in ("completion_ids", "forward_span", "backward_span", "lambda_positions", "lambda_values", "advantage"):
        assert grpo["columns"][name] == gtpo["columns"][name], name
    c = grpo["columns"]
    assert c["advantage_used"] == c["advantage"] and not any(c["entropy_filtered"])
    # TRL's entropy at temperature 1 is GTPO's temperature-1 ⟨H⟩_i.
    assert c["mean_entropy"] == pytest.approx(gtpo["columns"]["mean_entropy"], abs=1e-5)


@pytest.mark.parametrize("algorithm", ["gtpo", "grpo"])
def test_recording_changes_no_update(tmp_path, tiny_model_path, algorithm):
    """Sampled completions, two steps of two micro-batches each: the weights with the record on and off are equal
    bit for bit (recording draws no random number and touches no tensor the update reads)."""
    common = dict(
        max_steps=2, learning_rate=1e-2, per_device_train_batch_size=4, gradient_accumulation_steps=2,
        initial_entropy_prompts=4, algorithm=algorithm, **ALL,
    )  # fmt: skip
    on = _train(GTPOTrainer, tiny_model_path, GTPOConfig(**settings(tmp_path / "on", log_completions=True, **common)))
    off = _train(
        GTPOTrainer, tiny_model_path, GTPOConfig(**settings(tmp_path / "off", log_completions=False, **common))
    )
    assert max_abs_diff(trainable_state(on.model), trainable_state(off.model)) == 0
    assert record_files.recorded_steps(on.args.output_dir) == [1, 2]
    assert record_files.recorded_steps(off.args.output_dir) == []
    # Two micro-batches per step: every row got its loss-side values from the micro-batch that held it.
    assert None not in record_files.read_step(on.args.output_dir, 2)["columns"]["mean_entropy"]


@pytest.mark.parametrize("guard", [False, True])
def test_killed_and_resumed_run_records_each_step_once(tmp_path, tiny_model_path, guard):
    """Stopped after step 3 (checkpoint at 2) and resumed: steps 1-4 recorded once each, the resumed steps equal to
    an uninterrupted run's, and no partial file left; with the stall guard too (its λ is recorded)."""
    common = dict(
        max_steps=4, save_strategy="steps", save_steps=2, learning_rate=1e-2, per_device_train_batch_size=4,
        initial_entropy_prompts=4, conflict_guard=guard,
    )  # fmt: skip
    full = _train(GTPOTrainer, tiny_model_path, GTPOConfig(**settings(tmp_path / "full", **common)))
    args = GTPOConfig(**settings(tmp_path / "cut", **common))
    _train(GTPOTrainer, tiny_model_path, args, callbacks=[StopAt(3)])
    assert record_files.recorded_steps(args.output_dir) == [1, 2, 3]
    stale = record_files.record_path(args.output_dir, 9)  # a step the resumed run never reaches
    stale.write_bytes(record_files.record_path(args.output_dir, 3).read_bytes())
    resumed = GTPOTrainer(model=tiny_model_path, reward_funcs=table_reward, args=args, train_dataset=make_dataset())
    resumed.train(resume_from_checkpoint=str(Path(args.output_dir) / "checkpoint-2"))
    assert record_files.recorded_steps(args.output_dir) == [1, 2, 3, 4]
    for step in (1, 2, 3, 4):
        cut, ref = (record_files.read_step(a.output_dir, step)["columns"] for a in (args, full.args))
        assert cut["step"] == [step] * 4
        assert cut["completion_ids"] == ref["completion_ids"] and cut["lambda_positions"] == ref["lambda_positions"]
        assert cut["lambda_values"] == ref["lambda_values"]
        assert record_files.read_step(args.output_dir, step)["metadata"]["conflict_guard"] is guard
    assert not list((Path(args.output_dir) / record_files.RECORD_DIR).glob(".*"))


def test_max_groups_caps_the_record(tmp_path, tiny_model_path):
    """log_completions_max_groups (default 1) keeps the first groups of each step; the metadata says how many there
    were."""
    args = GTPOConfig(**settings(tmp_path, learning_rate=0.0, initial_entropy=1.0))
    _train(FixedGTPO, tiny_model_path, args)
    record = record_files.read_step(args.output_dir, 1)
    assert record["columns"]["group"] == [0] * G and record["metadata"]["groups_in_step"] == 2
    with pytest.raises(ValueError, match="log_completions_max_groups must be an integer >= 1"):
        GTPOConfig(**settings(tmp_path, log_completions_max_groups=0))


def test_reading_a_missing_or_damaged_record_fails_in_one_line(tmp_path):
    with pytest.raises(InvalidInput, match="it has no record; record completions with log_completions=true"):
        record_files.read_step(tmp_path, 3)
    path = record_files.record_path(tmp_path, 3)
    path.parent.mkdir()
    path.write_bytes(b"not parquet")
    with pytest.raises(InvalidInput, match="not a readable parquet file"):
        record_files.read_step(tmp_path, 3)
    with pytest.raises(InvalidInput, match=r"completions_00004.parquet not found: it has steps 3..3"):
        record_files.read_step(tmp_path, 4)


def test_inspect_renders_a_recorded_group_without_the_model(tmp_path, tiny_model_path, monkeypatch, capsys):
    """`gtpo inspect --run` shows the recorded spans, λ and δ of a step; loading a model or tokenizer would fail."""
    import gtpo.models
    from gtpo.cli.inspect import run_inspect

    args = GTPOConfig(**settings(tmp_path, learning_rate=0.0, initial_entropy=1.0, algorithm="grpo", **ALL))
    _train(FixedGTPO, tiny_model_path, args)

    def no_model(*a, **k):
        raise AssertionError("gtpo inspect --run loaded a model")

    monkeypatch.setattr(gtpo.models, "load_model", no_model)
    monkeypatch.setattr(gtpo.models, "load_tokenizer", no_model)
    out = tmp_path / "inspect"
    assert run_inspect(["--run", args.output_dir, "--index", "1", "-o", str(out), "--color", "never"]) == 0
    text = capsys.readouterr().out
    assert "recorded step 1, group 1 of 2 (grpo); λ computed for the record only (not applied)" in text
    assert "⟦Let us think.⟧ It is seven⟪.<|im_end|>⟫" in text  # a negative completion's spans, from the record
    saved = json.loads((out / "group.json").read_text())
    recorded = record_files.read_step(args.output_dir, 1)["columns"]
    assert [r["forward_span_len"] for r in saved["completions"]] == recorded["forward_span"][G:]
    assert [r["tokens"] for r in saved["completions"]] == recorded["completion_tokens"][G:]
    assert (out / "group.png").is_file()
    with pytest.raises(InvalidInput, match="recorded groups 0..1"):
        run_inspect(["--run", args.output_dir, "--index", "5", "-o", str(out)])
    with pytest.raises(InvalidInput, match="--step reads a run's completion record: give --run"):
        run_inspect(["--step", "1"])


def test_console_table_only_when_asked_and_wandb_gets_the_table(tmp_path, tiny_model_path, monkeypatch):
    """TRL prints its rich table whenever log_completions is on; gtpo only with print_completions. A wandb run
    receives one `completions` table per logged step, with gtpo's columns."""
    import trl.trainer.utils
    from trl.trainer import grpo_trainer as trl_grpo

    printed, logged = [], []
    monkeypatch.setattr(trl.trainer.utils, "print_prompt_completions_sample", lambda *a, **k: printed.append(a[4]))
    monkeypatch.setattr(trl_grpo, "print_prompt_completions_sample", lambda *a, **k: printed.append(a[4]))

    class FakeWandb:
        run = object()

        class Table:
            def __init__(self, dataframe):
                self.dataframe = dataframe

        @staticmethod
        def log(data):
            logged.append(data["completions"].dataframe)

    monkeypatch.setattr(trl_grpo, "wandb", FakeWandb, raising=False)
    quiet = GTPOConfig(**settings(tmp_path / "quiet", learning_rate=0.0, initial_entropy=1.0))
    _train(FixedGTPO, tiny_model_path, quiet)
    assert printed == [] and logged == []
    loud = GTPOConfig(**settings(tmp_path / "loud", learning_rate=0.0, initial_entropy=1.0, print_completions=True))
    trainer = FixedGTPO(model=tiny_model_path, reward_funcs=table_reward, args=loud, train_dataset=make_dataset())
    trainer.args.report_to = ["wandb"]  # after the trainer's integrations are chosen: no real wandb callback
    trainer.train()
    assert printed == [1] and len(logged) == 1
    assert {"mean_entropy", "entropy_filtered", "forward_span", "advantage_used"} <= set(logged[0].columns)


def test_a_column_arrow_cannot_type_is_kept_as_json(tmp_path):
    """Chat messages whose content is text in one row and a list of parts in another cannot be one arrow column; the
    record keeps them (as JSON text in the file) and reads them back as they were, instead of failing the step."""
    prompts = [[{"role": "user", "content": "What is 2 + 2?"}], [{"role": "user", "content": [{"type": "text"}]}]]
    meta = dict.fromkeys(record_files.METADATA_FIELDS)
    record_files.write_step(tmp_path, 1, {"prompt": prompts, "reward": [1.0, 0.0]}, meta)
    back = record_files.read_step(tmp_path, 1)
    assert back["columns"]["prompt"] == prompts and back["columns"]["reward"] == [1.0, 0.0]
    assert back["metadata"]["json_columns"] == ["prompt"]
