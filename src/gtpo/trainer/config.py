"""`GTPOConfig`: TRL's `GRPOConfig` plus GTPO's fields (arXiv 2508.03772, Sec. 5 and Eq. 5-7).

Every GTPO field is documented once, in its `metadata["help"]`, with the paper symbol it sets; the
same text is what `HfArgumentParser` prints for `--help`. Everything else is TRL's `GRPOConfig`,
unchanged except for four defaults (see `docs/metrics.md`, "TRL defaults GTPOConfig overrides"):

- `loss_type="grpo"` (TRL: "dapo"): Eq. 1/7 average tokens within a completion, then completions,
  so the GRPO baseline from the same config is the paper's GRPO. With algorithm="gtpo", "bnpo",
  "dr_grpo" and "dapo" are accepted as aggregations of GTPO's token losses.
- `bf16=None` resolves to False where no accelerator is present or `use_cpu=True` (TRL: True
  everywhere): on CPU bf16 autocast is slow and loses the precision the tests compare at.
- `log_completions=True` (TRL: False): every run records its completions, with GTPO's columns
  (`gtpo.trainer.completion_record`), without TRL's console table unless `print_completions=True`.
- `beta=0.0` is TRL's default already and the paper's GTPO (no KL term); with `algorithm="gtpo"` a positive
  beta adds TRL's KL term to GTPO's loss, with a warning (an ablation).

TRL's loss options that act on the ratio, the clipping, a token/sequence mask or the token objective compose with
GTPO's λ, δ and γ (`delta`, `top_entropy_quantile`, `importance_sampling_level="sequence"`,
`off_policy_mask_threshold`, `beta`, every `loss_type`; formulas in docs/core.md). Refused with
`algorithm="gtpo"`: `entropy_coef` and `use_adaptive_entropy` (an entropy bonus, the opposite of GTPO's penalty).

>>> from gtpo import GTPOConfig
>>> args = GTPOConfig(output_dir="out", entropy_filter="never")  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from trl import GRPOConfig

from gtpo.core import paper
from gtpo.core.entropy import ENTROPY_FILTERS, ENTROPY_TERMS
from gtpo.core.spans import COMBINE_MODES, CONFLICT_COUNTS, SPAN_SIDES
from gtpo.trainer import config_checks
from gtpo.trainer.config_checks import AGGREGATIONS, ALGORITHMS, ENTROPY_TEMPERATURES, LOGPROB_TEMPERATURES

# What `authors_code` sets: the released code's arithmetic (its listings, TRL 0.15's sampling temperature).
AUTHORS_CODE = {
    "conflict_combine": "product",
    "entropy_filter": "always",
    "entropy_threshold": 0.7,
    "gtpo_aggregation": "reference",
    "scale_rewards": "none",
    "conflict_count": "max",
    "entropy_clamp": 1e-6,
    "logprob_temperature": "model",
    "temperature": 0.9,
}

logger = logging.getLogger(__name__)


def accelerator_available() -> bool:
    import torch

    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        return bool(accelerator.is_available())
    return torch.cuda.is_available()


@dataclass
class GTPOConfig(GRPOConfig):
    """Configuration for `GTPOTrainer`: every `GRPOConfig` field plus GTPO's own (listed below).

    The paper's ablations are combinations of the switches:

    - full GTPO: the defaults;
    - conflict correction only: `entropy_filter="never"`, `entropy_gamma=0.0`;
    - entropy terms only (GRPO + filter + γ): `conflict_correction=False`;
    - OnlyNeg filtering (appendix 13): `entropy_filter="negative_only"`;
    - GTPO with the stall guard (protection without promotion, off by default; docs/studies/stall-guard.md):
      `conflict_guard=True`;
    - GTPO with the common prefix left to the group (off by default; docs/studies/lockin.md):
      `conflict_exclude_common_prefix=True`;
    - the authors' released code, bugs included: `authors_code=True` (`conflict_combine="product"`,
      `entropy_filter="always"`, `entropy_threshold=0.7`, `gtpo_aggregation="reference"`, `scale_rewards="none"`, and
      `conflict_count="max"`, `entropy_clamp=1e-6`, `logprob_temperature="model"` with `temperature=0.9`);
    - GRPO baseline: `algorithm="grpo"` (TRL's loss, `beta` as set).
    """

    # --- TRL defaults overridden (reasons in the module docstring and docs/metrics.md) ---
    loss_type: str = field(
        default="grpo",
        metadata={
            "help": "How token losses are normalized. Default 'grpo' (TRL: 'dapo'): per-completion token mean, then "
            "mean over completions, as in the paper's Eq. 1 and Eq. 7. With algorithm='gtpo', 'bnpo' (token mean over "
            "the micro-batch), 'dr_grpo' (token sum / (B * max_completion_length)) and 'dapo' (token sum / valid "
            "tokens of the whole generation batch) are TRL's formulas applied to GTPO's λ-weighted token losses, and "
            "'cispo', 'sapo', 'luspo' and 'vespo' are TRL's objectives (and normalizations) with λ weighting each "
            "token. With algorithm='grpo' every TRL loss type works as in GRPOConfig."
        },
    )
    log_completions: bool = field(
        default=True,
        metadata={
            "help": "Record the completions of every logging step in OUTPUT_DIR/completions/completions_{step:05d}"
            ".parquet (TRL: False). TRL's file and columns (prompt, completion, each reward, advantage), plus gtpo's: "
            "token ids and tokens, ⟨H⟩_i, δ_i, the advantage the loss weighted, the conflict span lengths and λ where "
            "it is not 1 (computed for the record only with algorithm='grpo' or conflict_correction=False). No "
            "console table unless print_completions; wandb/trackio tables as TRL's. Columns: docs/metrics.md. "
            "Recording changes no update."
        },
    )
    bf16: bool | None = field(
        default=None,
        metadata={
            "help": "bf16 mixed precision. Default None: True when an accelerator (GPU/XPU/NPU/MPS) is present and "
            "use_cpu is False and fp16 is not set, else False (TRL: True everywhere, which on CPU means slow, "
            "lossy bf16 autocast)."
        },
    )

    # --- GTPO ---
    algorithm: str = field(
        default="gtpo",
        metadata={
            "help": "'gtpo': GTPO's objective J_GTPO (Eq. 7) with the components below. 'grpo': every GTPO "
            "component off, TRL's GRPOTrainer loss unchanged (beta, loss_type as set), for side-by-side baselines "
            "from the same config.",
            "choices": list(ALGORITHMS),
        },
    )
    conflict_correction: bool = field(
        default=True,
        metadata={
            "help": "Conflict-aware gradient correction (Sec. 5.1): weight tokens in the leading/trailing conflict "
            "spans M_i by λ_{i,t} (Eq. 5). False sets λ_{i,t}=1 everywhere (the 'entropy terms only' ablation)."
        },
    )
    conflict_positive_weight: float = field(
        default=paper.POSITIVE_WEIGHT,
        metadata={
            "help": "λ for span tokens of completions with A_i>0 (Eq. 5/21); span tokens of completions with A_i<0 "
            "get 0. The paper's 2 keeps the group's total signal (Appendix 11, Eq. 19)."
        },
    )
    conflict_negative_weight: float = field(
        default=paper.NEGATIVE_WEIGHT,
        metadata={
            "help": "λ for span tokens of completions with A_i<0 (Eq. 5). The paper's 0 removes their negative update; "
            "1 keeps it (the ablation 'doubling without protecting negatives', with conflict_positive_weight 2)."
        },
    )
    conflict_span_sides: str = field(
        default="both",
        metadata={
            "help": "Which conflict spans the correction acts on (Sec. 5.1): 'both' (the paper: the leading and the "
            "trailing span), or 'forward' / 'backward' alone (ablations).",
            "choices": list(SPAN_SIDES),
        },
    )
    # Help texts carry no percent sign: argparse %-formats them (`gtpo train --help`).
    conflict_guard: bool = field(
        default=False,
        metadata={
            "help": "Protect without promoting (off: the paper's Eq. 5; docs/studies/stall-guard.md). Inside the "
            "conflict spans λ is 1 where the advantages of the group's completions sharing the token at that aligned "
            "position sum to >= 0 (the update GRPO gives it) and 0 where they sum to < 0 (no shared token pushed "
            "down), for both signs, instead of 2 for positives and 0 for negatives (gtpo.core.contested_tokens; "
            "decided, as Eq. 5's signs, from the advantages before the entropy filter and shift). Why: in study E the "
            "doubling promoted an opening that positive completions shared with negatives (the restated question) "
            "over one only positives had, and the group converged on it (docs/studies/mechanism.md). Study F "
            "(pre-registered; SmolLM2-135M, synthetic arithmetic, lr 2e-4, 40 steps, 20 seed pairs): none of its runs "
            "stalled by study E's rule (GRPO: 1 of 20; one ended on the partial format), but its held-out pass@1 was "
            "10.1 points below GRPO's [2.7, 17.5] (95 percent interval), and 2 of its 20 runs ran to the length limit "
            "(docs/studies/f.md): an option for runs that stall, not a recommendation. Replaces "
            "conflict_positive_weight, conflict_negative_weight and conflict_combine (leave them at their defaults); "
            "conflict_span_sides still chooses the spans."
        },
    )
    conflict_exclude_common_prefix: bool = field(
        default=False,
        metadata={
            "help": "Leave GRPO's update (λ 1) on the leading span tokens whose whole prefix, the token included, a "
            "completion with A_i>0 and one with A_i<0 of the group share exactly; Eq. 5 everywhere else (off: the "
            "paper's Eq. 5 on the whole span). Why: where the sharers' prefixes are identical their gradients are "
            "too, so without the correction their updates add up to the group's summed advantage on that opening, "
            "with its sign; Eq. 5 replaces it by a push up, which pushes up an opening that fails more often than "
            "the group, or one the whole group shares (docs/core.md, 'What Eq. 5 does to a shared opening'). "
            "Tokens shared by position only, after prefixes that differ, and the trailing spans keep Eq. 5 "
            "(gtpo.core.common_prefix_conflicts). What the studies found (SmolLM2-135M, synthetic arithmetic, "
            "exploratory): GTPO's lock-in into a one-equation shortcut in study G (7 of 20 seeds) and its stall in "
            "study E both ran through these tokens, where the groups' own advantages gave the opening about 0 or "
            "less and Eq. 5 pushed it up. But in a screen at 13 of G's seeds it did not prevent the failure: held-out "
            "pass@1 below 11 % at 6 of G's 7 failed seeds, locked in at 4, about as far behind GRPO as GTPO "
            "(exploratory, docs/studies/lockin.md). An option for experiments, not a fix; not a default."
        },
    )
    conflict_combine: str = field(
        default="union",
        metadata={
            "help": "How forward and backward spans combine into M_i: 'union' (paper text, M = M^fw ∨ M^bw) or "
            "'product' (authors' code: forward and backward λ masks multiplied, so a positive token in both spans "
            "gets λ²=4).",
            "choices": list(COMBINE_MODES),
        },
    )
    entropy_filter: str = field(
        default="auto",
        metadata={
            "help": "Completion filter δ_i (Eq. 6). 'auto': drop completions with ⟨H⟩_i > entropy_threshold only "
            "when ⟨H⟩_ini < ln 2 (paper text; the gate is Eq. 6's constant ln 2, whatever entropy_threshold); "
            "'always': drop them whatever ⟨H⟩_ini (authors' code); 'negative_only': drop only such completions "
            "with A_i<0 (appendix 13, OnlyNeg); 'never': δ_i=1. In this project's two-step screens (exploratory, "
            "docs/studies/lockin.md) 'never' took 5 of the 7 seeds where GTPO locked into a shortcut out of it: the "
            "filter dropped failed shortcut completions, so their results were not pushed down; it did not fail at 6 "
            "seeds where GTPO had not failed either. Study H (pre-registered, docs/studies/h.md) tests it.",
            "choices": list(ENTROPY_FILTERS),
        },
    )
    entropy_threshold: float = field(
        default=paper.ENTROPY_THRESHOLD,
        metadata={
            "help": "Threshold on ⟨H⟩_i in Eq. 6, in nats: completions with ⟨H⟩_i above it are filtered. Default "
            "ln 2 (paper text); the authors' code used 0.7, and 1.02-1.05 for Qwen (Sec. 12)."
        },
    )
    entropy_gamma: float = field(
        default=paper.GAMMA,
        metadata={"help": "γ, weight of the entropy term -γ⟨H⟩_i in Eq. 7. 0 turns the term off."},
    )
    entropy_term: str = field(
        default="advantage",
        metadata={
            "help": "How -γ⟨H⟩_i enters the loss. 'advantage' (authors' code, default): for kept completions "
            "A_i ← A_i - γ⟨H⟩_i with ⟨H⟩_i detached; 'differentiable': γ⟨H⟩_i added to the loss with its gradient; "
            "'none': no entropy term (same as entropy_gamma=0).",
            "choices": list(ENTROPY_TERMS),
        },
    )
    gtpo_aggregation: str = field(
        default="sequence",
        metadata={
            "help": "Loss aggregation. 'sequence' (Eq. 7): (1/G) Σ_i (1/|o_i|) Σ_t ..., a per-completion token "
            "mean then a mean over completions (TRL loss_type='grpo' style). 'reference' (authors' code): each "
            "completion's token mean divided by its number of conflict positions (at least 1), summed over each "
            "group and averaged over groups.",
            "choices": list(AGGREGATIONS),
        },
    )
    entropy_temperature: str = field(
        default="model",
        metadata={
            "help": "Which distribution's entropy H enters ⟨H⟩_i, ⟨H⟩_ini (Eq. 6), the γ term (Eq. 7) and the gtpo/ "
            "metrics. 'model' (default): the model's own next-token distribution, temperature 1, whatever the "
            "sampling temperature; this is the paper's H (Sec. 4.2) and also what the authors' code computes "
            "(untempered logits). 'sampling': the distribution sampled from (logits / temperature), as TRL's "
            "entropy metric and GTPO 0.1.0. Log-probabilities and importance ratios are TRL's (tempered) either way; "
            "the two coincide at temperature=1.",
            "choices": list(ENTROPY_TEMPERATURES),
        },
    )
    initial_entropy: float | None = field(
        default=None,
        metadata={
            "help": "⟨H⟩_ini of Eq. 6 in nats. None (default): measured before the first step as the mean "
            "completion entropy on the first initial_entropy_prompts training prompts, then kept in checkpoints. "
            "Only used when entropy_filter='auto'."
        },
    )
    initial_entropy_prompts: int = field(
        default=paper.INITIAL_ENTROPY_PROMPTS,
        metadata={"help": "Number of training prompts (the dataset's first rows) on which ⟨H⟩_ini is measured."},
    )

    log_completions_max_groups: int | None = field(
        default=1,
        metadata={
            "help": "The completion record keeps the first this many groups (prompts) of each logged step; None "
            "keeps all. A step's file costs about 7 KB plus about 10 bytes per recorded completion token "
            "(docs/metrics.md): 7.3-7.8 KB for the offline default's group of 8, about 30 KB for a group of 8 GSM8K "
            "solutions of 300 tokens, so about 30 MB per 1,000 logged steps; raise logging_steps to record fewer steps."
        },
    )
    print_completions: bool = field(
        default=False,
        metadata={
            "help": "Also print the recorded completions as TRL's console table (rich) at each logging step "
            "(TRL prints it whenever log_completions is on; gtpo only when asked)."
        },
    )

    conflict_count: str = field(
        default="union",
        metadata={
            "help": "How gtpo_aggregation='reference' counts a completion's conflict positions: 'union' "
            "(|M^fw ∪ M^bw|) or 'max' (max(|M^fw|, |M^bw|): the authors' code ORs the forward mask with the still "
            "reversed backward one, a bug that authors_code reproduces).",
            "choices": list(CONFLICT_COUNTS),
        },
    )
    entropy_clamp: float | None = field(
        default=None,
        metadata={
            "help": "Clamp p at this floor inside the log of the entropy, H = −Σ p ln max(p, clamp), as the authors' "
            "code does (1e-6); None (default): the exact H. Computed in two extra passes over the LM head."
        },
    )
    logprob_temperature: str = field(
        default="sampling",
        metadata={
            "help": "The distribution whose log-probabilities the loss differentiates: 'sampling' (default, TRL's: "
            "logits / temperature, the policy that sampled) or 'model' (temperature 1 whatever the sampling "
            "temperature: what the authors' code does while sampling at TRL 0.15's 0.9, a mismatch that "
            "authors_code reproduces). 'model' needs on-policy steps (no old or reference log-probs).",
            "choices": list(LOGPROB_TEMPERATURES),
        },
    )
    authors_code: bool = field(
        default=False,
        metadata={
            "help": "Reproduce the arithmetic of the authors' released code, bugs included (docs/core.md): "
            "conflict_combine='product', entropy_filter='always', entropy_threshold=0.7, "
            "gtpo_aggregation='reference', scale_rewards='none', and three bugs: conflict_count='max' (a divisor "
            "of max(|M^fw|, |M^bw|)), entropy_clamp=1e-6 and logprob_temperature='model' with temperature=0.9 "
            "(log-probs at temperature 1 while sampling at 0.9). Overrides those fields."
        },
    )

    use_prefix_sharing: bool = field(
        default=True,
        metadata={
            "help": "Score each micro-batch with each distinct prompt encoded once and no padding (the packed "
            "layout of Prefix Grouper, arXiv 2506.05433; gtpo.forward.packing): same log-probs, entropies "
            "and gradients as TRL's padded layout, in fewer FLOPs. Applies to both algorithms. It falls back to "
            "TRL's layout, with one log line, where it cannot apply (attention other than sdpa/eager, sliding "
            "windows, vision inputs, MoE aux loss, FSDP/DeepSpeed) or would cost more. False: TRL's layout always."
        },
    )

    fast_generation: bool = field(
        default=True,
        metadata={
            "help": "Generate on TRL's transformers path with each distinct prompt prefilled once and finished "
            "completions dropped from the batch (gtpo.decoding.sampling.decode; a float32 LoRA policy generates with "
            "its adapters folded in). It falls back to TRL's generate, with one log line, where it cannot apply (vLLM, "
            "continuous batching, images, tools, beam search, stop strings, a static cache, a generate that is not "
            "transformers' own because it was patched, as TRL's own test_grpo_trainer.py patches it, ...). Applies "
            "to both algorithms. False: TRL's generate."
        },
    )

    cuda_graph_generation: bool = field(
        default=True,
        metadata={
            "help": "On a CUDA GPU, generate with fixed shapes (a cache of the full length written in place, every row "
            "kept until the longest ends, as generate keeps them) and replay each decoding step from the third on as "
            "one CUDA graph (gtpo.decoding.graph), which removes the kernel launches a small model's step is bound by; "
            "a graph is kept for the next batch of the same shape. On by default. The same distribution as the "
            "eager path, not the same draws: every row stays in the batch, so the global generator is consumed as "
            "generate consumes it, and a seeded GPU run draws different completions than before this became the "
            "default (set False to get those back). Ignored off CUDA (a CPU keeps dropping ended rows) and, with "
            "one log line, for models whose cache has sliding-window or other non-full-attention layers."
        },
    )

    def __post_init__(self):
        # Resolved before TRL's __post_init__, which would set it to True whatever the device.
        if self.bf16 is None:
            self.bf16 = bool(not self.fp16 and not self.use_cpu and accelerator_available())
        if self.authors_code is True:
            for name, value in AUTHORS_CODE.items():
                setattr(self, name, value)
        config_checks.validate_gtpo(self)
        super().__post_init__()
        if self.gtpo_enabled and self.logprob_temperature == "model":
            config_checks.check_on_policy(self, "logprob_temperature='model'")

    @property
    def gtpo_enabled(self) -> bool:
        """True when the GTPO loss replaces TRL's (algorithm='gtpo')."""
        return self.algorithm == "gtpo"

    @property
    def needs_initial_entropy(self) -> bool:
        """True when Eq. 6's ⟨H⟩_ini must be known (measured unless given)."""
        return self.gtpo_enabled and ENTROPY_FILTERS[self.entropy_filter].needs_initial_entropy

    @property
    def untempered_entropy(self) -> bool:
        """True when GTPO's entropies must be recomputed at temperature 1 (TRL's are at `temperature`)."""
        return self.gtpo_enabled and self.entropy_temperature == "model" and self.temperature != 1.0
