"""GTPOTrainer / GTPOConfig on the tiny local model, compared with TRL's own GRPOTrainer and with itself.

Parameter-update comparisons use plain SGD without gradient clipping, so the update is the gradient
itself (Adam's first step is nearly sign(g) and clipping rescales: both would hide a wrong scale).
"""

from __future__ import annotations

import inspect
import json
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
import trl  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from gtpo import GTPOConfig, GTPOTrainer, core  # noqa: E402
from gtpo.trainer import initial_entropy as entropy_init  # noqa: E402
from trainer_helpers import FixedGeneration, make_dataset, max_abs_diff, table_reward, trainable_state  # noqa: E402

GTPO_CORE_KEYS = {
    "gtpo/conflict_token_frac",
    "gtpo/forward_span_len",
    "gtpo/backward_span_len",
    "gtpo/protected_negative_frac",
    "gtpo/filtered_frac",
    "gtpo/mean_lambda",
    "gtpo/mean_entropy",
    "gtpo/sign_flipped_frac",
}


class FixedGTPO(FixedGeneration, GTPOTrainer):
    pass


class FixedGRPO(FixedGeneration, GRPOTrainer):
    pass


def settings(tmp_path, **overrides) -> dict:
    base = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        max_steps=1,
        report_to=[],
        use_cpu=True,
        bf16=False,
        logging_steps=1,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
        gradient_checkpointing=False,
    )
    base.update(overrides)
    return base


SGD = dict(optim="sgd", learning_rate=1.0, max_grad_norm=0.0, lr_scheduler_type="constant")
# GRPOConfig's loss options that compose with GTPO (docs/core.md); two steps on one generation batch
# (num_iterations=2), so that the second step's ratio, clipping, delta and off-policy mask see a moved policy.
GTPO_OFF = dict(conflict_correction=False, entropy_filter="never", entropy_gamma=0.0)
MOVED = dict(num_iterations=2, max_steps=2, learning_rate=0.05)
LOSS_OPTIONS = {
    "beta": dict(beta=0.04),
    "sequence-level-ratio": dict(importance_sampling_level="sequence", **MOVED),
    "delta": dict(delta=1.5, epsilon_high=0.2, **MOVED),
    "top-entropy": dict(top_entropy_quantile=0.5),
    "off-policy-mask": dict(off_policy_mask_threshold=0.001, **MOVED),
}


class LogCollector(TrainerCallback):
    """What every report_to integration receives: the `logs` dict of `on_log`."""

    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs or {}))


def run(trainer_cls, tiny_model_path, args, reward=table_reward, dataset=None, **kwargs):
    trainer = trainer_cls(
        model=tiny_model_path, reward_funcs=reward, args=args, train_dataset=dataset or make_dataset(), **kwargs
    )
    before = trainable_state(trainer.model)
    trainer.train()
    return trainer, before, trainable_state(trainer.model)


# ---------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(entropy_coef=0.01), "set entropy_coef=0.0 and tune entropy_gamma"),
        (dict(use_adaptive_entropy=True), "set it False and tune entropy_gamma"),
        (dict(num_generations=1), "at least 2 completions per prompt"),
        (dict(entropy_filter="sometimes"), "entropy_filter='sometimes'"),
        (dict(conflict_combine="sum"), "conflict_combine"),
        (dict(gtpo_aggregation="token"), "gtpo_aggregation"),
        (dict(entropy_term="bonus"), "entropy_term"),
        (dict(entropy_temperature="tempered"), "entropy_temperature='tempered'"),
        (dict(algorithm="ppo"), "algorithm"),
        (dict(entropy_threshold=0.0), "entropy_threshold"),
        (dict(entropy_gamma=-0.1), "entropy_gamma"),
        (dict(conflict_positive_weight=float("inf")), "conflict_positive_weight"),
        (dict(conflict_negative_weight=-1.0), "conflict_negative_weight"),
        (dict(conflict_span_sides="middle"), "conflict_span_sides='middle'"),
        (dict(conflict_guard="yes"), "conflict_guard must be True or False"),
        (dict(conflict_guard=True, conflict_correction=False), "nothing for it to act on"),
        (dict(conflict_guard=True, authors_code=True), "choose one"),
        (dict(conflict_guard=True, conflict_positive_weight=1.0), "conflict_positive_weight=1.0"),
        (dict(conflict_guard=True, conflict_negative_weight=1.0), "conflict_negative_weight=1.0"),
        (dict(conflict_guard=True, conflict_combine="product"), "conflict_combine='product'"),
        (dict(initial_entropy=float("nan")), "initial_entropy"),
        (dict(initial_entropy_prompts=0), "initial_entropy_prompts"),
        (dict(loss_type="cispo", entropy_term="differentiable"), "counted steps_per_generation times"),
        (dict(loss_type="dapo", gtpo_aggregation="reference"), "both choose the loss aggregation"),
        (dict(loss_type="dapo", entropy_term="differentiable"), "counted steps_per_generation times"),
        (dict(gtpo_aggregation="reference", entropy_term="differentiable"), "micro-batch size"),
    ],
)
def test_config_rejects_bad_values_with_a_clear_message(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=__import__("re").escape(message)):
        GTPOConfig(**settings(tmp_path, **overrides))


def test_config_accepts_vllm_with_trl_importance_sampling_correction(tmp_path):
    # vLLM's sampling/trainer mismatch correction (TRL's default with use_vllm) is applied by the GTPO
    # loss (core.gtpo_loss importance_weights), so it need not be switched off.
    args = GTPOConfig(**settings(tmp_path, use_vllm=True))
    assert args.use_vllm and args.vllm_importance_sampling_correction


def test_grpo_algorithm_keeps_trl_options(tmp_path):
    args = GTPOConfig(**settings(tmp_path, algorithm="grpo", beta=0.04, loss_type="dapo"))
    assert (args.beta, args.loss_type, args.gtpo_enabled) == (0.04, "dapo", False)


def test_defaults_follow_the_paper_and_resolve_bf16_by_device(tmp_path):
    args = GTPOConfig(output_dir=str(tmp_path), report_to=[])
    assert args.algorithm == "gtpo" and args.beta == 0.0 and args.loss_type == "grpo"
    assert args.conflict_positive_weight == 2.0 and args.conflict_combine == "union"
    assert args.entropy_filter == "auto" and math.isclose(args.entropy_threshold, math.log(2))
    assert args.entropy_gamma == 0.1 and args.gtpo_aggregation == "sequence"
    assert args.initial_entropy is None and args.initial_entropy_prompts == 100
    assert args.entropy_temperature == "model"  # Sec. 4.2: the model's own distribution, not the sampling one
    assert args.bf16 == bool(torch.accelerator.is_available())
    assert GTPOConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True).bf16 is False
    # The TRL default we override: bf16=True everywhere, which transformers refuses on a CPU-only machine.
    if torch.accelerator.is_available():
        assert GRPOConfig(output_dir=str(tmp_path), report_to=[]).bf16 is True
    else:
        with pytest.raises(ValueError, match="bf16"):
            GRPOConfig(output_dir=str(tmp_path), report_to=[])


def test_every_gtpo_field_is_documented_with_help():
    from dataclasses import fields

    ours = {f.name: f for f in fields(GTPOConfig)}.keys() - {f.name for f in fields(GRPOConfig)}
    assert ours == {
        "algorithm",
        "conflict_correction",
        "conflict_positive_weight",
        "conflict_combine",
        "conflict_exclude_common_prefix",
        "entropy_filter",
        "entropy_threshold",
        "entropy_gamma",
        "entropy_term",
        "gtpo_aggregation",
        "entropy_temperature",
        "initial_entropy",
        "initial_entropy_prompts",
        "use_prefix_sharing",
        "fast_generation",
        "log_completions_max_groups",
        "print_completions",
        "conflict_negative_weight",
        "conflict_span_sides",
        "conflict_guard",
        "conflict_count",
        "entropy_clamp",
        "logprob_temperature",
        "authors_code",
        "cuda_graph_generation",
    }
    for f in fields(GTPOConfig):
        if f.name in ours:
            assert len(f.metadata.get("help", "")) > 40, f.name


def test_gtpo_fields_parse_from_the_command_line(tmp_path):
    from transformers import HfArgumentParser

    parser = HfArgumentParser(GTPOConfig)
    (args,) = parser.parse_args_into_dataclasses(
        [
            "--output_dir",
            str(tmp_path),
            "--report_to",
            "none",
            "--use_cpu",
            "true",
            "--conflict_correction",
            "false",
            "--entropy_filter",
            "negative_only",
            "--initial_entropy",
            "0.5",
            "--gtpo_aggregation",
            "reference",
            "--conflict_combine",
            "product",
        ]
    )
    assert (args.conflict_correction, args.entropy_filter, args.initial_entropy) == (False, "negative_only", 0.5)
    assert (args.gtpo_aggregation, args.conflict_combine) == ("reference", "product")
    with pytest.raises(SystemExit):  # argparse lists the choices
        parser.parse_args_into_dataclasses(["--output_dir", str(tmp_path), "--entropy_filter", "sometimes"])


# ---------------------------------------------------------------------------------------------- pins


# Parameter lists of the TRL methods GTPOTrainer overrides or calls. A TRL upgrade that changes one
# must fail here, loudly, before it silently changes what the subclass does.
PINNED = {
    "__init__": (
        "self, model, reward_funcs, args, train_dataset, eval_dataset, processing_class, reward_processing_classes, "
        "callbacks, optimizers, quantization_config, peft_config, tools, rollout_func, environment_factory"
    ),
    "_generate_and_score_completions": "self, inputs",
    "_compute_loss": "self, model, inputs",
    "compute_loss": "self, model, inputs, return_outputs, num_items_in_batch",
    "_prepare_inputs": "self, generation_batch",
    "_save_checkpoint": "self, model, trial",
    "_load_optimizer_and_scheduler": "self, checkpoint",
    "_get_per_token_logps_and_entropies": (
        "self, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss, "
        "pixel_values, image_grid_thw, num_images, pixel_attention_mask, spatial_shapes, num_tiles, image_sizes, "
        "token_type_ids, mm_token_type_ids, image_position_ids"
    ),
    "_tokenize_prompts": "self, prompts",
    "_generate_single_turn": "self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images",
}


def test_trl_version_and_hook_signatures_are_pinned():
    assert trl.__version__.startswith("1.16"), f"GTPOTrainer was written against TRL 1.16, found {trl.__version__}"
    for name, expected in PINNED.items():
        params = ", ".join(inspect.signature(getattr(GRPOTrainer, name)).parameters)
        assert params == expected, f"GRPOTrainer.{name} changed: ({params})"
    # Our overrides accept exactly what TRL's do.
    for name in ("__init__", "_generate_and_score_completions", "_compute_loss", "_prepare_inputs"):
        ours = list(inspect.signature(getattr(GTPOTrainer, name)).parameters)
        assert ours == list(inspect.signature(getattr(GRPOTrainer, name)).parameters), name
    # The slicing the spans mirror, and the output keys they are stored beside.
    source = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    assert "self.accelerator.process_index * len(prompts)," in source
    assert "advantages = advantages[process_slice]" in source
    assert '"completion_mask": completion_mask,' in source and '"advantages": advantages,' in source
    assert "shuffle_sequence_dict(generation_batch)" in inspect.getsource(GRPOTrainer._prepare_inputs)
    # The fused LM head's kernel, wrapped for the temperature-1 entropy (gtpo.forward.untempered), and its arguments.
    from trl.trainer import utils as trl_utils

    assert hasattr(trl_utils, "_ChunkedLogProbFunction")
    fused = inspect.getsource(trl_utils.add_fused_lm_head)
    assert "per_token = _ChunkedLogProbFunction.apply(" in fused and "log_probs, entropy, log_sum_sq_probs" in fused


# ---------------------------------------------------------------------------------------------- bad input


def test_trainer_needs_a_gtpo_config(tmp_path, tiny_model_path):
    with pytest.raises(TypeError, match="GTPOConfig"):
        GTPOTrainer(
            model=tiny_model_path,
            reward_funcs=table_reward,
            args=GRPOConfig(**settings(tmp_path)),
            train_dataset=make_dataset(),
        )


def test_dataset_without_prompt_column_is_rejected(tmp_path, tiny_model_path):
    data = make_dataset().rename_column("prompt", "question")
    with pytest.raises(ValueError, match=r"train_dataset has no 'prompt' column \(columns: \['question', 'answer'\]\)"):
        GTPOTrainer(
            model=tiny_model_path, reward_funcs=table_reward, args=GTPOConfig(**settings(tmp_path)), train_dataset=data
        )


@pytest.mark.parametrize("dataset", [None, "empty"])
def test_auto_filter_without_training_prompts_is_refused_when_the_trainer_is_built(tmp_path, tiny_model_path, dataset):
    # No dataset at all: TRL's own check fires first ("`train_dataset` is required"); an empty one: ours.
    data = make_dataset().select([]) if dataset == "empty" else None
    pattern = (
        r"no train_dataset \(or it is empty\); set GTPOConfig.initial_entropy" if data is not None else "train_dataset"
    )
    with pytest.raises(ValueError, match=pattern):
        GTPOTrainer(
            model=tiny_model_path, reward_funcs=table_reward, args=GTPOConfig(**settings(tmp_path)), train_dataset=data
        )


def raises_on_seven(completions, **kwargs):
    return [1.0 / 0 if "seven" in c[0]["content"] else 1.0 for c in completions]


def one_reward_short(completions, **kwargs):
    return [1.0] * (len(completions) - 1)


def nan_on_six(completions, **kwargs):
    return [float("nan") if "six" in c[0]["content"] else 0.0 for c in completions]


async def async_raises_on_seven(completions, **kwargs):
    return raises_on_seven(completions)


def text_reward(completions, **kwargs):
    return ["good" for _ in completions]


@pytest.mark.parametrize(
    "reward, pattern",
    [
        (raises_on_seven, r"reward function 'raises_on_seven' raised ZeroDivisionError: .* on row \d+ .*It is seven"),
        (one_reward_short, r"reward function 'one_reward_short' returned 7 rewards for 8 completions"),
        (nan_on_six, r"reward function 'nan_on_six' returned nan .* on row \d+ .*answer is six"),
        (text_reward, r"reward function 'text_reward' returned a str \('good'\), not a number on row 0"),
        (
            async_raises_on_seven,
            r"reward function 'async_raises_on_seven' raised ZeroDivisionError: .* on row \d+ .*It is seven",
        ),
    ],
)
def test_bad_reward_function_fails_naming_function_and_row(tmp_path, tiny_model_path, reward, pattern):
    args = GTPOConfig(**settings(tmp_path, initial_entropy=1.0))
    trainer = FixedGTPO(
        model=tiny_model_path, reward_funcs=[table_reward, reward], args=args, train_dataset=make_dataset()
    )
    with pytest.raises(ValueError, match=pattern):
        trainer.train()


def test_reward_functions_keep_their_names_and_none_stays_allowed(tmp_path, tiny_model_path):
    def sometimes_none(completions, **kwargs):
        return [None if i % 2 else 1.0 for i in range(len(completions))]

    args = GTPOConfig(**settings(tmp_path, initial_entropy=1.0))
    trainer, _, _ = run(FixedGTPO, tiny_model_path, args, reward=[table_reward, sometimes_none])
    assert trainer.reward_func_names == ["table_reward", "sometimes_none"]
    logged = trainer.state.log_history[0]
    assert logged["rewards/sometimes_none/mean"] == 1.0


# ---------------------------------------------------------------------------------------------- training


def test_two_step_run_updates_parameters_and_logs_gtpo_metrics(tmp_path, tiny_model_path):
    collector = LogCollector()
    args = GTPOConfig(
        **settings(
            tmp_path,
            max_steps=2,
            initial_entropy_prompts=4,
            gradient_checkpointing=True,
            eval_strategy="steps",
            eval_steps=2,
            per_device_eval_batch_size=8,
            learning_rate=1e-3,
        )
    )
    trainer, before, after = run(
        FixedGTPO, tiny_model_path, args, dataset=make_dataset(16), eval_dataset=make_dataset(4), callbacks=[collector]
    )
    assert trainer.ref_model is None and not hasattr(trainer.model, "peft_config")
    assert max_abs_diff(before, after) > 0
    train_logs = [log for log in collector.logs if "loss" in log]
    assert len(train_logs) == 2
    for log in train_logs:
        assert GTPO_CORE_KEYS | {"gtpo/initial_entropy"} <= log.keys()
        assert {"reward", "entropy", "completions/mean_length", "rewards/table_reward/mean"} <= log.keys()
        assert log["gtpo/conflict_token_frac"] > 0 and log["gtpo/protected_negative_frac"] > 0  # the table conflicts
    # Random tiny model over a 512-token vocabulary: near-uniform, ⟨H⟩_ini just under ln 512.
    assert 5.5 < trainer.initial_entropy <= math.log(512) + 1e-4
    assert all(log["gtpo/initial_entropy"] == pytest.approx(trainer.initial_entropy) for log in train_logs)
    eval_logs = [log for log in collector.logs if "eval_loss" in log]
    assert eval_logs and "eval_gtpo/mean_lambda" in eval_logs[0]


@pytest.mark.parametrize(
    "gtpo_overrides, grpo_overrides",
    [
        (dict(conflict_correction=False, entropy_filter="never", entropy_gamma=0.0), dict(loss_type="grpo")),
        (dict(algorithm="grpo", beta=0.04, loss_type="dapo"), dict(beta=0.04, loss_type="dapo")),
        *[
            (dict(conflict_correction=False, entropy_filter="never", entropy_gamma=0.0, loss_type=t), dict(loss_type=t))
            for t in ("dapo", "dr_grpo", "bnpo", "cispo", "sapo", "luspo", "vespo")
        ],
        # GRPOConfig's loss options composed with GTPO (issue 21): with GTPO's parts off, TRL's own step.
        *[({**GTPO_OFF, **o}, dict(loss_type="grpo", **o)) for o in LOSS_OPTIONS.values()],
    ],
    ids=[
        "gtpo-components-off",
        "algorithm-grpo-with-kl",
        "components-off-dapo",
        "components-off-dr_grpo",
        "components-off-bnpo",
        "components-off-cispo",
        "components-off-sapo",
        "components-off-luspo",
        "components-off-vespo",
        *(f"components-off-{name}" for name in LOSS_OPTIONS),
    ],
)
def test_one_step_equals_trl_grpo_when_gtpo_is_off(tmp_path, tiny_model_path, gtpo_overrides, grpo_overrides):
    common = settings(tmp_path, **SGD)
    gtpo_trainer, before, gtpo_after = run(FixedGTPO, tiny_model_path, GTPOConfig(**{**common, **gtpo_overrides}))
    grpo_trainer, before_ref, grpo_after = run(FixedGRPO, tiny_model_path, GRPOConfig(**{**common, **grpo_overrides}))
    assert max_abs_diff(before, before_ref) == 0
    update = {k: gtpo_after[k] - before[k] for k in before}
    reference = {k: grpo_after[k] - before[k] for k in before}
    assert max(v.abs().max().item() for v in reference.values()) > 1e-3  # a real update
    assert max_abs_diff(update, reference) < 1e-5
    loss = gtpo_trainer.state.log_history[0]["loss"]
    assert loss == pytest.approx(grpo_trainer.state.log_history[0]["loss"], abs=1e-6)
    assert (gtpo_trainer.ref_model is None) == (grpo_trainer.ref_model is None)


def test_full_gtpo_trains_with_every_composable_option_at_once(tmp_path, tiny_model_path, caplog):
    """λ, δ and γ on, with beta, a sequence-level ratio, delta, the top-entropy and off-policy masks: a step runs,
    moves the parameters, loads the reference model for the KL term and warns that the paper has none."""
    import logging

    options = {k: v for o in LOSS_OPTIONS.values() for k, v in o.items()}
    with caplog.at_level(logging.WARNING, logger="gtpo.trainer.config"):
        args = GTPOConfig(**{**settings(tmp_path, initial_entropy_prompts=4), **options})
    assert any("GTPO has no KL term" in r.getMessage() for r in caplog.records)
    trainer, before, after = run(FixedGTPO, tiny_model_path, args)
    assert trainer.ref_model is not None and max_abs_diff(before, after) > 0
    assert all(math.isfinite(log["loss"]) for log in trainer.state.log_history if "loss" in log)


def test_gtpo_update_differs_from_grpo_on_conflicting_groups(tmp_path, tiny_model_path):
    """The control for the test above: with conflict correction on, the same step is not GRPO's."""
    common = settings(tmp_path, **SGD)
    _, before, gtpo_after = run(
        FixedGTPO, tiny_model_path, GTPOConfig(**common, entropy_filter="never", entropy_gamma=0.0)
    )
    _, _, grpo_after = run(FixedGRPO, tiny_model_path, GRPOConfig(**common, loss_type="grpo"))
    assert max_abs_diff(gtpo_after, grpo_after) > 1e-3


def test_no_extra_forward_pass_beyond_trl_grpo(tmp_path, tiny_model_path, monkeypatch):
    """One model forward per micro-batch, no reference model: each fused forward (TRL's padded one, or GTPO's
    packed one) calls TRL's LM-head kernel exactly once, so counting kernel calls counts forwards."""
    import trl.trainer.utils as trl_utils

    calls = {"gtpo": 0, "grpo": 0}
    kernel = trl_utils._ChunkedLogProbFunction
    current = {"arm": "gtpo"}

    class Counting:
        @staticmethod
        def apply(*args):
            calls[current["arm"]] += 1
            return kernel.apply(*args)

    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", Counting)
    common = settings(tmp_path, max_steps=2, per_device_train_batch_size=4, gradient_accumulation_steps=2)
    run(FixedGTPO, tiny_model_path, GTPOConfig(**common, initial_entropy=1.0))
    current["arm"] = "grpo"
    run(FixedGRPO, tiny_model_path, GRPOConfig(**common, loss_type="grpo"))
    assert calls["gtpo"] == calls["grpo"] == 4  # one forward per micro-batch, no reference model


@pytest.mark.parametrize("aggregation", ["sequence", "reference", "dapo", "dr_grpo"])
def test_gradient_accumulation_split_gives_the_same_update(tmp_path, tiny_model_path, aggregation):
    # bnpo is left out on purpose: TRL's bnpo is a token mean per micro-batch, which depends on the split.
    loss = (
        dict(gtpo_aggregation=aggregation) if aggregation in ("sequence", "reference") else dict(loss_type=aggregation)
    )
    updates = []
    for batch, accumulation in [(8, 1), (4, 2), (2, 4)]:
        args = GTPOConfig(
            **settings(
                tmp_path,
                per_device_train_batch_size=batch,
                gradient_accumulation_steps=accumulation,
                initial_entropy=1.0,
                **loss,
                **SGD,
            )
        )
        _, before, after = run(FixedGTPO, tiny_model_path, args)
        updates.append({k: after[k] - before[k] for k in before})
    assert max(v.abs().max().item() for v in updates[0].values()) > 1e-3
    assert max_abs_diff(updates[0], updates[1]) < 1e-5
    assert max_abs_diff(updates[0], updates[2]) < 1e-5


def test_reference_aggregation_is_the_authors_sum_over_one_group(tmp_path, tiny_model_path, monkeypatch):
    """With one group per step (the authors' setting) the loss is core's per-group sum, unscaled."""
    seen = []
    original = core.gtpo_loss

    def recording(*args, **kwargs):
        loss, metrics = original(*args, **kwargs)
        seen.append(loss.detach())
        return loss, metrics

    monkeypatch.setattr(core, "gtpo_loss", recording)
    args = GTPOConfig(
        **settings(tmp_path, per_device_train_batch_size=4, gtpo_aggregation="reference", initial_entropy=1.0)
    )
    trainer, _, _ = run(FixedGTPO, tiny_model_path, args)
    assert len(seen) == 1
    assert trainer.state.log_history[0]["loss"] == pytest.approx(seen[0].item(), rel=1e-5, abs=1e-6)


def test_several_iterations_per_batch_pass_old_logps_for_clipping(tmp_path, tiny_model_path, monkeypatch):
    seen, generations = [], []
    original_loss, original_generate = core.gtpo_loss, GTPOTrainer._generate_and_score_completions

    def recording(inputs, settings, **kwargs):  # the trainer calls gtpo_loss(LossInputs, LossSettings)
        seen.append(inputs.old_per_token_logps is not None)
        return original_loss(inputs, settings, **kwargs)

    def counting(self, inputs):
        generations.append(len(inputs))
        return original_generate(self, inputs)

    monkeypatch.setattr(core, "gtpo_loss", recording)
    monkeypatch.setattr(GTPOTrainer, "_generate_and_score_completions", counting)
    args = GTPOConfig(**settings(tmp_path, max_steps=2, num_iterations=2, initial_entropy=1.0, learning_rate=1e-2))
    trainer, before, after = run(FixedGTPO, tiny_model_path, args)
    assert generations == [8] and seen == [True, True]
    assert max_abs_diff(before, after) > 0
    assert "clip_ratio/region_mean" in trainer.state.log_history[0]


def test_lora_trains_only_the_adapter_and_loads_no_reference(tmp_path, tiny_model_path):
    from peft import LoraConfig

    args = GTPOConfig(**settings(tmp_path, max_steps=2, initial_entropy=1.0, learning_rate=1e-2))
    peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = FixedGTPO(
        model=tiny_model_path,
        reward_funcs=table_reward,
        args=args,
        train_dataset=make_dataset(),
        peft_config=peft_config,
    )
    frozen = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    before = trainable_state(trainer.model)
    trainer.train()
    after = trainable_state(trainer.model)
    assert before and all("lora_" in name for name in before)
    assert max_abs_diff(before, after) > 0
    assert all(torch.equal(p, dict(trainer.model.named_parameters())[n]) for n, p in frozen.items())
    assert trainer.ref_model is None and list(trainer.model.peft_config) == ["default"]


def test_measuring_initial_entropy_leaves_the_training_samples_unchanged(tmp_path, tiny_model_path):
    """Sampling for ⟨H⟩_ini runs on a forked RNG: a measured run equals a run given the same value."""
    common = settings(tmp_path, max_steps=2, initial_entropy_prompts=6, learning_rate=1e-2)
    measured, _, after_measured = run(GTPOTrainer, tiny_model_path, GTPOConfig(**common))
    given, _, after_given = run(
        GTPOTrainer, tiny_model_path, GTPOConfig(**common, initial_entropy=measured.initial_entropy)
    )
    assert measured._initial_entropy_source == "measured" and given._initial_entropy_source == "config"
    assert max_abs_diff(after_measured, after_given) == 0
    rewards = [log["reward"] for log in measured.state.log_history if "reward" in log]
    assert rewards == [log["reward"] for log in given.state.log_history if "reward" in log]


def test_initial_entropy_spreads_prompts_over_ranks_and_skips_repeats_and_empty_completions():
    """Rank r takes prompts r, r + ranks, ...; every generation call gets the training generation batch's
    row count (per_device_train_batch_size × steps_per_generation = 2 here), and indices past n repeat a
    prompt with weight 0, so every rank runs the same calls; empty completions have no ⟨H⟩_i."""
    from types import SimpleNamespace

    lengths = {0: 1, 1: 2, 2: 3, 3: 2, 4: 0}  # prompt 4 samples an empty completion
    calls = []

    def fake_trainer(rank, world, reduced):
        def generate(prompts):  # TRL's _generate: (prompt_ids, completion_ids, tool_mask, completions, ...)
            calls.append(list(prompts))
            prompt_ids = [[j + 1] for j in prompts]
            return prompt_ids, [[7] * lengths[j] for j in prompts], None, None, None, {}, None, []

        def score(model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False):
            prompt = input_ids[:, :1].float() - 1  # (B, 1) the prompt index j
            entropy = (prompt + 0.5).expand(-1, logits_to_keep).clone()  # every token of prompt j: j + 0.5 nats
            return torch.zeros_like(entropy), entropy, None

        def reduce(tensor, reduction):
            reduced.append(tensor.tolist())
            return tensor

        return SimpleNamespace(
            accelerator=SimpleNamespace(
                device=torch.device("cpu"), num_processes=world, process_index=rank, reduce=reduce
            ),
            args=SimpleNamespace(
                per_device_train_batch_size=2, steps_per_generation=1, gradient_checkpointing_kwargs=None
            ),
            model=SimpleNamespace(
                is_gradient_checkpointing=False, training=True, eval=lambda: None, train=lambda mode=True: None
            ),
            _tokenizer=SimpleNamespace(pad_token_id=0),
            eos_token_ids=[7],
            mask_truncated_completions=False,
            num_generations=4,
            num_generations_eval=4,
            _metrics={"train": {}, "eval": {}},
            state=SimpleNamespace(num_input_tokens_seen=0),
            _generate=generate,
            _get_per_token_logps_and_entropies=score,
        )

    prompts = list(range(5))
    reduced = []
    assert entropy_init.measure_initial_entropy(fake_trainer(0, 1, reduced), prompts) == pytest.approx(2.0)
    assert reduced == [[0.5 + 1.5 + 2.5 + 3.5, 4.0] * 2]  # [Σ, count] kept, then non-empty (the same here)
    assert calls == [[0, 1], [2, 3], [4, 0]]  # full calls of 2; the last pads with prompt 0 (weight 0)
    reduced, calls[:] = [], []
    for rank in (0, 1):
        entropy_init.measure_initial_entropy(fake_trainer(rank, 2, reduced), prompts)
    # Rank 0: prompts 0, 2, 4 (empty), 1 (a repeat, weight 0); rank 1: 1, 3, then 0 and 2 (repeats).
    assert calls == [[0, 2], [4, 1], [1, 3], [0, 2]]
    assert reduced == [[0.5 + 2.5, 2.0] * 2, [1.5 + 3.5, 2.0] * 2]


class StopAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def test_resume_matches_uninterrupted_run_and_keeps_initial_entropy(tmp_path, tiny_model_path, monkeypatch):
    measurements = []
    original = entropy_init.measure_initial_entropy

    def counting(trainer, prompts):
        measurements.append(len(prompts))
        return original(trainer, prompts)

    monkeypatch.setattr(entropy_init, "measure_initial_entropy", counting)
    common = dict(
        max_steps=4,
        save_strategy="steps",
        save_steps=2,
        initial_entropy_prompts=4,
        learning_rate=1e-2,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
    )

    full, _, after_full = run(GTPOTrainer, tiny_model_path, GTPOConfig(**settings(tmp_path / "a", **common)))
    assert measurements == [4]

    args = GTPOConfig(**settings(tmp_path / "b", **common))
    interrupted = GTPOTrainer(
        model=tiny_model_path, reward_funcs=table_reward, args=args, train_dataset=make_dataset(), callbacks=[StopAt(2)]
    )
    interrupted.train()
    checkpoint = Path(args.output_dir) / "checkpoint-2"
    state = json.loads((checkpoint / entropy_init.STATE_FILE).read_text())
    assert state["initial_entropy"] == pytest.approx(interrupted.initial_entropy)
    assert state["initial_entropy_source"] == "measured" and measurements == [4, 4]

    resumed = GTPOTrainer(model=tiny_model_path, reward_funcs=table_reward, args=args, train_dataset=make_dataset())
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert measurements == [4, 4]  # restored, not measured again
    assert resumed._initial_entropy_source == "checkpoint"
    assert resumed.initial_entropy == pytest.approx(full.initial_entropy)
    assert resumed.state.global_step == 4
    assert max_abs_diff(trainable_state(resumed.model), after_full) < 1e-6
    logged = [log["gtpo/initial_entropy"] for log in resumed.state.log_history if "gtpo/initial_entropy" in log]
    assert logged and all(v == pytest.approx(full.initial_entropy) for v in logged)


@pytest.mark.parametrize(
    "name, distributed_type, zero_stage, machines",
    [
        ("ddp", "MULTI_GPU", None, 1),
        ("zero2", "DEEPSPEED", 2, 1),
        ("zero3", "DEEPSPEED", 3, 1),
        ("fsdp", "FSDP", None, 1),
        ("multi_node", "DEEPSPEED", 3, 2),
    ],
)
def test_shipped_accelerate_configs_parse(name, distributed_type, zero_stage, machines):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(Path(__file__).parents[2] / "configs" / "accelerate" / f"{name}.yaml"))
    assert config.distributed_type.value == distributed_type and config.num_machines == machines
    assert (config.deepspeed_config or {}).get("zero_stage") == zero_stage
    if name == "fsdp":
        assert config.fsdp_config["fsdp_version"] == 2


def test_vllm_importance_sampling_ratio_reaches_the_gtpo_loss(tmp_path, tiny_model_path, monkeypatch):
    # With use_vllm (and TRL's default correction), TRL stores the per-token correction π_θold/π_vLLM as
    # "importance_sampling_ratio"; GTPO's loss must receive it (vLLM is not installed here: it is injected).
    seen = []
    original_loss = core.gtpo_loss

    def recording(inputs, settings, **kwargs):  # the trainer calls gtpo_loss(LossInputs, LossSettings)
        seen.append(inputs.importance_weights)
        return original_loss(inputs, settings, **kwargs)

    class WithSamplingCorrection(FixedGTPO):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            output["importance_sampling_ratio"] = torch.full(output["completion_mask"].shape, 0.5)
            return output

    monkeypatch.setattr(core, "gtpo_loss", recording)
    args = GTPOConfig(**settings(tmp_path, initial_entropy=1.0))
    trainer = WithSamplingCorrection(
        model=tiny_model_path, reward_funcs=table_reward, args=args, train_dataset=make_dataset()
    )
    trainer.train()
    assert seen and all(w is not None and bool((w == 0.5).all()) for w in seen)


def test_a_loss_type_registered_in_the_test_alone_trains_a_step(tmp_path, tiny_model_path, monkeypatch):
    """One registry entry is a whole new loss type: GTPOConfig accepts it, core checks it and the trainer trains
    with it (algorithm="gtpo"), with no list of names to edit. The toy surrogate is REINFORCE's A'·logp; with the
    token-mean normaliser and γ = 0 its loss is −mean_i mean_t λ·A'·logp, recomputed here from what the loss saw."""
    from gtpo.core import registry

    for table in ("SURROGATES", "NORMALISERS", "LOSS_TYPES"):  # registered for this test alone
        monkeypatch.setattr(registry, table, dict(getattr(registry, table)))
    registry.register_surrogate("toy_reinforce", lambda ratio, logp, a_tok, inputs, settings: a_tok * logp)
    registry.register_loss_type("toy", surrogate="toy_reinforce", normaliser="sequence")
    seen = []
    original = core.gtpo_loss

    def recording(inputs, settings, **kwargs):
        loss, metrics = original(inputs, settings, **kwargs)
        seen.append((inputs, settings, loss.detach()))
        return loss, metrics

    monkeypatch.setattr(core, "gtpo_loss", recording)
    args = GTPOConfig(
        **settings(tmp_path, loss_type="toy", initial_entropy=1.0, conflict_correction=False, entropy_gamma=0.0)
    )
    _, before, after = run(FixedGTPO, tiny_model_path, args)
    assert max((after[k] - before[k]).abs().max().item() for k in before) > 0  # it trained
    inputs, used, loss = seen[0]
    assert used.surrogate == "toy_reinforce" and used.gtpo_aggregation == "toy"
    valid = inputs.completion_mask.bool()
    per_row = (inputs.per_token_logps.detach() * valid).sum(-1) / valid.sum(-1)
    expected = -(inputs.advantages.float() * per_row).mean()  # λ = 1 (no spans), δ = 1 (⟨H⟩_ini ≥ ln 2)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-6)
    with pytest.raises(ValueError, match="loss_type='nope'"):
        GTPOConfig(**settings(tmp_path, loss_type="nope"))


def test_an_entropy_filter_mode_added_in_one_place_trains_a_step(tmp_path, tiny_model_path, monkeypatch):
    """One entry of `core.ENTROPY_FILTERS` is a whole new filter mode: GTPOConfig accepts it, the trainer measures
    ⟨H⟩_ini because the entry says it needs it, and δ follows the entry's rule. The toy mode keeps exactly the
    completions with A > 0 whose ⟨H⟩_i is at most the threshold, and only when ⟨H⟩_ini is set; recomputed here from
    what the loss saw."""
    from gtpo.core.entropy import EntropyFilter

    measured = []
    original_measure = entropy_init.measure_initial_entropy

    def counting(trainer, prompts):
        measured.append(len(prompts))
        return original_measure(trainer, prompts)

    def toy_keep(low, signs, initial_entropy):
        assert initial_entropy is not None  # the trainer passed the measured ⟨H⟩_ini
        return low & (signs > 0)

    monkeypatch.setattr(entropy_init, "measure_initial_entropy", counting)
    monkeypatch.setitem(core.ENTROPY_FILTERS, "toy_positive_low", EntropyFilter(toy_keep, needs_initial_entropy=True))
    seen = []
    original = core.advantage_terms

    def recording(inputs, settings, *args):
        terms = original(inputs, settings, *args)
        seen.append((inputs.advantages.detach(), terms.mean_entropy.detach(), terms.keep))
        return terms

    monkeypatch.setattr(core, "advantage_terms", recording)
    args = GTPOConfig(
        **settings(tmp_path, entropy_filter="toy_positive_low", entropy_threshold=100.0, initial_entropy_prompts=4)
    )
    assert args.needs_initial_entropy
    run(FixedGTPO, tiny_model_path, args)
    assert measured == [4]
    advantages, mean_entropy, keep = seen[0]
    assert torch.equal(keep, (mean_entropy <= 100.0) & (advantages > 0)) and 0 < int(keep.sum()) < keep.numel()
    with pytest.raises(ValueError, match="entropy_filter='sometimes'"):
        GTPOConfig(**settings(tmp_path, entropy_filter="sometimes"))


def test_core_and_config_refuse_the_same_entropy_thresholds(tmp_path):
    """Eq. 6's threshold: one check (core.checks.check_entropy_threshold) for the config and the loss."""
    import math

    for bad in (0.0, -0.5, math.nan, math.inf):
        with pytest.raises(ValueError, match="entropy_threshold"):
            GTPOConfig(**settings(tmp_path, entropy_threshold=bad))
        with pytest.raises(ValueError, match="entropy_threshold"):
            core.gtpo_loss(
                core.LossInputs(torch.zeros(2, 3), torch.ones(2, 3), torch.tensor([1.0, -1.0])),
                core.LossSettings(entropy_threshold=bad, entropy_filter="never"),
            )
