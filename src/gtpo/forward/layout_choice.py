"""Which layout scores a micro-batch, TRL's padded one or the packed one of `gtpo.forward.packing`.

Both give the same numbers (tested); they differ in time only. The packed layout needs fewer FLOPs where a group's
prompt is long or its completions' lengths differ, but a dense mask costs N² attention pairs and, on a GPU, its
extra small kernels and host syncs cost time whatever the FLOPs. :func:`choose_layout` is the one decision: the
user's choice (:data:`LAYOUT_ENV`) where one is set, else :func:`packed_is_cheaper` with the device's fixed costs
(:data:`LAYOUT_COSTS`). How a packed batch's attention runs, the dense mask or FlexAttention's block mask, is the
user's opt-in (:data:`ATTENTION_ENV`, :func:`packed_attention`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass


def _layer_costs(config) -> tuple[float, float] | None:
    """FLOPs of one decoder layer per token (the projections) and per (query, key) pair (QK^T and AV)."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = getattr(config, "hidden_size", None)
    layers = getattr(config, "num_hidden_layers", None)
    if not hidden or not layers:
        return None
    heads = getattr(config, "num_attention_heads", None) or 1
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    intermediate = getattr(config, "intermediate_size", None) or 4 * hidden
    attention_width = heads * head_dim
    params = hidden * (2 * attention_width + 2 * kv_heads * head_dim) + 3 * hidden * intermediate
    return 2.0 * params * layers, 4.0 * attention_width * layers


@dataclass(frozen=True)
class LayoutCosts:
    """What the packed layout costs on one kind of device beyond the FLOPs it saves, for :func:`packed_is_cheaper`.

    Attributes:
        flops_per_s: the rate the step's FLOPs run at there (forward + backward of the padded layout, measured).
        overhead_s: seconds packing adds to one micro-batch's forward + backward whatever it saves: its extra small
            kernels' launches, its host work and the host syncs the padded path does not wait on. Read it from
            ``benchmarks/bench_loss_step.py`` as the packed arm's time less the padded arm's at a shape where their
            FLOPs are nearly equal (the host-bound 2-layer ``paper-vocab`` shape).
    """

    flops_per_s: float
    overhead_s: float

    def __post_init__(self):
        if not self.flops_per_s > 0 or not self.overhead_s >= 0:
            raise ValueError(f"LayoutCosts needs flops_per_s > 0 and overhead_s >= 0, got {self!r}")


# Costs by device type; a device type without an entry (a CPU) packs wherever packing needs fewer FLOPs. "cuda" was
# calibrated on one H200 in bf16 (docs/measurements/gpu-h200-20261126, bench_loss_step.py): at the 2-layer
# paper-vocabulary shape, where the GPU waits on the host, packing took 18.24 ms against the padded layout's 14.83 ms
# for nearly the same FLOPs (3.4 ms); at Qwen2.5-1.5B's config the padded layout's forward + backward ran 8 x 454
# tokens in 113.7 ms, about 250 TFLOP/s, and packing saved 14.5 ms. On one H100 (docs/measurements/gpu-h100-20261128)
# the rule's packing at 1.5B was 1.081x TRL's against the padded arm's 1.027x: a GPU run that measures otherwise
# replaces the entry (``LAYOUT_COSTS["cuda"] = LayoutCosts(...)``) or sets the layout (:data:`LAYOUT_ENV`). On a CPU
# the FLOPs dominate at every shape measured (docs/performance.md), so there it is the FLOP count alone.
LAYOUT_COSTS: dict[str, LayoutCosts] = {"cuda": LayoutCosts(flops_per_s=2.5e14, overhead_s=3.4e-3)}

# The user's choice of layout, read at every decision: "auto" (the default) weighs the costs; "packed" packs every
# batch the packed layout can represent; "padded" keeps TRL's padded layout (as use_prefix_sharing=False does).
# An environment variable, so that a recipe's `env:` block, a command line or a GPU check sets it.
LAYOUT_ENV = "GTPO_PREFIX_LAYOUT"
LAYOUTS = ("auto", "packed", "padded")  # the first is the default


def layout_override(value: str | None = None) -> str:
    """The layout asked for: ``value``, else :data:`LAYOUT_ENV`'s value, else ``"auto"``.

    Args:
        value: one of :data:`LAYOUTS`, or None to read the environment.

    Returns:
        One of :data:`LAYOUTS`. A value outside them is a one-line ValueError naming the valid ones.
    """
    return _setting(value, "layout", LAYOUT_ENV, LAYOUTS)


def _setting(value: str | None, name: str, env: str, choices: tuple[str, ...]) -> str:
    """``value``, else the environment variable ``env``'s value, else ``choices[0]`` (the default), checked against
    ``choices``: outside them, a one-line ValueError naming where the value came from (``name`` or ``env``) and the
    valid ones."""
    source = name if value is not None else env
    value = value if value is not None else (os.environ.get(env) or choices[0])
    if value not in choices:
        raise ValueError(f"{source}={value!r} is not one of {list(choices)}")
    return value


# How the packed layout's attention runs, read at every packed micro-batch: "dense" (the default) hands SDPA the
# (1, 1, N, N) mask of `packing.PackedBatch.attention_mask`, and SDPA computes every one of the N² pairs; "flex" hands
# torch's FlexAttention a block mask of the same predicate (`gtpo.forward.flex`), which skips the masked blocks.
# Opt-in: no GPU has measured it, so :func:`packed_is_cheaper` still counts N² pairs either way.
ATTENTION_ENV = "GTPO_PACKED_ATTENTION"
ATTENTIONS = ("dense", "flex")  # the first is the default


def packed_attention(value: str | None = None) -> str:
    """The packed layout's attention asked for: ``value``, else :data:`ATTENTION_ENV`'s value, else ``"dense"``.

    Returns:
        One of :data:`ATTENTIONS`. A value outside them is a one-line ValueError naming the valid ones.
    """
    return _setting(value, "attention", ATTENTION_ENV, ATTENTIONS)


def packed_is_cheaper(
    config, batch: int, length: int, packed_length: int, device_type: str = "cpu", costs: LayoutCosts | None = None
) -> bool:
    """Whether the packed layout takes less time than TRL's padded one, by FLOPs and the device's fixed costs.

    Args:
        config: the model's config (hidden size, heads, layers, MLP width).
        batch, length: B and L of TRL's (B, L) padded batch.
        packed_length: N of the packed sequence.
        device_type: where the step runs (``"cuda"``, ``"cpu"``, ...): its :data:`LAYOUT_COSTS` entry, if any.
        costs: the device's costs (default: ``LAYOUT_COSTS.get(device_type)``). With costs, packing wins only when the
            forward + backward FLOPs it saves (3 x the forward's), at ``costs.flops_per_s``, take longer than
            ``costs.overhead_s``; without, fewer FLOPs decide.

    Returns:
        True where packing is expected to be faster. Padded: B·L tokens and B·L² attention pairs (SDPA computes the
        masked ones too); packed: N tokens and N² pairs. The LM head scores the same positions in both, so it is left
        out. A config without a hidden size or layer count gives False.
    """
    layer_costs = _layer_costs(config)
    if layer_costs is None:
        return False
    per_token, per_pair = layer_costs
    padded_cost = batch * length * (per_token + length * per_pair)
    packed_cost = packed_length * (per_token + packed_length * per_pair)
    costs = costs if costs is not None else LAYOUT_COSTS.get(device_type)
    if costs is None:
        return packed_cost <= padded_cost
    return 3.0 * (padded_cost - packed_cost) / costs.flops_per_s > costs.overhead_s


def choose_layout(
    config, batch: int, length: int, packed_length: int, device_type: str = "cpu", override: str | None = None
) -> str:
    """The layout to score a micro-batch in: the one decision every caller of the packed layout goes through.

    Args:
        config, batch, length, packed_length, device_type: as :func:`packed_is_cheaper`.
        override: one of :data:`LAYOUTS` (default: :func:`layout_override`, i.e. :data:`LAYOUT_ENV` or "auto").

    Returns:
        ``"packed"`` or ``"padded"``: the override where it is not "auto", else the cheaper one by
        :func:`packed_is_cheaper` on this device. Both give the same numbers (tested); only their time differs.
        Where the packed layout cannot represent a batch the caller keeps the padded one whatever this says.
    """
    layout = layout_override(override)
    if layout != "auto":
        return layout
    return "packed" if packed_is_cheaper(config, batch, length, packed_length, device_type) else "padded"
