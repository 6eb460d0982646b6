"""The paper's prompt (Sec. 16.1) and the worked examples used for few-shot prompting.

Prompts are conversational message lists, the `prompt` column TRL expects: TRL applies the model's
chat template, so the same data works for any chat model. Worked examples become earlier user/assistant
turns. Why offer them: with the system prompt alone, SmolLM2-135M-Instruct wrote no tag in 8 of 8
samples (every reward 0, no learning signal); with one worked example turn, 6 of 8 had the tags.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gtpo.errors import InvalidInput

__all__ = [
    "ANSWER_TAGS",
    "REASONING_TAGS",
    "SYSTEM_PROMPT",
    "WORKED_EXAMPLES",
    "WorkedExample",
    "build_prompt",
    "format_completion",
]

REASONING_TAGS = ("<reasoning>", "</reasoning>")
ANSWER_TAGS = ("<answer>", "</answer>")

# Paper Sec. 16.1, box "PROMPT", line breaks as printed there.
SYSTEM_PROMPT = (
    "You are a helpful assistant for solving math problems.\n"
    "Given a question, first think step by step between <reasoning> and </reasoning>.\n"
    "Then, give the final answer between <answer> and </answer>."
)


def format_completion(reasoning: str, answer: str) -> str:
    """A completion in the paper's tag format: the one that earns the full format reward.

    >>> print(format_completion("2 + 3 = 5.", "5"))
    <reasoning>
    2 + 3 = 5.
    </reasoning>
    <answer>
    5
    </answer>
    """
    reasoning_part = f"{REASONING_TAGS[0]}\n{reasoning.strip()}\n{REASONING_TAGS[1]}"
    return f"{reasoning_part}\n{ANSWER_TAGS[0]}\n{answer.strip()}\n{ANSWER_TAGS[1]}"


@dataclass(frozen=True)
class WorkedExample:
    """One few-shot turn: a question and its answer written in the tag format."""

    question: str
    reasoning: str
    answer: str

    def messages(self) -> list[dict[str, str]]:
        return [
            {"role": "user", "content": self.question},
            {"role": "assistant", "content": format_completion(self.reasoning, self.answer)},
        ]


# Hand-written, so that no benchmark question leaks into a prompt. The first is the one measured with
# SmolLM2-135M-Instruct; the others show a word problem and a LaTeX answer.
WORKED_EXAMPLES: tuple[WorkedExample, ...] = (
    WorkedExample("What is 2 + 3?", "2 + 3 = 5.", "5"),
    WorkedExample(
        "Tom buys 4 pencils at $2 each and pays with a $10 bill. How much change does he get?",
        "The pencils cost 4 * 2 = 8 dollars. The change is 10 - 8 = 2 dollars.",
        "2",
    ),
    WorkedExample(
        r"What is $\frac{1}{2} + \frac{1}{3}$?",
        r"With the common denominator 6: $\frac{1}{2} + \frac{1}{3} = \frac{3}{6} + \frac{2}{6} = \frac{5}{6}$.",
        r"\frac{5}{6}",
    ),
)


def _example_messages(example) -> list[dict[str, str]]:
    if isinstance(example, WorkedExample):
        return example.messages()
    if isinstance(example, (tuple, list)) and len(example) == 2 and all(isinstance(x, str) for x in example):
        question, completion = example
        return [{"role": "user", "content": question}, {"role": "assistant", "content": completion}]
    raise TypeError(
        f"a few-shot example must be a WorkedExample or a (question, completion) pair of strings, got {example!r}"
    )


def build_prompt(
    question: str,
    *,
    system_prompt: str | None = SYSTEM_PROMPT,
    few_shot: int | Sequence = 0,
) -> list[dict[str, str]]:
    """The conversational prompt for `question`: system turn, worked-example turns, then the question.

    system_prompt: the system message (None: no system turn, for models whose template has none).
    few_shot: how many of `WORKED_EXAMPLES` to show, or the examples themselves (`WorkedExample`s or
    (question, completion) pairs), as earlier user/assistant turns.

    >>> [m["role"] for m in build_prompt("What is 4 + 4?", few_shot=1)]
    ['system', 'user', 'assistant', 'user']
    """
    if isinstance(few_shot, bool) or not isinstance(few_shot, (int, Sequence)) or isinstance(few_shot, str):
        raise TypeError(f"few_shot must be a count or a sequence of examples, got {few_shot!r}")
    if isinstance(few_shot, int):
        if not 0 <= few_shot <= len(WORKED_EXAMPLES):
            raise InvalidInput(
                f"few_shot must be between 0 and {len(WORKED_EXAMPLES)} (built-in examples), got {few_shot}"
            )
        few_shot = WORKED_EXAMPLES[:few_shot]
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    for example in few_shot:
        messages.extend(_example_messages(example))
    messages.append({"role": "user", "content": question})
    return messages
