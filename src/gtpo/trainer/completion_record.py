"""Completions on record: what GTPO did to each recorded completion, written every logging step.

`GTPOTrainer` writes TRL's ``completions/completions_{step:05d}.parquet`` (`gtpo.runs.completions`) with gtpo's
columns beside TRL's: the token ids and tokens, ⟨H⟩_i, δ_i, the advantage the loss weighted, the conflict spans and λ
(Eq. 5) where it is not 1. With ``algorithm="grpo"`` or ``conflict_correction=False`` the spans and λ are computed
for the record only (the file's metadata says ``lambda_applied: false``), so GTPO and GRPO runs can be compared
token by token. Recording reads values the step computes anyway and moves them to the host at the logging step: it
changes no update (tests/trainer/test_completion_record.py compares the weights with recording on and off).

How values reach the record: at generation each row of the generation batch gets its global index (`RECORD_ROW`,
a per-row tensor TRL shuffles and splits with the rest), the gathered batch's ids, masks, advantages and spans are
kept, and TRL's own columns (prompt, completion, rewards, advantage) are copied from its ``_logs``; each micro-batch's
loss adds ⟨H⟩_i, δ_i and A'_i of its rows (the last pass over a row counts, as with ``num_iterations > 1``); the
logging step gathers those from every rank and the main process writes the first ``log_completions_max_groups``
groups. A generation batch is written once, at the first logging step after it.
"""

from __future__ import annotations

import logging

import torch

from gtpo import core
from gtpo.runs import completions as record_files

logger = logging.getLogger(__name__)
RECORD_ROW = "gtpo_record_row"  # (B,) global row index of each completion in its generation batch


class CompletionRecorder:
    """Collects one generation batch's record across its micro-batches and writes it at the logging step."""

    def __init__(self, trainer):
        self.trainer = trainer
        self._batch: dict | None = None  # the newest train generation batch, until written
        self._loss_rows: list[tuple[torch.Tensor, ...]] = []  # (rows, ⟨H⟩_i, kept, A'_i) of each micro-batch
        self._entropies: torch.Tensor | None = None  # GRPO: the token entropies TRL's loss computed
        self._capturing = False  # inside GTPOTrainer._compute_loss with algorithm='grpo'

    @property
    def active(self) -> bool:
        """Recording now: ``log_completions`` on and the model training (evaluation batches are not recorded)."""
        return bool(self.trainer.log_completions) and self.trainer.model.training

    def resumed_at(self, step: int) -> None:
        """A resume from the checkpoint of ``step``: later steps run again, so their old records go."""
        dropped = record_files.drop_after(self.trainer.args.output_dir, step)
        if dropped:
            logger.info("completion record: steps %s removed (they run again after the resume)", dropped)

    # ------------------------------------------------------------------ generation
    def on_generation(self, output: dict, gathered: dict) -> None:
        """Mark the rows of a new train generation batch and keep what the record needs of it.

        Args:
            output: TRL's generation output for this rank (gets `RECORD_ROW`).
            gathered: every rank's ``ids``, ``mask`` (N, T), spans ``forward``/``backward`` (N, T), the loss's
                ``lambda`` (N, T) and ``group_size``, as `GTPOTrainer._gathered_spans` returns them.
        """
        trainer = self.trainer
        n_local = output["completion_ids"].size(0)
        start = trainer.accelerator.process_index * n_local  # TRL's process_slice
        output[RECORD_ROW] = torch.arange(start, start + n_local, device=output["completion_ids"].device)
        self._loss_rows = []
        self._batch = None
        if not trainer.accelerator.is_main_process:
            self._batch = {"rows": gathered["ids"].size(0)}  # only the main process writes
            return
        n = gathered["ids"].size(0)
        logs = trainer._logs  # TRL's columns of the batch just scored: its last n entries
        self._batch = {
            "rows": n,
            "prompt": list(logs["prompt"])[-n:],
            "completion": list(logs["completion"])[-n:],
            "rewards": {name: list(values)[-n:] for name, values in logs["rewards"].items()},
            "advantage": list(logs["advantages"])[-n:],
            "extra": {name: list(values)[-n:] for name, values in logs["extra"].items()},
            "images": list(logs["images"])[-n:] if logs["images"] else None,
            **{key: gathered[key].detach().cpu() for key in ("ids", "mask", "forward", "backward", "lambda")},
            "group_size": gathered["group_size"],
        }

    # ------------------------------------------------------------------ loss
    def on_loss(self, inputs: dict, mean_entropy, kept, advantages_used) -> None:
        """Keep a micro-batch's ⟨H⟩_i, δ_i and A'_i (B,) by row; no host sync until the logging step."""
        if not self.active or RECORD_ROW not in inputs or mean_entropy is None:
            return
        values = (mean_entropy, kept.to(mean_entropy.dtype), advantages_used.to(mean_entropy.dtype))
        self._loss_rows.append((inputs[RECORD_ROW], *(v.detach().float() for v in values)))

    def start_grpo_loss(self) -> None:
        self._entropies, self._capturing = None, self.active

    @property
    def capturing(self) -> bool:
        """Inside GTPOTrainer._compute_loss with algorithm='grpo', recording."""
        return self._capturing

    def saw_entropies(self, entropies) -> None:
        """GRPO: the (B, T) token entropies of TRL's loss forward (`_get_per_token_logps_and_entropies`)."""
        if entropies is not None:
            self._entropies = entropies.detach()

    def end_grpo_loss(self, inputs: dict) -> None:
        """GRPO: ⟨H⟩_i from the entropies TRL's loss computed; nothing filtered; A_i as TRL weighted it."""
        entropies, self._entropies, self._capturing = self._entropies, None, False
        if entropies is None:
            return
        mean_h = core.mean_completion_entropy(entropies, inputs["completion_mask"])  # (B,) ⟨H⟩_i, core's definition
        advantages = inputs["advantages"]
        advantages = advantages if advantages.dim() == 1 else advantages[:, 0]
        self.on_loss(inputs, mean_h, torch.ones_like(mean_h, dtype=torch.bool), advantages)

    # ------------------------------------------------------------------ the logging step
    def write(self, step: int) -> None:
        """At a logging step: gather the loss-side values and (main process) write the batch's record once."""
        from accelerate.utils import gather_object

        if self._batch is None:
            return
        local = [tuple(t.cpu().tolist() for t in parts) for parts in self._loss_rows]
        gathered = gather_object([local]) if self.trainer.accelerator.num_processes > 1 else [local]
        batch, self._batch, self._loss_rows = self._batch, None, []
        if not self.trainer.accelerator.is_main_process:
            return
        loss_side: dict[int, tuple[float, bool, float]] = {}
        for rank_rows in gathered:
            for rows, mean_h, kept, used in rank_rows:
                for r, h, k, a in zip(rows, mean_h, kept, used, strict=True):
                    loss_side[r] = (h, not k, a)  # a later pass over a row replaces an earlier one
        columns, metadata = self._table(batch, loss_side, step)
        record_files.write_step(self.trainer.args.output_dir, step, columns, metadata)
        self._report(columns, batch, step)

    def _table(self, batch: dict, loss_side: dict, step: int) -> tuple[dict, dict]:
        trainer, args = self.trainer, self.trainer.args
        from trl.trainer.utils import strip_images_from_messages

        g = batch["group_size"]
        cap = args.log_completions_max_groups
        n = batch["rows"] if cap is None else min(batch["rows"], cap * g)
        ids, mask = batch["ids"][:n], batch["mask"][:n].bool()
        lam = batch["lambda"][:n]  # (n, T) the loss's λ, as `GTPOTrainer._gathered_spans` computed it
        tokenizer = trainer._tokenizer
        weights = trainer.reward_weights.tolist()
        rewards = batch["rewards"]
        columns: dict[str, list] = {
            "step": [step] * n,
            "prompt": [strip_images_from_messages(m) for m in batch["prompt"][:n]],
            "completion": [strip_images_from_messages(m) for m in batch["completion"][:n]],
            **{name: values[:n] for name, values in rewards.items()},
            **{name: values[:n] for name, values in batch["extra"].items()},
            "advantage": batch["advantage"][:n],
            "group": [i // g for i in range(n)],
            "reward": [
                sum(w * r for w, r in zip(weights, row, strict=True) if r == r)  # NaN (not applied) counts 0, as TRL
                for row in zip(*(rewards[name][:n] for name in rewards), strict=True)
            ],
        }
        row_ids = [ids[i][mask[i]].tolist() for i in range(n)]
        columns["completion_ids"] = row_ids
        columns["completion_tokens"] = [[tokenizer.decode([t]) for t in row] for row in row_ids]
        missing = (None, None, None)
        columns["mean_entropy"] = [loss_side.get(i, missing)[0] for i in range(n)]
        columns["entropy_filtered"] = [loss_side.get(i, missing)[1] for i in range(n)]
        columns["advantage_used"] = [loss_side.get(i, missing)[2] for i in range(n)]
        columns["forward_span"] = (batch["forward"][:n] & mask).sum(-1).tolist()
        columns["backward_span"] = (batch["backward"][:n] & mask).sum(-1).tolist()
        off = (lam != 1) & mask  # (n, T)
        columns["lambda_positions"] = [off[i].nonzero().flatten().tolist() for i in range(n)]
        columns["lambda_values"] = [lam[i][off[i]].tolist() for i in range(n)]
        metadata = {
            "algorithm": args.algorithm,
            "group_size": g,
            "groups_in_step": batch["rows"] // g,
            "reward_funcs": list(rewards),
            "lambda_applied": bool(args.gtpo_enabled and args.conflict_correction),
            "conflict_combine": args.conflict_combine,
            "conflict_positive_weight": args.conflict_positive_weight,
            "conflict_negative_weight": args.conflict_negative_weight,
            "conflict_span_sides": args.conflict_span_sides,
            "conflict_guard": args.conflict_guard,
            "conflict_exclude_common_prefix": args.conflict_exclude_common_prefix,
            "entropy_filter": args.entropy_filter if args.gtpo_enabled else "never",
            "entropy_threshold": args.entropy_threshold,
            "entropy_gamma": args.entropy_gamma if args.gtpo_enabled else 0.0,
            "initial_entropy": getattr(trainer, "initial_entropy", None),
        }
        return columns, metadata

    def _report(self, columns: dict, batch: dict, step: int) -> None:
        """TRL's other outlets of the same table: the console (only with print_completions) and wandb/trackio."""
        trainer, args = self.trainer, self.trainer.args
        rewards = {name: columns[name] for name in batch["rewards"]}
        if args.print_completions:
            from transformers.utils import is_rich_available
            from trl.trainer.utils import print_prompt_completions_sample

            if is_rich_available():
                print_prompt_completions_sample(
                    columns["prompt"], columns["completion"], rewards, columns["advantage"], step,
                    trainer.num_completions_to_print,
                )  # fmt: skip
        from gtpo.trainer.trl_adapter import trl_grpo  # wandb, trackio and pandas as TRL imported them

        report_to = args.report_to or []
        wandb, trackio = getattr(trl_grpo, "wandb", None), getattr(trl_grpo, "trackio", None)
        backends = [wandb] if "wandb" in report_to and wandb is not None and wandb.run is not None else []
        backends += [trackio] if "trackio" in report_to and trackio is not None else []
        if not backends:
            return
        pd = trl_grpo.pd

        shown = ("step", "prompt", "completion", *rewards, "advantage", "mean_entropy", "entropy_filtered",
                 "advantage_used", "forward_span", "backward_span")  # fmt: skip
        frame = pd.DataFrame({name: columns[name] for name in shown})
        images = batch["images"][: len(frame)] if batch["images"] and trainer.log_multimodal else None
        for backend in backends:
            table = frame
            if images:  # as TRL: one list of the backend's images per completion
                column = [[backend.Image(image) for image in row] if row else [] for row in images]
                table = pd.concat([frame, pd.Series(column, name="image")], axis=1)
            if trainer.log_unique_prompts:
                table = table[~table["prompt"].astype(str).duplicated()]
            backend.log({"completions": backend.Table(dataframe=table)})
