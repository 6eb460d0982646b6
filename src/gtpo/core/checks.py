"""Input checks of the GTPO algorithm (`gtpo.core`): one-line ValueErrors, one host sync per call.

Static checks (types, shapes, dtypes, option values) raise at once. Checks of tensor *values*
(finite advantages, 0/1 masks, right padding, a positive token normalizer) are collected as
``(flag, message)`` pairs: ``flag`` is a 0-d bool tensor left on its device, ``message`` a callable
that builds the text only on the failure path. Each public function of `gtpo.core` hands its pairs
to `raise_if_any` once, so a call costs at most one device→host sync.

The math lives in `gtpo.core`; this module imports only its loss registry (which imports nothing of gtpo).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from gtpo.core import registry

__all__ = [
    "check_group_size",
    "check_loss_inputs",
    "check_number",
    "check_weight",
    "float_vector_check",
    "initial_entropy_value",
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


def check_weight(positive_weight) -> None:
    if isinstance(positive_weight, bool) or not isinstance(positive_weight, (int, float)):
        raise ValueError(f"positive_weight must be a number, got {positive_weight!r}")
    if not math.isfinite(positive_weight) or positive_weight < 0:
        raise ValueError(f"positive_weight must be finite and >= 0 (the paper uses 2), got {positive_weight!r}")


def check_number(value, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")


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


def initial_entropy_value(initial_entropy, device: torch.device) -> float | Tensor:
    """⟨H⟩_ini for ``entropy_filter='auto'``: a float, or a () tensor moved to ``device`` (no sync)."""
    if initial_entropy is None:
        raise ValueError(
            "entropy_filter='auto' needs initial_entropy, the model's mean completion entropy ⟨H⟩_ini "
            "measured before training (Eq. 6; e.g. mean_completion_entropy over completions of the first "
            "100 training prompts, averaged). Pass initial_entropy=<float>, or choose entropy_filter="
            "'always' or 'never'."
        )
    if isinstance(initial_entropy, Tensor):
        if initial_entropy.numel() != 1:
            raise ValueError(f"initial_entropy must be a scalar, got shape {tuple(initial_entropy.shape)}")
        return initial_entropy.to(device).reshape(())  # () stays on the device
    if isinstance(initial_entropy, bool) or not isinstance(initial_entropy, (int, float)):
        raise ValueError(f"initial_entropy must be a scalar number of nats, got {initial_entropy!r}")
    if not math.isfinite(initial_entropy) or initial_entropy < 0:
        raise ValueError(f"initial_entropy must be a finite entropy >= 0 (nats), got {initial_entropy!r}")
    return float(initial_entropy)


def _aggregation_normalizer(inputs, settings):
    """The one extra number the normaliser needs (static checks) and its deferred device check, if any."""
    normaliser = registry.normaliser_of(settings.aggregation)
    aggregation, max_completion_length, token_normalizer = (
        settings.aggregation, settings.max_completion_length, inputs.token_normalizer
    )  # fmt: skip
    if normaliser.needs != "max_completion_length" and max_completion_length is not None:
        raise ValueError(f"max_completion_length is used only by aggregation='dr_grpo', not {aggregation!r}")
    if normaliser.needs != "token_normalizer" and token_normalizer is not None:
        others = ", ".join(
            repr(n) for n in sorted(registry.LOSS_TYPES) if registry.LOSS_TYPES[n].token_sum and n != "dapo"
        )
        raise ValueError(
            f"token_normalizer is used only by aggregation='dapo' and the other token sums ({others}), not "
            f"{aggregation!r}"
        )
    if normaliser.needs == "max_completion_length":
        if (
            isinstance(max_completion_length, bool)
            or not isinstance(max_completion_length, int)
            or max_completion_length < 1
        ):
            raise ValueError(
                f"aggregation={aggregation!r} divides by N × max_completion_length: pass max_completion_length=<int "
                f">= 1> (the generation limit, TRL's GRPOConfig.max_completion_length), got {max_completion_length!r}"
            )
        return max_completion_length, None
    if normaliser.needs is None:
        return None, None
    hint = (
        f"aggregation={aggregation!r} divides by the valid tokens of the whole global batch per rank: pass "
        "token_normalizer=<number > 0> (TRL: num_items_in_batch / num_processes)"
    )
    if isinstance(token_normalizer, Tensor):
        if token_normalizer.numel() != 1 or token_normalizer.is_complex():
            raise ValueError(f"{hint}, got a tensor of shape {tuple(token_normalizer.shape)}")
        value = token_normalizer.detach().reshape(()).float()  # () stays on its device
        return value, (~(torch.isfinite(value) & (value > 0)), lambda: f"{hint}, got {value.item()!r}")
    if (
        isinstance(token_normalizer, bool)
        or not isinstance(token_normalizer, (int, float))
        or not (math.isfinite(token_normalizer) and token_normalizer > 0)
    ):
        raise ValueError(f"{hint}, got {token_normalizer!r}")
    return float(token_normalizer), None


def _shape_of(value) -> object:
    return tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__


def check_loss_options(inputs, settings) -> None:
    """The checks of `gtpo.core.gtpo_loss`'s GRPOConfig options (docs/core.md): shapes and ranges, no sync.

    Args:
        inputs, settings: `gtpo.core.inputs.LossInputs` and `LossSettings`.
    """
    logps = inputs.per_token_logps
    shape = tuple(logps.shape) if isinstance(logps, Tensor) else (0, 0)
    surrogate = registry.surrogate_of(settings.surrogate)
    if surrogate.check is not None:
        surrogate.check(inputs, settings, shape)
    if settings.importance_sampling_level not in ("token", "sequence"):
        raise ValueError(
            f"importance_sampling_level must be 'token' or 'sequence', got {settings.importance_sampling_level!r}"
        )
    delta, beta = settings.delta, settings.beta
    if delta is not None:
        check_number(delta, "delta")
        if delta <= 1 + settings.epsilon_high:
            raise ValueError(
                f"delta must exceed 1 + epsilon_high = {1 + settings.epsilon_high} (it caps r), got {delta}"
            )
    if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not (math.isfinite(beta) and beta >= 0):
        raise ValueError(f"beta must be a finite number >= 0, got {beta!r}")
    n, token_mask, ref = shape[0], inputs.token_mask, inputs.ref_per_token_logps
    if token_mask is not None and (
        not isinstance(token_mask, Tensor) or tuple(token_mask.shape) not in (shape, (n, 1))
    ):
        raise ValueError(f"token_mask must have shape {shape} or {(n, 1)}, got {_shape_of(token_mask)}")
    if beta and (not isinstance(ref, Tensor) or tuple(ref.shape) != shape):
        got = tuple(ref.shape) if isinstance(ref, Tensor) else ref
        raise ValueError(f"beta > 0 needs ref_per_token_logps of shape {shape}, got {got}")


def check_loss_inputs(inputs, settings) -> tuple[Tensor, float | Tensor | None]:
    """All checks of `gtpo.core.gtpo_loss` (mode names already looked up), with one sync.

    Args:
        inputs, settings: `gtpo.core.inputs.LossInputs` and `LossSettings`.

    Returns:
        ``(valid, normalizer)``: the (N, T) bool mask, and the normaliser's extra number
        (``max_completion_length`` for ``dr_grpo``, ``token_normalizer`` for the token sums, else None).
    """
    check_weight(settings.positive_weight)
    for name in ("gamma", "entropy_threshold", "epsilon_low", "epsilon_high"):
        check_number(getattr(settings, name), name)
    if settings.epsilon_low < 0 or settings.epsilon_high < 0:
        raise ValueError(
            f"epsilon_low and epsilon_high must be >= 0, got {settings.epsilon_low}, {settings.epsilon_high}"
        )
    logps = inputs.per_token_logps
    if not isinstance(logps, Tensor) or logps.dim() != 2 or not logps.is_floating_point():
        raise ValueError("per_token_logps must be an (N, T) floating tensor")
    shape = tuple(logps.shape)
    n = shape[0]
    # Any 0/1 mask works for the loss; right padding only matters where the spans are computed.
    valid, checks = mask_checks(inputs.completion_mask, shape, right_padded=False)
    checks.append(float_vector_check(inputs.advantages, n, "advantages"))
    forward_span, backward_span = inputs.forward_span, inputs.backward_span
    if (forward_span is None) != (backward_span is None):
        raise ValueError("pass both forward_span and backward_span (from conflict_spans), or neither")
    for name in ("forward_span", "backward_span", "old_per_token_logps", "token_entropy"):
        t = getattr(inputs, name)
        if t is not None and (not isinstance(t, Tensor) or tuple(t.shape) != shape):
            raise ValueError(f"{name} must have the shape of per_token_logps {shape}, got {_shape_of(t)}")
    weights = inputs.importance_weights
    if weights is not None and (not isinstance(weights, Tensor) or tuple(weights.shape) not in (shape, (n, 1))):
        raise ValueError(
            f"importance_weights must have shape {shape} or {(n, 1)} (per token or per sequence), got "
            f"{_shape_of(weights)}"
        )
    if forward_span is not None and (forward_span.dtype != torch.bool or backward_span.dtype != torch.bool):
        raise ValueError("forward_span and backward_span must be bool tensors (from conflict_spans)")
    entropy_filter, entropy_term, gamma = settings.entropy_filter, settings.entropy_term, settings.gamma
    needs_entropy = entropy_filter != "never" or (entropy_term != "none" and gamma != 0)
    if inputs.token_entropy is None and needs_entropy:
        raise ValueError(
            f"token_entropy is needed for entropy_filter={entropy_filter!r} with entropy_term={entropy_term!r}, "
            f"gamma={gamma}: pass token_entropy (see token_entropy()), or switch the entropy parts off with "
            "entropy_filter='never' and gamma=0 (or entropy_term='none')"
        )
    check_group_size(settings.group_size, n, "completions")
    normalizer, normalizer_check = _aggregation_normalizer(inputs, settings)
    if normalizer_check is not None:
        checks.append(normalizer_check)
    raise_if_any(checks)
    if isinstance(normalizer, Tensor):
        normalizer = normalizer.to(logps.device)
    return valid, normalizer


def check_weights_inputs(forward, backward, advantages, positive_weight, group_size) -> None:
    """Checks of `gtpo.core.conflict_weights` (one sync)."""
    for name, span in (("forward", forward), ("backward", backward)):
        if not isinstance(span, Tensor) or span.dtype != torch.bool or span.dim() != 2:
            raise ValueError(f"{name} must be an (N, T) bool tensor (from conflict_spans)")
    if forward.shape != backward.shape:
        raise ValueError(f"forward {tuple(forward.shape)} and backward {tuple(backward.shape)} spans differ in shape")
    check_weight(positive_weight)
    check_group_size(group_size, forward.shape[0])
    raise_if_any([float_vector_check(advantages, forward.shape[0], "advantages")])


def check_keep_inputs(mean_entropy, advantages, threshold, group_size) -> None:
    """Checks of `gtpo.core.entropy_keep_mask` once its mode is looked up (one sync)."""
    check_number(threshold, "entropy threshold")
    if not isinstance(mean_entropy, Tensor) or mean_entropy.dim() != 1:
        raise ValueError("mean_entropy must be an (N,) tensor (see mean_completion_entropy())")
    check_group_size(group_size, mean_entropy.shape[0])
    raise_if_any([float_vector_check(advantages, mean_entropy.shape[0], "advantages")])


def check_shift_inputs(advantages, mean_entropy, keep, gamma) -> None:
    """Checks of `gtpo.core.shift_advantages` (no sync)."""
    check_number(gamma, "gamma")
    tensors = all(isinstance(t, Tensor) for t in (advantages, mean_entropy, keep))
    if (
        not tensors
        or keep.dtype != torch.bool
        or keep.shape != advantages.shape
        or mean_entropy.shape != advantages.shape
    ):
        raise ValueError(
            f"advantages {tuple(advantages.shape)}, mean_entropy {tuple(mean_entropy.shape)} and keep "
            f"{tuple(keep.shape)} must all be (N,), keep bool"
        )


def check_rewards(rewards, group_size, scale: str) -> None:
    """Checks of `gtpo.core.group_advantages` once its scale is looked up (one sync)."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    check = float_vector_check(rewards, None, "rewards")
    if rewards.shape[0] % group_size != 0:
        raise ValueError(f"N={rewards.shape[0]} rewards is not a multiple of group_size={group_size}")
    if scale == "group" and group_size < 2:
        raise ValueError("scale='group' needs group_size >= 2 (the unbiased std of one reward is undefined)")
    raise_if_any([check])


def check_signs_inputs(advantages, group_size) -> None:
    """Checks of `gtpo.core.advantage_signs` (one sync)."""
    check = float_vector_check(advantages, None, "advantages")
    check_group_size(group_size, advantages.shape[0], "advantages")
    raise_if_any([check])


def check_entropy_inputs(token_entropy, completion_mask) -> Tensor:
    """Checks of `gtpo.core.mean_completion_entropy` (one sync); returns the (N, T) bool mask."""
    if not isinstance(token_entropy, Tensor) or token_entropy.dim() != 2:
        raise ValueError("token_entropy must be an (N, T) tensor (see token_entropy())")
    valid, checks = mask_checks(completion_mask, tuple(token_entropy.shape), right_padded=False)
    raise_if_any(checks)
    return valid
