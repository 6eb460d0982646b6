"""Tasks: where problems come from (hub, offline copies, local files, the synthetic generator), the paper's
prompts, and its rewards (format 0/1/10 + accuracy 0/10, Sec. 16.1), as TRL-ready datasets and reward functions."""

from gtpo.tasks.prompts import (
    ANSWER_TAGS,
    REASONING_TAGS,
    SYSTEM_PROMPT,
    WORKED_EXAMPLES,
    build_prompt,
    format_completion,
)
from gtpo.tasks.registry import COLUMNS, TASKS, Task, load_task, register_task
from gtpo.tasks.rewards import REWARD_FUNCS, accuracy_reward, format_reward, get_reward_funcs
from gtpo.tasks.sources import MATH_SUBJECTS, TaskSourceError, parse_column_map, read_records
from gtpo.tasks.synthetic import synthetic_rows

__all__ = [
    "ANSWER_TAGS",
    "COLUMNS",
    "MATH_SUBJECTS",
    "REASONING_TAGS",
    "REWARD_FUNCS",
    "SYSTEM_PROMPT",
    "TASKS",
    "WORKED_EXAMPLES",
    "Task",
    "TaskSourceError",
    "accuracy_reward",
    "build_prompt",
    "format_completion",
    "format_reward",
    "get_reward_funcs",
    "load_task",
    "register_task",
    "parse_column_map",
    "read_records",
    "synthetic_rows",
]
