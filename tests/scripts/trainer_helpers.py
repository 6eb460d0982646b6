"""Shared pieces of the trainer tests and of the multi-process worker (tests/scripts/spans_worker.py).

`FixedGeneration` replaces sampling by a table of completions that share prefixes and suffixes across
rewards, so that conflict spans are not empty and do not depend on the RNG: the completion of global
row g of a generation batch (g = rank * rows_per_rank + local row, the order in which TRL gathers
rows) is a function of the row's prompt and of g mod G, its place in its group.
"""

from __future__ import annotations

import torch
from datasets import Dataset

# (text, reward). Forward spans come from shared openings ("Let us think. ", "We add. The answer is "),
# backward spans from the shared ending (". <eos>"). Groups are laid out ++-- or --++, so each half of
# a group holds one sign only: split across two ranks, neither half has a conflict on its own.
TABLE = [
    ("Let us think. The answer is four.", 1.0),
    ("We add. The answer is four.", 1.0),
    ("Let us think. It is seven.", 0.0),
    ("We add. The answer is six.", 0.0),
]


def make_dataset(n: int = 16, system: str | None = None) -> Dataset:
    prompts = []
    for i in range(n):
        messages = [{"role": "user", "content": f"What is {i} + {i % 5}?"}]
        if system is not None:
            messages.insert(0, {"role": "system", "content": system})
        prompts.append(messages)
    return Dataset.from_dict({"prompt": prompts, "answer": [str(i + i % 5) for i in range(n)]})


def table_reward(completions, **kwargs):
    """1 for completions that say 'four', else 0 (the table's reward column)."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [1.0 if "four" in text else 0.0 for text in texts]


class FixedGeneration:
    """Mixin for GTPOTrainer/GRPOTrainer: deterministic completions from TABLE instead of sampling."""

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        n, rank = len(prompt_ids), self.accelerator.process_index
        group = max(int(num_generations), 1)
        completions = []
        for i, ids in enumerate(prompt_ids):
            row = rank * n + i  # global row in the generation batch
            rotation = 2 * (sum(ids) % 2)  # the prompt picks ++-- or --++
            choice = (rotation + row % group) % len(TABLE)
            text = TABLE[choice][0]
            completions.append(self._tokenizer.encode(text, add_special_tokens=False) + [self._tokenizer.eos_token_id])
        return completions, None


def trainable_state(model) -> dict[str, torch.Tensor]:
    """Copies of the trainable parameters, by name."""
    return {name: p.detach().clone().float() for name, p in model.named_parameters() if p.requires_grad}


def max_abs_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)
