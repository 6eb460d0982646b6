"""Decoding without waste: each distinct prompt is prefilled once, and a row that has ended costs nothing.

`generate` (transformers) prefills every row of a batch, although GRPO's G rows of a group and an
evaluation's n samples of a problem share their prompt, and it runs every row until the longest one ends.
:func:`decode` prefills each distinct prompt once, copies its KV cache to the rows that share it, and drops a
row from the batch (its cache, its mask, its sampler state) the step it ends. It is the one decode loop of
training (`gtpo.trainer.generation`) and evaluation (`gtpo.eval.backends`); how the next token is drawn is the
caller's ``choose``:

- :func:`multinomial_choice`: what `generate(do_sample=True)` draws (softmax, ``torch.multinomial`` on the
  global generator), or its argmax when greedy;
- :func:`per_row_choice`: each row from its own seeded generator (Gumbel-max), so a row's tokens do not
  depend on which rows share its batch;
- `gtpo.decoding.counter.counter_choice`: each row's Gumbel noise hashed from (its seed, step, vocabulary index) on
  the device, no generator and no host work: the same tokens on any device, with or without CUDA graphs, and a draw
  that `gtpo.decoding.graph.decode_static` records inside the replayed step.

A row's tokens are those `generate` gives it, up to float rounding of a different batch shape: its
attention mask, position ids and the ``input_ids`` the logits processors see are `generate`'s (left padding
to the longest prompt included), and its completion is cut exactly as TRL cuts `generate`'s output (up to and
including the first end-of-sequence token, or ``max_new_tokens`` tokens).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import torch

# Logits processors that act on each row alone (its own input_ids and scores): they stay correct when rows
# are dropped from the batch. Anything else `generate` would build (a prefix function, watermarking, ...)
# makes :func:`unsupported_reason` name it, and the caller falls back to `generate`.
ROW_WISE_PROCESSORS = frozenset(
    {
        "TemperatureLogitsWarper",
        "TopKLogitsWarper",
        "TopPLogitsWarper",
        "MinPLogitsWarper",
        "TypicalLogitsWarper",
        "EpsilonLogitsWarper",
        "EtaLogitsWarper",
        "RepetitionPenaltyLogitsProcessor",
        "NoRepeatNGramLogitsProcessor",
        "NoBadWordsLogitsProcessor",
        "SequenceBiasLogitsProcessor",
        "SuppressTokensLogitsProcessor",
        "SuppressTokensAtBeginLogitsProcessor",
        "MinLengthLogitsProcessor",
        "MinNewTokensLengthLogitsProcessor",
        "LogitNormalization",
        "InfNanRemoveLogitsProcessor",
    }
)

# Choose the next token of the rows still decoding: (scores (A, V) float32, rows (A,) their indices in the
# original batch) -> tokens (A,) long.
Choose = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class DecodeStats:
    """What one :func:`decode` call computed. ``row_steps``: rows fed through the model summed over decoding
    forwards, plus the first token of each row; ``useful_row_steps``: the tokens kept (EOS included); with
    `generate` every row costs a step until the longest row ends (``max_len * rows``)."""

    prefill_rows: int = 0
    prompt_rows: int = 0
    row_steps: int = 0
    useful_row_steps: int = 0
    generate_row_steps: int = 0
    # Steps recorded (`gtpo.decoding.graph.decode_static`: CUDA graphs captured) and the wall seconds that took,
    # the recorder's warm-up step included (on CUDA synchronised on both ends); 0 where nothing was recorded.
    captures: int = 0
    capture_seconds: float = 0.0

    def add(self, other: DecodeStats) -> None:
        """Add ``other``'s counts to these, field by field (every field is a count or a sum of seconds)."""
        for field in fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))


def supports_fast_decode(model) -> str | None:
    """None when :func:`decode` can run ``model``, else why not (one line)."""
    if getattr(model.config, "is_encoder_decoder", False):
        return "an encoder-decoder model"
    supports = getattr(model, "_supports_default_dynamic_cache", None)
    if supports is None or not supports():
        return f"{type(model).__name__} has no DynamicCache support"
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=model.config)
    if any(not isinstance(layer, DynamicLayer) for layer in getattr(cache, "layers", [])):
        return f"{type(model).__name__}'s cache has layers other than key/value ones"
    return None


def multinomial_choice(do_sample: bool) -> Choose:
    """`generate`'s own draw: ``torch.multinomial`` of the softmax on the global generator, or the argmax."""

    def choose(scores: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        if not do_sample:
            return torch.argmax(scores, dim=-1)
        return torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)

    return choose


def per_row_choice(seeds: Sequence[int], warpers: Sequence = (), device=None) -> Choose:
    """Each row's token drawn from its own ``torch.Generator`` seeded with ``seeds[row]``, by the Gumbel-max trick:
    argmax(log p + G), G = -log(-log U), U uniform from that generator (exactly a draw from p), after ``warpers``
    (temperature, top-k, top-p). A row draws one uniform vector per step while it decodes, so its tokens do not
    depend on the other rows of its batch.

    Args:
        seeds: one seed per row of the batch :func:`decode` gets.
        warpers: logits warpers applied in order, each ``(input_ids, scores) -> scores`` (input_ids unused).
    """
    generators = [torch.Generator(device=device or "cpu").manual_seed(int(seed)) for seed in seeds]
    tiny = torch.finfo(torch.float32).tiny

    def choose(scores: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        for warper in warpers:
            scores = warper(None, scores)
        log_probs = torch.log_softmax(scores.float(), dim=-1)
        uniform = torch.stack(
            [torch.rand(scores.shape[-1], generator=generators[r], device=scores.device) for r in rows.tolist()]
        )
        gumbel = -torch.log(-torch.log(uniform.clamp_(min=tiny)))
        return torch.argmax(log_probs + gumbel, dim=-1)

    return choose


def left_pad(prompts: Sequence[Sequence[int]], pad_token_id: int, multiple: int | None = None):
    """Prompts left-padded as TRL and `generate` pad them. Returns (input_ids (N, L) long, attention_mask (N, L)
    long), L the longest prompt rounded up to ``multiple``."""
    length = max(len(p) for p in prompts)
    if multiple:
        length = -(-length // multiple) * multiple
    ids = torch.full((len(prompts), length), int(pad_token_id), dtype=torch.long)
    mask = torch.zeros((len(prompts), length), dtype=torch.long)
    for i, p in enumerate(prompts):
        if len(p):
            ids[i, length - len(p) :] = torch.as_tensor(list(p), dtype=torch.long)
            mask[i, length - len(p) :] = 1
    return ids, mask


def lora_layers(model) -> tuple[list, str | None]:
    """The peft LoRA linear layers of ``model``, and why they cannot be folded into their base weights (or None):
    a float32/float64 ``nn.Linear`` base, plain LoRA (no DoRA, no LoRA bias, no dropout) only. In bfloat16 the
    folded weight W + BA would round most of a small update BA away, so bf16 models are left as they are."""
    layers = [m for m in model.modules() if hasattr(m, "lora_A") and hasattr(m, "get_delta_weight")]
    for layer in layers:
        base = layer.get_base_layer()
        if type(base) is not torch.nn.Linear or base.weight.dtype not in (torch.float32, torch.float64):
            return layers, f"a LoRA base layer is {type(base).__name__} in {base.weight.dtype}"
        if layer.merged or layer.disable_adapters:
            return layers, "adapters already merged or disabled"
        for name in layer.active_adapters:
            if name not in layer.lora_A:
                continue
            if layer.use_dora.get(name) or layer.lora_bias.get(name):
                return layers, "DoRA or LoRA bias"
            if not isinstance(layer.lora_dropout[name], torch.nn.Identity):
                return layers, "LoRA dropout (generation runs in train mode: merged weights would skip it)"
    return layers, None


@contextlib.contextmanager
def merged_lora(model):
    """Fold the active LoRA adapters into their base weights while the block runs, where :func:`lora_layers`
    allows (else leave the model as it is). A decoding step then runs one matmul per linear layer instead of three
    (14 small matmuls fewer per SmolLM2 layer). The base weights are never modified: each gets a new tensor
    W + BA for the block, and the original tensor back after it, bit for bit. Yields whether it merged."""
    layers, why = lora_layers(model)
    if not layers or why is not None:
        yield False
        return
    saved = []
    try:
        for layer in layers:
            active = [name for name in layer.active_adapters if name in layer.lora_A]
            weight = layer.get_base_layer().weight
            saved.append((layer, weight, weight.data))
            delta = sum(layer.get_delta_weight(name) for name in active)
            weight.data = weight.data + delta
            layer.merged_adapters.extend(active)  # peft's forward then runs the base layer alone
        yield True
    finally:
        for layer, weight, original in saved:
            weight.data = original
            layer.merged_adapters.clear()


@functools.cache
def _preallocated_layer_class():
    """:class:`PreallocatedLayer`, defined once, on first use (transformers is imported lazily here)."""
    from transformers.cache_utils import DynamicLayer

    class PreallocatedLayer(DynamicLayer):
        """A `DynamicLayer` whose keys and values live in a buffer (B, H, capacity, D) with ``reserve`` positions
        ahead of what is filled: a decoding step writes its position in place, where `DynamicLayer.update`
        concatenates, copying the whole layer's cache every step (10-15 % of a SmolLM2 step at 64-200 rows on a
        CPU, benchmarks/bench_decode_step.py). ``keys``/``values`` are views of the filled part, so everything that
        reads them (attention, ``get_seq_length``, masks) sees what a `DynamicLayer` would hold, value for value."""

        _layer_type = None  # never registered in transformers' layer mappings

        def __init__(self, reserve: int):
            super().__init__()
            self.reserve = reserve  # positions reserved past what is filled whenever the buffer (re)grows
            self._k = self._v = None  # the buffers; keys/values are views of their filled part

        def _filled(self) -> int:
            return 0 if self._k is None else self.keys.shape[-2]

        def _view(self, length: int) -> None:
            self.keys, self.values = self._k[:, :, :length], self._v[:, :, :length]

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            n, t = self._filled(), key_states.shape[-2]
            if self._k is None or n + t > self._k.shape[-2]:  # the first update, or past the reserve: grow
                shape = (key_states.shape[0], key_states.shape[1], n + t + self.reserve, key_states.shape[-1])
                k, v = key_states.new_empty(shape), value_states.new_empty(shape[:-1] + value_states.shape[-1:])
                if n:
                    k[:, :, :n], v[:, :, :n] = self.keys, self.values
                self._k, self._v = k, v
            self._k[:, :, n : n + t] = key_states
            self._v[:, :, n : n + t] = value_states
            self._view(n + t)
            return self.keys, self.values

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            n = self._filled()
            if n:
                k = self._k.new_empty((len(indices), *self._k.shape[1:]))
                v = self._v.new_empty((len(indices), *self._v.shape[1:]))
                # The filled part only, gathered straight into the new buffer (one copy, no temporary).
                torch.index_select(self.keys, 0, indices, out=k[:, :, :n])
                torch.index_select(self.values, 0, indices, out=v[:, :, :n])
                self._k, self._v = k, v
                self._view(n)

        def batch_repeat_interleave(self, repeats: int) -> None:
            if self._filled():
                rows = torch.arange(self._k.shape[0], device=self._k.device)
                self.batch_select_indices(rows.repeat_interleave(repeats))

        # crop: DynamicLayer's slices the keys/values views, and the filled length is read from them.

        def reset(self) -> None:
            self._k = self._v = None
            super().reset()

    return PreallocatedLayer


def preallocated_cache(model, reserve: int):
    """A `DynamicCache` for ``model`` whose full-attention layers (plain `DynamicLayer`) are preallocated layers that
    write each new position in place, ``reserve`` positions ahead of what is filled (grown by as much again when
    full); sliding-window or other layer types are kept as transformers makes them."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=model.config)
    layer_class = _preallocated_layer_class()
    cache.layers = [layer_class(reserve) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def select_rows(processors, keep: torch.Tensor) -> None:
    """Keep the per-row state of ``processors`` for the rows ``keep`` (B',) only. The one such state `generate`
    builds is the repetition penalty's ``prompt_ignore_length`` (B,): each row's left padding, not penalised."""
    for processor in processors or ():
        ignore = getattr(processor, "prompt_ignore_length", None)
        if isinstance(ignore, torch.Tensor):
            processor.prompt_ignore_length = ignore.to(keep.device)[keep]


@torch.no_grad()
def decode(
    model,
    prompts: Sequence[Sequence[int]],
    choose: Choose,
    max_new_tokens: int,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    processors=None,
    pad_to_multiple_of: int | None = None,
    stats: DecodeStats | None = None,
    drop_finished: bool = True,
) -> list[list[int]]:
    """Sample one completion per prompt, prefilling each distinct prompt once and dropping ended rows.

    Args:
        model: a decoder-only transformers model (check :func:`supports_fast_decode` first).
        prompts: B token-id lists (no padding); equal prompts share one prefill wherever they are in the list.
        choose: draws the next token of the rows still decoding (:data:`Choose`).
        max_new_tokens: the most tokens a completion gets.
        eos_token_ids: tokens that end a completion (kept as its last token).
        pad_token_id: the left padding of shorter prompts (which repetition penalties see, as in `generate`).
        processors: a ``LogitsProcessorList`` (or None) applied to each step's float32 logits with the rows'
            ``input_ids`` (B', L + t), as `generate` applies it; only row-wise processors are correct here, and
            per-row state is re-indexed when rows end (:func:`select_rows`).
        pad_to_multiple_of: pad prompts to a multiple of this length, as TRL's ``pad_to_multiple_of``.
        stats: filled with what was computed (:class:`DecodeStats`).
        drop_finished: False keeps an ended row in the batch, fed padding as `generate` does (for measurements:
            the cost of the prefill alone).

    Returns:
        B lists of token ids: each completion up to and including its first EOS, or ``max_new_tokens`` tokens.
    """
    device = next(model.parameters()).device
    batch = len(prompts)
    if batch == 0:
        return []
    distinct: dict[tuple[int, ...], int] = {}
    owner = torch.tensor([distinct.setdefault(tuple(p), len(distinct)) for p in prompts], device=device)  # (B,)
    unique = list(distinct)
    ids, mask = left_pad(unique, pad_token_id, pad_to_multiple_of)
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)  # `generate`'s position ids under left padding
    # Positions reserved ahead: the whole completion when short; 128 at a time for long ones, so that the reserve of
    # rows that end early (most of them) stays small, as DynamicCache grows, at one copy per 128 steps.
    cache = preallocated_cache(model, min(max_new_tokens, 128))
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    logits = out.logits[:, -1].to(dtype=torch.float32).index_select(0, owner)  # (B, V)
    cache.batch_select_indices(owner)  # every row gets its prompt's keys and values (a gather, repeats allowed)
    sequences, mask = ids.index_select(0, owner), mask.index_select(0, owner)  # (B, L)
    position = positions[:, -1].index_select(0, owner)  # (B,)
    rows = torch.arange(batch, device=device)  # original index of each row still decoding
    eos = torch.tensor(list(eos_token_ids), device=device, dtype=torch.long)
    completions: list[list[int]] = [[] for _ in range(batch)]
    ended = torch.zeros(batch, dtype=torch.bool, device=device)  # only when not drop_finished
    steps = []
    for step in range(max_new_tokens):
        scores = processors(sequences, logits) if processors else logits
        tokens = choose(scores, rows)  # (A,)
        steps.append(len(rows))
        if not drop_finished:
            tokens = tokens.masked_fill(ended, int(pad_token_id))
        for r, t, e in zip(rows.tolist(), tokens.tolist(), ended.tolist(), strict=True):
            if not e:
                completions[r].append(t)
        if step == max_new_tokens - 1:
            break
        going = ~torch.isin(tokens, eos) & ~ended
        if not drop_finished:
            ended = ~going
            if bool(ended.all()):
                break
        elif not bool(going.all()):
            if not bool(going.any()):
                break
            keep = going.nonzero().squeeze(1)
            cache.batch_select_indices(keep)
            select_rows(processors, keep)
            rows, tokens, position, ended = rows[keep], tokens[keep], position[keep], ended[keep]
            sequences, mask = sequences[keep], mask[keep]
        sequences = torch.cat([sequences, tokens[:, None]], dim=1)
        mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)
        position = position + 1
        out = model(
            input_ids=tokens[:, None],
            attention_mask=mask,
            position_ids=position[:, None],
            past_key_values=cache,
            use_cache=True,
        )
        logits = out.logits[:, -1].to(dtype=torch.float32)
    if stats is not None:
        longest = max(len(c) for c in completions)
        stats.add(
            DecodeStats(
                prefill_rows=len(unique),
                prompt_rows=batch,
                row_steps=sum(steps),
                useful_row_steps=sum(len(c) for c in completions),
                generate_row_steps=longest * batch,
            )
        )
    return completions
