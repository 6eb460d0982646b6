"""`GTPOConfig`'s checks of its GTPO fields (and of the TRL options they combine with), one line per refusal."""

from __future__ import annotations

import logging
import math

from gtpo.core import paper, registry
from gtpo.core.checks import check_entropy_threshold
from gtpo.core.entropy import ENTROPY_FILTERS, ENTROPY_TERMS
from gtpo.core.spans import COMBINE_MODES, CONFLICT_COUNTS, SPAN_SIDES

logger = logging.getLogger("gtpo.trainer.config")

ALGORITHMS = ("gtpo", "grpo")
# gtpo_aggregation's choices with loss_type="grpo": core's reductions that are not TRL loss types of their own, i.e.
# Eq. 7's "sequence" and the authors' "reference" (every other reduction is chosen by its loss_type).
AGGREGATIONS = tuple(name for name in registry.NORMALISERS if name not in registry.LOSS_TYPES)
ENTROPY_TEMPERATURES = ("model", "sampling")
LOGPROB_TEMPERATURES = ("sampling", "model")


# GTPOConfig's own fields (those GRPOConfig lacks) that act with algorithm='grpo' too; every other one of its own
# fields is GTPO's objective and is ignored by a GRPO run (:func:`ignored_with_grpo`).
BOTH_ALGORITHMS = frozenset(
    {
        "algorithm",
        "authors_code",  # also sets TRL's temperature and scale_rewards
        "use_prefix_sharing",
        "fast_generation",
        "cuda_graph_generation",
        "log_completions_max_groups",
        "print_completions",
    }
)


def gtpo_only_fields(config_class) -> list:
    """The dataclass fields of ``config_class`` (GTPOConfig) that GRPOConfig lacks and only algorithm='gtpo' reads."""
    from dataclasses import fields

    from trl import GRPOConfig

    trl_names = {f.name for f in fields(GRPOConfig)}
    return [f for f in fields(config_class) if f.name not in trl_names and f.name not in BOTH_ALGORITHMS]


def ignored_with_grpo(config) -> list[str]:
    """``name=value`` for each GTPO-only field of ``config`` set away from its default, in declaration order."""
    from dataclasses import MISSING

    ignored = []
    for f in gtpo_only_fields(type(config)):
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        value = getattr(config, f.name)
        if value != default:
            ignored.append(f"{f.name}={value!r}")
    return ignored


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"GTPOConfig.{name}={value!r} is not valid; choose one of {list(choices)}.")


def _check_number(name: str, value, *, minimum: float, strict: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > minimum if strict else value >= minimum)
    if not ok:
        bound = f"> {minimum}" if strict else f">= {minimum}"
        raise ValueError(f"GTPOConfig.{name}={value!r} must be a finite number {bound}.")


def check_conflict_guard(config) -> None:
    """`conflict_guard` sets λ itself (0 or 1): refuse the fields it replaces, and a guard that would not act."""
    if not isinstance(config.conflict_guard, bool):
        raise ValueError(f"GTPOConfig.conflict_guard must be True or False, got {config.conflict_guard!r}.")
    if not config.conflict_guard:
        return
    if not config.conflict_correction:
        raise ValueError(
            "conflict_guard=True with conflict_correction=False: the guard changes the conflict correction's λ, so "
            "there is nothing for it to act on; set conflict_correction=True, or conflict_guard=False."
        )
    if config.authors_code:
        raise ValueError(
            "conflict_guard=True with authors_code=True: the guard replaces the λ the authors' code computes; "
            "choose one."
        )
    replaced = {
        "conflict_positive_weight": (config.conflict_positive_weight, paper.POSITIVE_WEIGHT),
        "conflict_negative_weight": (config.conflict_negative_weight, paper.NEGATIVE_WEIGHT),
        "conflict_combine": (config.conflict_combine, "union"),
    }
    for name, (value, default) in replaced.items():
        if value != default:
            raise ValueError(
                f"conflict_guard=True with {name}={value!r}: the guard sets λ to 0 or 1 itself, so {name} would be "
                f"ignored; leave it at {default!r}, or set conflict_guard=False."
            )


def check_conflict_exclude_common_prefix(config) -> None:
    """`conflict_exclude_common_prefix` changes the conflict correction's λ: refuse it where there is none to change."""
    value = config.conflict_exclude_common_prefix
    if not isinstance(value, bool):
        raise ValueError(f"GTPOConfig.conflict_exclude_common_prefix must be True or False, got {value!r}.")
    if value and not config.conflict_correction:
        raise ValueError(
            "conflict_exclude_common_prefix=True with conflict_correction=False: without the correction every token "
            "already gets GRPO's update; set conflict_correction=True, or conflict_exclude_common_prefix=False."
        )
    if value and config.conflict_span_sides == "backward":
        raise ValueError(
            "conflict_exclude_common_prefix=True with conflict_span_sides='backward': a common prefix lies in the "
            "leading span, which that setting leaves out; choose one."
        )


def _check_layout_override() -> None:
    """The packed-or-padded choice a user may set in the environment (`layout_choice.LAYOUT_ENV`), and the packed
    layout's attention (`layout_choice.ATTENTION_ENV`), refused in one line when the config is made rather than at
    the first scored batch."""
    from gtpo.forward.layout_choice import layout_override, packed_attention

    layout_override()
    packed_attention()


def validate_gtpo(config) -> None:
    """`GTPOConfig`'s GTPO fields, before TRL's own `__post_init__`: each bad value is one ValueError line."""
    _check_choice("algorithm", config.algorithm, ALGORITHMS)
    _check_layout_override()
    _check_choice("conflict_combine", config.conflict_combine, COMBINE_MODES)
    _check_choice("entropy_filter", config.entropy_filter, ENTROPY_FILTERS)
    _check_choice("entropy_term", config.entropy_term, ENTROPY_TERMS)
    _check_choice("gtpo_aggregation", config.gtpo_aggregation, AGGREGATIONS)
    _check_choice("entropy_temperature", config.entropy_temperature, ENTROPY_TEMPERATURES)
    if not isinstance(config.conflict_correction, bool):
        raise ValueError(f"GTPOConfig.conflict_correction must be True or False, got {config.conflict_correction!r}.")
    _check_number("conflict_positive_weight", config.conflict_positive_weight, minimum=0.0)
    _check_number("conflict_negative_weight", config.conflict_negative_weight, minimum=0.0)
    _check_choice("conflict_span_sides", config.conflict_span_sides, SPAN_SIDES)
    _check_choice("conflict_count", config.conflict_count, CONFLICT_COUNTS)
    _check_choice("logprob_temperature", config.logprob_temperature, LOGPROB_TEMPERATURES)
    if config.entropy_clamp is not None:
        _check_number("entropy_clamp", config.entropy_clamp, minimum=0.0, strict=True)
    if not isinstance(config.authors_code, bool):
        raise ValueError(f"GTPOConfig.authors_code must be True or False, got {config.authors_code!r}.")
    check_conflict_guard(config)
    check_conflict_exclude_common_prefix(config)
    check_entropy_threshold(config.entropy_threshold, "GTPOConfig.entropy_threshold")
    _check_number("entropy_gamma", config.entropy_gamma, minimum=0.0)
    if config.initial_entropy is not None:
        _check_number("initial_entropy", config.initial_entropy, minimum=0.0)
    if isinstance(config.initial_entropy_prompts, bool) or not isinstance(config.initial_entropy_prompts, int):
        raise ValueError(
            f"GTPOConfig.initial_entropy_prompts must be an integer >= 1, got {config.initial_entropy_prompts!r}."
        )
    if config.initial_entropy_prompts < 1:
        raise ValueError(
            f"GTPOConfig.initial_entropy_prompts must be >= 1, got {config.initial_entropy_prompts}: ⟨H⟩_ini is a "
            "mean over that many training prompts."
        )
    cap = config.log_completions_max_groups
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise ValueError(
            f"GTPOConfig.log_completions_max_groups must be an integer >= 1 or None (all groups), got {cap!r}."
        )
    if config.num_generations is None or config.num_generations < 2:
        raise ValueError(
            f"num_generations={config.num_generations}: GTPO and GRPO need at least 2 completions per prompt, "
            "since advantages (Eq. 8) and conflict tokens (Sec. 5.1) are defined within a group."
        )
    if not config.gtpo_enabled:
        # algorithm='grpo': TRL's own options and checks apply unchanged; GTPO's own settings cannot act, so say so.
        if ignored := ignored_with_grpo(config):
            logger.warning(
                "algorithm='grpo' ignores GTPO's settings %s (plain GRPO runs); set algorithm='gtpo' to use them.",
                ", ".join(ignored),
            )
        return

    if config.beta != 0.0:
        logger.warning(
            "beta=%s with algorithm='gtpo': GTPO plus TRL's KL term to a reference model, an ablation. The paper's "
            "GTPO has no KL term (Eq. 7): its entropy filter and penalty replace it, and beta=0 loads no reference "
            "model and runs no extra forward pass.",
            config.beta,
        )
    # The loss types composed with GTPO's λ, δ and γ are the registry's (gtpo.core.registry, docs/core.md).
    if config.loss_type not in registry.LOSS_TYPES:
        raise ValueError(
            f"loss_type={config.loss_type!r} with algorithm='gtpo': a TRL loss type gtpo does not know how to weight "
            f"by λ yet; with algorithm='gtpo' choose one of {list(registry.LOSS_TYPES)}, or set algorithm='grpo'."
        )
    if config.loss_type != "grpo" and config.gtpo_aggregation != "sequence":
        raise ValueError(
            f"loss_type={config.loss_type!r} with gtpo_aggregation={config.gtpo_aggregation!r}: both choose the loss "
            "aggregation. Use loss_type='grpo' with gtpo_aggregation='reference' (authors' code), or "
            f"loss_type={config.loss_type!r} with gtpo_aggregation='sequence'."
        )
    token_sum = registry.LOSS_TYPES[config.loss_type].token_sum  # normalized by the generation batch's tokens
    if token_sum and config.entropy_term == "differentiable" and config.entropy_gamma:
        raise ValueError(
            f"loss_type={config.loss_type!r} with entropy_term='differentiable': it divides by the generation "
            "batch's token count, not by accumulation steps, so a mean-entropy term added to each micro-batch's "
            "loss would be counted steps_per_generation times over. Use entropy_term='advantage' (default) "
            "or another loss_type."
        )
    if config.gtpo_aggregation == "reference" and config.entropy_term == "differentiable" and config.entropy_gamma:
        raise ValueError(
            "gtpo_aggregation='reference' with entropy_term='differentiable': the authors' aggregation sums "
            "completions within each group, and a differentiable mean-entropy term on top of it would be weighted "
            "by the micro-batch size. Use entropy_term='advantage' (as the authors' code) or "
            "gtpo_aggregation='sequence'."
        )
    refused = {
        "entropy_coef": (
            config.entropy_coef != 0.0,
            "TRL's entropy bonus −entropy_coef·H rewards entropy, the opposite of GTPO's penalty +γ⟨H⟩ (Eq. 7); "
            "set entropy_coef=0.0 and tune entropy_gamma (γ) instead",
        ),
        "use_adaptive_entropy": (
            bool(config.use_adaptive_entropy),
            "it adapts TRL's entropy bonus (entropy_coef), which opposes GTPO's penalty; set it False and tune "
            "entropy_gamma (γ) and entropy_threshold instead",
        ),
    }
    for name, (is_set, why) in refused.items():
        if is_set:
            raise ValueError(f"{name}={getattr(config, name)!r} with algorithm='gtpo': {why}; or algorithm='grpo'.")


def check_on_policy(config, setting: str) -> None:
    """Log-probs at temperature 1 replace TRL's in the loss only: any other log-prob TRL computes (old ones for
    the ratio, the reference model's, vLLM's correction) would stay tempered, so those settings are refused."""
    generate_every = config.steps_per_generation * config.num_iterations
    if config.gradient_accumulation_steps % generate_every != 0:
        raise ValueError(
            f"{setting} needs on-policy steps: gradient_accumulation_steps={config.gradient_accumulation_steps} is "
            f"not a multiple of steps_per_generation × num_iterations = {generate_every}, so TRL would compute "
            "old log-probs at the sampling temperature; use num_iterations=1 and the default steps_per_generation"
        )
    if config.use_vllm and config.vllm_importance_sampling_correction:
        raise ValueError(f"{setting} with vLLM's importance sampling correction: set it False, or use_vllm=False")
    if config.beta != 0.0:
        raise ValueError(f"{setting} with beta={config.beta}: the reference log-probs would stay tempered; beta=0")
