"""The paper's SFT baseline (Sec. 6): TRL's SFTTrainer on gold solutions written in the tag format.

Each training row is the task's prompt (the paper's system prompt, Sec. 16.1, then the question) and one
assistant turn ``<reasoning>SOLUTION</reasoning><answer>GOLD</answer>`` (`gtpo.tasks.format_completion`).
The loss covers the completion only (TRL's prompt-completion format). What goes into SOLUTION:

- GSM8K: the reference solution without its final ``#### N`` line and without the calculator
  annotations ``<<48/2=24>>`` (the paper does not say; they are not text a model should learn to write);
- MATH: the reference solution as written, ``\\boxed{}`` included;
- synthetic: the worked line ``a op b = c.``.

>>> from gtpo.trainer.sft import solution_reasoning
>>> solution_reasoning("Natalia sold 48/2 = <<48/2=24>>24 clips.\\n#### 24")
'Natalia sold 48/2 = 24 clips.'
"""

from __future__ import annotations

import re
from pathlib import Path

from gtpo.tasks import format_completion

_CALCULATOR = re.compile(r"<<[^<>]*>>")
_GSM8K_FINAL = re.compile(r"\n?\s*####[^\n]*\s*$")


def solution_reasoning(solution: str) -> str:
    """The reasoning part of a gold solution: GSM8K's ``#### N`` line and ``<<...>>`` annotations removed."""
    text = _GSM8K_FINAL.sub("", solution)
    return _CALCULATOR.sub("", text).strip()


def sft_dataset(dataset):
    """Prompt-completion rows for SFTTrainer from a `gtpo.tasks.load_task` dataset (prompt, solution, answer)."""
    missing = [c for c in ("prompt", "solution", "answer") if c not in dataset.column_names]
    if missing:
        raise ValueError(f"SFT needs the columns prompt, solution and answer; missing {missing}")

    def to_pair(row):
        completion = format_completion(solution_reasoning(row["solution"]), row["answer"])
        return {"prompt": row["prompt"], "completion": [{"role": "assistant", "content": completion}]}

    return dataset.map(to_pair, remove_columns=dataset.column_names)


def train_sft(dataset, training_args, model_args) -> dict:
    """Train on ``dataset`` (from :func:`sft_dataset`) as the SFTConfig and ModelConfig say; save the
    model (or LoRA adapter) and tokenizer in OUTPUT_DIR/model. Returns {"model_dir": Path, "wall": seconds}.
    """
    from trl import SFTTrainer

    from gtpo.trainer.policy import train_policy

    return train_policy(SFTTrainer, dataset, training_args, model_args, Path(training_args.output_dir), "gtpo sft")
