"""How `gtpo eval`'s transformers backend draws each token (``--sampler``), and the warpers every sampler applies.

- ``per-row`` (the default): each sample from its own seeded ``torch.Generator`` (`per_row_sampler`), the
  draws of every evaluation recorded so far;
- ``counter``: noise hashed from (the sample's seed, the step, the vocabulary index) on the device
  (`gtpo.decoding.counter`): a sample's tokens are the same on a CPU and a GPU, with and without CUDA graphs (float
  rounding of its logits aside), and on CUDA the draw is recorded inside the replayed decoding step.

Both draw exactly from the warped softmax and give a sample the same tokens in any batch; they draw different tokens
from each other, so a run folder records which one drew its samples (`records.RUN_KEYS`).
"""

from __future__ import annotations

import contextvars
from collections.abc import Sequence

from gtpo.errors import InvalidInput

SAMPLERS = ("per-row", "counter")
DEFAULT_SAMPLER = "per-row"


def check_sampler(name: str) -> str:
    """``name`` when it is one of :data:`SAMPLERS`, else InvalidInput naming them."""
    if name not in SAMPLERS:
        raise InvalidInput(f"unknown sampler {name!r}; valid samplers: {list(SAMPLERS)}")
    return name


def sampling_warpers(sampling) -> list:
    """The warpers ``generate`` would apply for ``sampling`` (`backends.SamplingSettings`), in its order: temperature,
    top-k, top-p. A temperature of 1 is left out: dividing by it changes no bit."""
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    warpers = [] if sampling.temperature == 1.0 else [TemperatureLogitsWarper(float(sampling.temperature))]
    if sampling.top_k > 0:
        warpers.append(TopKLogitsWarper(sampling.top_k))
    if sampling.top_p < 1.0:
        warpers.append(TopPLogitsWarper(sampling.top_p))
    return warpers


def counter_sampler(seeds: Sequence[int], sampling, device):
    """The ``counter`` sampler of one batch (`gtpo.decoding.counter.counter_choice`): one seed a sample, rows not
    keyed on their place in the batch, so a sample's tokens follow its seed whatever batch it is decoded in."""
    from gtpo.decoding.counter import counter_choice

    return counter_choice(seeds, sampling_warpers(sampling), device=device)


def as_processor(choose):
    """A `gtpo.decoding.sampling.Choose` as a logits processor for ``model.generate(do_sample=False)`` (the backend's
    ``fast=False`` path): each row keeps only its drawn token (0, the rest -inf), which greedy decoding then picks.
    ``generate`` keeps every row in the batch, so a row's t-th token is its t-th draw, as in the decode loop."""
    import torch
    from transformers import LogitsProcessor

    class ChoiceProcessor(LogitsProcessor):
        def __call__(self, input_ids, scores):
            choice = choose(scores, torch.arange(scores.shape[0], device=scores.device))[:, None]
            return torch.full_like(scores, float("-inf")).scatter_(-1, choice, 0.0)

    return ChoiceProcessor()


# The rows of the batch that are still decoding, in the order of the scores a sampler is given (None: all rows).
# `backends.TransformersBackend`'s decode loop drops ended rows: it sets this before each call of the sampler, which
# then draws from those rows' generators only (a context variable, so a wrapper around the sampler needs no change).
ACTIVE_ROWS: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("gtpo_active_rows", default=None)


def per_row_sampler(seeds: Sequence[int], sampling, device):
    """A logits processor that samples each batch row from its own seeded ``torch.Generator``.

    ``generate``'s own sampling draws every row from one global RNG stream, so a row's tokens depend on
    which other rows share its batch. Here each row's next token is drawn by the Gumbel-max trick,
    argmax(log p + G) with G = -log(-log U) and U from that row's generator (exactly a draw from p),
    after the same temperature / top-k / top-p warpers ``generate`` would apply; the processor then
    leaves only that token at 0 (the rest -inf) and ``generate`` runs greedy (``do_sample=False``), so
    it picks it. A row therefore gets the same tokens in any batch, up to float rounding of the logits
    in a different batch shape. Every row draws one uniform vector per step while it decodes (the rows of
    :data:`ACTIVE_ROWS` when set; a row that has ended draws nothing, which changes no other row's draws).
    """
    import torch
    from transformers import LogitsProcessor

    warpers = sampling_warpers(sampling)
    generators = [torch.Generator(device=device).manual_seed(int(seed)) for seed in seeds]
    tiny = torch.finfo(torch.float32).tiny

    class PerRowSampler(LogitsProcessor):
        def choose(self, scores):
            """The token of each row: (A, V) scores -> (A,) long. In place where it can: the same numbers."""
            for warper in warpers:
                scores = warper(None, scores)
            log_probs = torch.log_softmax(scores.float(), dim=-1)
            rows = ACTIVE_ROWS.get()
            drawing = generators if rows is None else [generators[r] for r in rows]
            gumbel = torch.empty_like(log_probs)
            for row, generator in zip(gumbel, drawing, strict=True):
                row.uniform_(generator=generator)  # what torch.rand(V, generator=generator) draws
            gumbel.clamp_(min=tiny).log_().neg_().log_().neg_()  # -log(-log U)
            return torch.argmax(log_probs.add_(gumbel), dim=-1)

        def __call__(self, input_ids, scores):
            choice = self.choose(scores)[:, None]
            return torch.full_like(scores, float("-inf")).scatter_(-1, choice, 0.0)

    return PerRowSampler()
