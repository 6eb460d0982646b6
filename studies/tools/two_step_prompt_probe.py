"""How the base model answers the two-step task under a few prompt settings: the measurement behind
`gtpo.tasks.two_step.TWO_STEP_EXAMPLES` and the task's operand range (issue 48, item 3).

    .venv/bin/python studies/tools/two_step_prompt_probe.py            # 20 test questions x 8 samples, 96 tokens

For each setting: how many completions have the full tag format (format reward 10), the right final answer, a
right first step (`first_step_correct`), and a right first step followed by a wrong answer (the case GTPO's
conflict correction protects). Sampling as `gtpo eval`'s (temperature 1, the per-(question, sample) seeds of
`gtpo.eval.runner.unit_seed` with seed 0), SmolLM2-135M-Instruct in float32.

Printed at b0f114d (2-core Intel Xeon with AVX-512, float32; the same counts twice, the second time beside other work):
    operands 1-9, first example only: completions 160, full format 5, right answer 0, right first step 37, ... 37
    operands 1-20, both examples: completions 160, full format 49, right answer 2, right first step 16, ... 15
    operands 1-9, both examples (the task's default): completions 160, full format 52, right answer 11,
        right first step 62, right first step, wrong answer 54
"""

from __future__ import annotations

import argparse
import collections

from gtpo.eval.backends import SamplingSettings, make_backend
from gtpo.eval.runner import unit_seed
from gtpo.grading import extract_answer, is_equivalent
from gtpo.tasks.prompts import build_prompt
from gtpo.tasks.rewards import format_score
from gtpo.tasks.two_step import TWO_STEP_EXAMPLES, first_step_correct, two_step_rows

# setting -> (largest operand, worked examples shown)
SETTINGS = {
    "operands 1-9, first example only": (9, TWO_STEP_EXAMPLES[:1]),
    "operands 1-20, both examples": (20, TWO_STEP_EXAMPLES),
    "operands 1-9, both examples (the task's default)": (9, TWO_STEP_EXAMPLES),
}


def probe(backend, max_operand: int, examples, problems: int, samples: int, max_new_tokens: int) -> dict[str, int]:
    rows = two_step_rows("test", max_operand=max_operand)[:problems]
    units = [(row, i) for row in rows for i in range(samples)]
    prompts = [build_prompt(row["question"], few_shot=examples) for row, _ in units]
    seeds = [unit_seed(0, row["id"], i) for row, i in units]
    outputs = backend.generate(prompts, seeds, SamplingSettings(temperature=1.0, max_new_tokens=max_new_tokens))
    counts = collections.Counter()
    for (row, _), output in zip(units, outputs, strict=True):
        answer = extract_answer(output.text)
        correct = bool(answer) and is_equivalent(answer, row["answer"])
        step = first_step_correct(output.text, row["question"])
        counts["full format"] += format_score(output.text) == 10.0
        counts["right answer"] += correct
        counts["right first step"] += step
        counts["right first step, wrong answer"] += step and not correct
    return {"completions": len(units), **counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=20)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    args = parser.parse_args()
    backend = make_backend("smollm2", "transformers", "float32", 0)
    for name, (max_operand, examples) in SETTINGS.items():
        counts = probe(backend, max_operand, examples, args.problems, args.samples, args.max_new_tokens)
        print(f"{name}: " + ", ".join(f"{key} {value}" for key, value in counts.items()), flush=True)


if __name__ == "__main__":
    main()
