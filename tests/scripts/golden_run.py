"""A short deterministic GTPO run on the tiny model whose logged numbers are kept in
tests/fixtures/golden_tiny_gtpo.json, so that a refactor that must not change behaviour (issue 19, the move into
one package per layer) is checked against the numbers the code gave before it.

    python tests/scripts/golden_run.py --record    # rewrite the fixture (only when behaviour is meant to change)

Fixed completions (trainer_helpers.FixedGeneration: conflict spans on both ends), the entropy filter off
(the tiny model is near-uniform: a threshold would be a coin toss between machines), γ = 0.1, Adam at 1e-3,
three steps; the numbers kept are every step's loss, grad norm and gtpo/* metrics, and the trainable parameters'
sum and sum of squares after training.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIXTURE = HERE.parent / "fixtures" / "golden_tiny_gtpo.json"
KEYS = ("loss", "grad_norm", "entropy")


def golden_numbers(tiny_model_path: str, output_dir: str) -> dict:
    sys.path.insert(0, str(HERE))
    from gtpo import GTPOConfig, GTPOTrainer
    from trainer_helpers import FixedGeneration, make_dataset, table_reward, trainable_state

    class FixedGTPO(FixedGeneration, GTPOTrainer):
        pass

    args = GTPOConfig(
        output_dir=output_dir,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        max_steps=3,
        report_to=[],
        use_cpu=True,
        bf16=False,
        logging_steps=1,
        save_strategy="no",
        seed=0,
        disable_tqdm=True,
        learning_rate=1e-3,
        entropy_filter="never",
        entropy_gamma=0.1,
        initial_entropy_prompts=4,
    )
    trainer = FixedGTPO(model=tiny_model_path, reward_funcs=table_reward, args=args, train_dataset=make_dataset(16))
    trainer.train()
    steps = []
    for log in trainer.state.log_history:
        if "loss" in log:
            steps.append(
                {
                    k: float(v)
                    for k, v in sorted(log.items())
                    if k in KEYS or (k.startswith("gtpo/") and k != "gtpo/initial_entropy")
                }
            )
    state = trainable_state(trainer.model)
    return {
        "steps": steps,
        "param_sum": float(sum(t.double().sum() for t in state.values())),
        "param_sum_sq": float(sum(t.double().pow(2).sum() for t in state.values())),
    }


if __name__ == "__main__":
    from gtpo.models import tiny_model_dir

    with tempfile.TemporaryDirectory() as tmp:
        numbers = golden_numbers(str(tiny_model_dir()), tmp)
    if "--record" in sys.argv:
        FIXTURE.write_text(json.dumps(numbers, indent=1) + "\n")
        print(f"wrote {FIXTURE}")
    else:
        print(json.dumps(numbers, indent=1))
