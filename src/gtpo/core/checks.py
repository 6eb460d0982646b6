"""The generic input checks of `gtpo.core`: one-line ValueErrors, one host sync per call. Each function's own
checks sit beside it (`advantages`, `spans`, `entropy`; the loss's beside its inputs, in `inputs`).

Static checks (types, shapes, dtypes, option values) raise at once. Checks of tensor *values*
(finite advantages, 0/1 masks, right padding, a positive token normalizer) are collected as
``(flag, message)`` pairs: ``flag`` is a 0-d bool tensor left on its device, ``message`` a callable
that builds the text only on the failure path. Each public function of `gtpo.core` hands its pairs
to `raise_if_any` once, so a call costs at most one device→host sync.

The math lives in `gtpo.core`; this module imports nothing from it (no import cycle).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
from torch import Tensor

__all__ = [
    "check_group_size",
    "check_number",
    "check_weight",
    "float_vector_check",
    "lookup",
    "mask_checks",
    "raise_if_any",
    "validate_group_batch",
]

Check = tuple[Tensor, Callable[[], str]]  # (0-d bool flag on the device, message built on failure)


def lookup(table, name, what: str):
    """table[name] (a mapping) or name (a tuple of names), or a ValueError naming the valid choices."""
    if not isinstance(name, str) or name not in table:
        raise ValueError(f"unknown {what} {name!r}; valid: {', '.join(sorted(table))}")
    return table[name] if isinstance(table, Mapping) else name


def raise_if_any(checks: list[Check]) -> None:
    """Raise ValueError(message) for the first check whose flag is True.

    All flags are reduced on their device and read back with a single device→host sync; messages
    are only built (and may inspect tensors) on the failure path.
    """
    if not checks:
        return
    flags = torch.stack([flag.reshape(()) for flag, _ in checks])  # (n_checks,)
    if bool(flags.any()):  # the one sync of a call
        for flag, message in checks:
            if bool(flag):
                raise ValueError(message())


def float_vector_check(x, n: int | None, name: str) -> Check:
    """Static checks of an (n,) floating tensor; returns the deferred finiteness check."""
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape (N,), got {type(x).__name__}")
    if x.dim() != 1:
        raise ValueError(f"{name} must have shape (N,) (one value per completion), got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating tensor, got dtype {x.dtype}; cast it with .float()")
    if n is not None and x.shape[0] != n:
        raise ValueError(f"{name} has {x.shape[0]} entries but the batch has N={n} completions")

    def message() -> str:
        rows = (~torch.isfinite(x)).nonzero().flatten()[:5].tolist()
        return f"{name} must be finite; non-finite values at rows {rows} (check the rewards and their std)"

    return (~torch.isfinite(x)).any(), message


def mask_checks(
    mask, shape: tuple[int, ...], name: str = "completion_mask", *, right_padded: bool = True
) -> tuple[Tensor, list[Check]]:
    """Static checks of an (N, T) mask; returns the bool mask and its deferred value checks."""
    if not isinstance(mask, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(mask).__name__}")
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(mask.shape)} but the completion tensors have shape {tuple(shape)}")
    checks = []
    if mask.dtype == torch.bool:
        valid = mask  # (N, T)
    else:
        valid = mask != 0  # (N, T)
        checks.append((((mask != 0) & (mask != 1)).any(), lambda: f"{name} must hold only 0/1 (or be bool)"))
    if right_padded:
        # Right padding (valid tokens first, as TRL produces): a valid token never follows a pad.
        late = (valid[:, 1:] & ~valid[:, :-1]).any(dim=-1)  # (N,)

        def message() -> str:
            rows = late.nonzero().flatten()[:5].tolist()
            return (
                f"{name} must be right-padded (each row's valid tokens first, as TRL produces); rows {rows} "
                "have a valid token after padding: flip left-padded batches to right padding first"
            )

        checks.append((late.any(), message))
    return valid, checks


def check_group_size(group_size, n: int | None = None, what: str = "rows") -> None:
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int (completions per prompt), got {group_size!r}")
    if n is not None and n % group_size != 0:
        raise ValueError(f"N={n} {what} is not a multiple of group_size={group_size}")


def check_weight(weight, name: str = "positive_weight") -> None:
    """A λ of Eq. 5 inside a span: a finite number >= 0 (the paper: 2 for A > 0, 0 for A < 0)."""
    if isinstance(weight, bool) or not isinstance(weight, (int, float)):
        raise ValueError(f"{name} must be a number, got {weight!r}")
    if not math.isfinite(weight) or weight < 0:
        raise ValueError(f"{name} must be finite and >= 0 (the paper uses 2 for A > 0, 0 for A < 0), got {weight!r}")


def check_number(value, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


def check_entropy_threshold(value, name: str = "entropy threshold") -> None:
    """Eq. 6's threshold on ⟨H⟩_i: a finite number of nats > 0 (0 would filter every completion). `GTPOConfig` runs
    this same check on ``entropy_threshold``."""
    check_number(value, name)
    if value <= 0:
        raise ValueError(f"{name} must be > 0 nats (Eq. 6 keeps completions with ⟨H⟩_i ≤ it), got {value!r}")


def validate_group_batch(
    completion_ids: Tensor, completion_mask: Tensor, advantages: Tensor, group_size: int
) -> Tensor:
    """Check a batch of groups and return its completion mask as bool.

    Args:
        completion_ids: (N, T) integer token ids (non-negative).
        completion_mask: (N, T) bool or 0/1, right-padded (each row's valid tokens first).
        advantages: (N,) finite floats.
        group_size: G ≥ 1 with N a multiple of G.

    Returns:
        (N, T) bool validity mask.

    Raises:
        ValueError: saying what is wrong and how to fix it. Costs one device→host sync.
    """
    if not isinstance(completion_ids, Tensor) or completion_ids.dim() != 2:
        shape = tuple(completion_ids.shape) if isinstance(completion_ids, Tensor) else type(completion_ids).__name__
        raise ValueError(f"completion_ids must be an (N, T) tensor, got {shape}")
    if completion_ids.is_floating_point() or completion_ids.is_complex() or completion_ids.dtype == torch.bool:
        raise ValueError(f"completion_ids must hold integer token ids, got dtype {completion_ids.dtype}")
    check_group_size(group_size)
    n = completion_ids.shape[0]
    if n % group_size != 0:
        raise ValueError(
            f"N={n} completions is not a multiple of group_size={group_size}: rows g*G .. g*G+G-1 must "
            "form group g, so pass whole groups (compute spans where all completions of a prompt are visible)"
        )
    valid, checks = mask_checks(completion_mask, tuple(completion_ids.shape))
    checks.append(float_vector_check(advantages, n, "advantages"))
    checks.append(((completion_ids < 0).any(), lambda: "completion_ids must be non-negative token ids"))
    raise_if_any(checks)
    return valid
