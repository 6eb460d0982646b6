"""One GTPO step on fixed completions, recording what each rank computed for each row of the batch.

Run by tests/trainer/test_trainer_distributed.py, either as one process:

    python spans_worker.py OUT --per-device 6

or as two (gloo on CPU: GTPOConfig(use_cpu=True); `--cpu` would make accelerate start one process), with the same
global batch split over the ranks:

    accelerate launch --config_file configs/accelerate/ddp.yaml --num_processes 2 spans_worker.py OUT --per-device 3

or as two machines on one host, one launch per machine (R = 0 and 1):

    accelerate launch --config_file configs/accelerate/multi_node_ddp.yaml --num_processes 2 --machine_rank R \
        spans_worker.py OUT --per-device 3

or under the FSDP2 config (tests/trainer/test_fsdp_cpu_launch.py), where accelerate 1.15 sets up DDP on CPU ranks,
and with `--fsdp-on-cpu`, which lifts that one decision so that accelerate's own FSDP2 preparation (torch's
`fully_shard`, gloo) shards the model over the two CPU ranks:

    accelerate launch --config_file configs/accelerate/fsdp.yaml --num_processes 2 spans_worker.py OUT \
        --per-device 3 [--fsdp-on-cpu]

Each rank writes OUT/rank<r>.json: for every row of its part of the generation batch (before TRL
shuffles it), the global row index, prompt, completion ids, advantage, forward/backward spans and
λ (Eq. 5), over valid tokens, the ⟨H⟩_ini it measured (on 5 prompts), the distributed type accelerate set up,
the class of the prepared model, and how many of the trainable parameters' elements this rank holds (its shards,
for FSDP) against the whole model's. Rank 0 writes OUT/params.pt and OUT/params_before.pt, the trainable
parameters after and before the step (whole tensors, gathered from the shards under FSDP).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from gtpo import GTPOConfig, GTPOTrainer, core  # noqa: E402
from gtpo.models import tiny_model_dir  # noqa: E402
from gtpo.trainer.trainer import BACKWARD_SPAN, FORWARD_SPAN  # noqa: E402
from trainer_helpers import FixedGeneration, make_dataset, table_reward, trainable_state  # noqa: E402


class RecordingTrainer(FixedGeneration, GTPOTrainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.records = []

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        rank, n = self.accelerator.process_index, len(inputs)
        advantages = output["advantages"]
        lam = core.conflict_weights(
            output[FORWARD_SPAN],
            output[BACKWARD_SPAN],
            advantages,
            self.args.conflict_positive_weight,
            self.args.conflict_combine,
        )  # (B, T)
        for i in range(n):
            valid = output["completion_mask"][i].bool()
            self.records.append(
                {
                    "row": rank * n + i,
                    "rank": rank,
                    "prompt": inputs[i]["prompt"][-1]["content"],
                    "ids": output["completion_ids"][i][valid].tolist(),
                    "advantage": advantages[i].item(),
                    "forward": output[FORWARD_SPAN][i][valid].int().tolist(),
                    "backward": output[BACKWARD_SPAN][i][valid].int().tolist(),
                    "lambda": lam[i][valid].tolist(),
                }
            )
        return output


def lift_accelerate_cpu_fsdp_guard() -> None:
    """Let accelerate set up FSDP on CPU ranks (test-only; gtpo ships nothing like it).

    accelerate 1.15's `AcceleratorState` turns FSDP on only for accelerator back-ends (MULTI_GPU, MULTI_XPU, ...): on
    CPU ranks it keeps MULTI_CPU (DDP) although the launcher asked for FSDP. Here, when the Accelerator is built with
    an FSDP plugin on MULTI_CPU, the state (and PartialState's, which later AcceleratorState instances copy) says FSDP
    instead; everything after that (accelerate's FSDP2 preparation, torch's `fully_shard` over gloo, the trainer) is
    unchanged.
    """
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    original = AcceleratorState.__init__

    def init(self, *args, fsdp_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    AcceleratorState.__init__ = init


def whole_trainable_state(model) -> dict[str, torch.Tensor]:
    """`trainable_state`, with FSDP's sharded parameters (DTensors) gathered whole; every rank must call it."""
    return {
        name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone().float()
        for name, p in model.named_parameters()
        if p.requires_grad
    }


def held_elements(model) -> tuple[int, int]:
    """(elements of the trainable parameters this rank holds, elements of the whole trainable parameters)."""
    params = [p for p in model.parameters() if p.requires_grad]
    local = sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in params)
    return local, sum(p.numel() for p in params)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--per-device", type=int, required=True)
    parser.add_argument("--combine", default="union")
    parser.add_argument("--loss-type", default="grpo")
    parser.add_argument("--fsdp-on-cpu", action="store_true", help="lift accelerate's CPU guard on FSDP (test-only)")
    options = parser.parse_args()
    if options.fsdp_on_cpu:
        lift_accelerate_cpu_fsdp_guard()
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)

    args = GTPOConfig(
        output_dir=str(out / "run"),
        per_device_train_batch_size=options.per_device,
        gradient_accumulation_steps=2,
        num_generations=4,
        max_completion_length=8,
        max_steps=1,
        optim="sgd",
        learning_rate=1.0,
        max_grad_norm=0.0,
        lr_scheduler_type="constant",
        conflict_combine=options.combine,
        loss_type=options.loss_type,
        initial_entropy_prompts=5,  # measured over both ranks: 3 + 3 prompts, the 6th a weight-0 repeat
        report_to=[],
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
        gradient_checkpointing=False,
    )
    trainer = RecordingTrainer(
        model=str(tiny_model_dir()), reward_funcs=table_reward, args=args, train_dataset=make_dataset(24)
    )
    before = trainable_state(trainer.model)
    trainer.train()
    rank = trainer.accelerator.process_index
    after = whole_trainable_state(trainer.accelerator.unwrap_model(trainer.model))  # a collective under FSDP
    local, whole = held_elements(trainer.model)
    (out / f"rank{rank}.json").write_text(
        json.dumps(
            {
                "world_size": trainer.accelerator.num_processes,
                "initial_entropy": trainer.initial_entropy,
                "records": trainer.records,
                "distributed_type": trainer.accelerator.distributed_type.name,
                "model_class": type(trainer.model_wrapped).__name__,
                "held_elements": local,
                "model_elements": whole,
            }
        )
    )
    if rank == 0:
        torch.save(after, out / "params.pt")
        torch.save(before, out / "params_before.pt")
    trainer.accelerator.wait_for_everyone()
    # Both ranks have written what the test reads and passed the barrier: leave without running C++ teardown. Gloo's
    # worker threads can still be joinable when their objects are destroyed (pytorch/pytorch#179291), so a finished
    # rank sometimes aborted with "terminate called without an active exception" (exit -6) on a loaded 2-core
    # machine: once at interpreter exit, and once (CI, 2026-11-27) even after an explicit destroy_process_group().
    # The teardown is torch's, not what this worker checks; os._exit skips it after flushing our own output.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
