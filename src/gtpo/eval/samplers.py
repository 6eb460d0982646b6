"""How `gtpo eval`'s transformers backend draws each token (``--sampler``), and the warpers every sampler applies.

- ``per-row`` (the default): each sample from its own seeded ``torch.Generator`` (`backends.per_row_sampler`), the
  draws of every evaluation recorded so far;
- ``counter``: noise hashed from (the sample's seed, the step, the vocabulary index) on the device
  (`gtpo.decoding.counter`): a sample's tokens are the same on a CPU and a GPU, with and without CUDA graphs (float
  rounding of its logits aside), and on CUDA the draw is recorded inside the replayed decoding step.

Both draw exactly from the warped softmax and give a sample the same tokens in any batch; they draw different tokens
from each other, so a run folder records which one drew its samples (`runner.RUN_KEYS`).
"""

from __future__ import annotations

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
