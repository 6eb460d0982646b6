"""Input checks of GTPOTrainer: a dataset without a 'prompt' column is refused when the trainer is built, and a
reward function that raises, returns the wrong number of rewards or a NaN fails naming the function and the row."""

from __future__ import annotations

import math
import numbers

import torch
from trl.trainer.utils import get_callable_name, is_async_callable

from gtpo.errors import UserFunctionError


def is_empty(dataset) -> bool:
    if dataset is None:
        return True
    try:
        return len(dataset) == 0
    except TypeError:  # an IterableDataset: its length is unknown until read
        return False


def require_prompt_column(dataset, name: str) -> None:
    if dataset is None:
        return
    if isinstance(dataset, dict):
        for key, part in dataset.items():
            require_prompt_column(part, f"{name}[{key!r}]")
        return
    columns = getattr(dataset, "column_names", None)
    if columns is None:  # a streaming dataset whose features are unknown until read
        return
    if "prompt" not in columns:
        raise ValueError(
            f"{name} has no 'prompt' column (columns: {list(columns)}). GTPOTrainer, like GRPOTrainer, generates "
            "from a 'prompt' column (plain text or a list of chat messages); rename yours, e.g. "
            "dataset.rename_column('question', 'prompt')."
        )


def guard_reward_funcs(reward_funcs):
    """Wrap plain-callable reward functions so that their failures name the function and the row."""
    if reward_funcs is None:
        return None
    single = not isinstance(reward_funcs, list)
    funcs = [reward_funcs] if single else list(reward_funcs)
    guarded = []
    for func in funcs:
        if isinstance(func, (str, torch.nn.Module, _CheckedReward)) or not callable(func):
            guarded.append(func)  # reward models and hub ids are TRL's business
        elif is_async_callable(func):
            guarded.append(_CheckedAsyncReward(func))
        else:
            guarded.append(_CheckedReward(func))
    return guarded[0] if single else guarded


class _CheckedReward:
    """A reward function that reports which function and which row went wrong. Picklable if `func` is."""

    def __init__(self, func):
        self.func = func
        self.__name__ = get_callable_name(func)  # TRL logs rewards/<name>/mean under this name

    def __call__(self, prompts, completions, **kwargs):
        try:
            rewards = self.func(prompts=prompts, completions=completions, **kwargs)
        except Exception as error:
            raise self._locate(error, prompts, completions, kwargs) from error
        return _check_rewards(self.__name__, rewards, prompts, completions)

    def _locate(self, error, prompts, completions, kwargs):
        """Re-run row by row (with logging hooks muted) to name the first row that raises."""
        for row, row_kwargs in _rows(prompts, completions, kwargs):
            try:
                self.func(**row_kwargs)
            except Exception:
                return _raised(self.__name__, error, row, prompts, completions)
        return _raised(self.__name__, error, None, prompts, completions)


class _CheckedAsyncReward(_CheckedReward):
    async def __call__(self, prompts, completions, **kwargs):
        try:
            rewards = await self.func(prompts=prompts, completions=completions, **kwargs)
        except Exception as error:
            for row, row_kwargs in _rows(prompts, completions, kwargs):
                try:
                    await self.func(**row_kwargs)
                except Exception:
                    raise _raised(self.__name__, error, row, prompts, completions) from error
            raise _raised(self.__name__, error, None, prompts, completions) from error
        return _check_rewards(self.__name__, rewards, prompts, completions)


def _rows(prompts, completions, kwargs):
    """(row, keyword arguments for that row alone): per-row lists sliced, logging hooks muted."""
    n = len(prompts)
    for row in range(n):
        row_kwargs = {
            key: (value[row : row + 1] if isinstance(value, list) and len(value) == n else value)
            for key, value in kwargs.items()
        }
        for hook in ("log_extra", "log_metric"):
            if hook in kwargs:
                row_kwargs[hook] = _ignore
        yield row, {"prompts": prompts[row : row + 1], "completions": completions[row : row + 1], **row_kwargs}


def _ignore(*args, **kwargs) -> None:
    return None


def _raised(name, error, row, prompts, completions) -> UserFunctionError:
    what = f"raised {type(error).__name__}: {error}"
    if row is None:
        return UserFunctionError(
            f"reward function {name!r} {what} on a batch of {len(prompts)} rows (no single row raises on its own)"
        )
    return _reward_error(name, what, row, prompts, completions)


def _check_rewards(name, rewards, prompts, completions):
    n = len(prompts)
    try:
        count = len(rewards)
    except TypeError:
        raise UserFunctionError(
            f"reward function {name!r} returned {type(rewards).__name__}, not a list of {n} rewards "
            "(one float per completion, or None where the reward does not apply)"
        ) from None
    if count != n:
        raise UserFunctionError(
            f"reward function {name!r} returned {count} rewards for {n} completions; it must return one per "
            "completion (None where the reward does not apply)"
        )
    for row, value in enumerate(rewards):
        if value is None:
            continue  # TRL's "not applicable"
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if not isinstance(value, numbers.Real):
            return_type = type(value).__name__
            raise _reward_error(name, f"returned a {return_type} ({value!r}), not a number", row, prompts, completions)
        if not math.isfinite(value):
            raise _reward_error(
                name, f"returned {value} (use None to mark a reward as not applicable)", row, prompts, completions
            )
    return rewards


def _reward_error(name, what, row, prompts, completions) -> UserFunctionError:
    return UserFunctionError(
        f"reward function {name!r} {what} on row {row} of this process's batch: "
        f"prompt={_preview(prompts[row])}, completion={_preview(completions[row])}"
    )


def _preview(value, limit: int = 160) -> str:
    if isinstance(value, list) and value and isinstance(value[-1], dict):
        value = value[-1].get("content", value)  # the last chat message
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
