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
- :func:`counter_choice`: each row's Gumbel noise hashed from (its seed, step, vocabulary index) on the device
  (:func:`counter_bits`), no generator and no host work: the same tokens on any device, with or without CUDA
  graphs, and a draw that `gtpo.decoding.graph.decode_static` records inside the replayed step.

A row's tokens are those `generate` gives it, up to float rounding of a different batch shape: its
attention mask, position ids and the ``input_ids`` the logits processors see are `generate`'s (left padding
to the longest prompt included), and its completion is cut exactly as TRL cuts `generate`'s output (up to and
including the first end-of-sequence token, or ``max_new_tokens`` tokens).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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
        for name in (
            "prefill_rows", "prompt_rows", "row_steps", "useful_row_steps", "generate_row_steps", "captures",
            "capture_seconds",
        ):  # fmt: skip
            setattr(self, name, getattr(self, name) + getattr(other, name))


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


# The counter-based sampler's noise: MurmurHash3_x86_32 (Austin Appleby, public domain; the reference code is
# https://github.com/aappleby/smhasher/blob/master/src/MurmurHash3.cpp) of four little-endian 32-bit words, (the seed's
# high word, the row, the step, the vocabulary index), with the seed's low word as the hash's seed. A hash of a counter
# is a counter-based generator (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC '11): a draw is a pure
# function of where it is, so no generator state has to be carried from step to step, kept per row, or read by the
# host, and a CUDA graph can record it. MurmurHash3's 32-bit finaliser passes SMHasher's avalanche tests; a 32-bit hash
# means two (seed, row, step) keys share a noise vector with probability 2**-32 (about one pair among the 77,000
# draws of 800 samples x 96 tokens), which leaves each draw's distribution exact and makes those two draws dependent.
#
# The arithmetic is on int64 tensors holding values in [0, 2**32), and no product overflows int64: signed overflow is
# undefined in C++, so a kernel's wrap-around cannot be relied on. A multiplier c >= 2**31 is used as c - 2**32
# (negative, |c - 2**32| <= 2**31, so |x (c - 2**32)| < 2**63), whose product has c's residue mod 2**32, and the mask
# keeps that residue (the low 32 bits of two's complement). Shifts, xors, masks, adds and such products are exact
# integer operations, the same bits on a CPU and on CUDA.
_MASK32 = 0xFFFFFFFF
_C1, _C2 = 0xCC9E2D51, 0x1B873593  # MurmurHash3_x86_32's block constants
_FMIX1, _FMIX2 = 0x85EBCA6B, 0xC2B2AE35  # its finaliser's (fmix32)
_ROUND_ADD = 0xE6546B64
_MESSAGE_BYTES = 16  # the hashed message: four 32-bit words
UNIFORM_BITS = 23
"""Bits of the hash a uniform keeps: (k + 1/2) / 2**23 for k < 2**23 is exact in float32 (24 significant bits) and
lies in (0, 1), so the Gumbel noise -log(-log U) is finite (2**-24 <= U <= 1 - 2**-24: -2.81 <= G <= 16.6)."""


def _mul32(x, constant: int):
    """``x * constant mod 2**32`` for ``x`` in [0, 2**32) (an int64 tensor or an int), without overflowing int64."""
    if constant >= 1 << 31:
        constant -= 1 << 32
    return (x * constant) & _MASK32


def _rotl32(x, r: int):
    """``x`` in [0, 2**32) rotated left by ``r`` bits, as 32-bit words rotate (``x << r`` stays under 2**63)."""
    return ((x << r) & _MASK32) | (x >> (32 - r))


def _mix_block(h, k):
    """MurmurHash3_x86_32's body on one 32-bit block ``k`` of the message, state ``h``."""
    k = _mul32(_rotl32(_mul32(k, _C1), 15), _C2)
    return (_rotl32(h ^ k, 13) * 5 + _ROUND_ADD) & _MASK32


def _fmix32_(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's finaliser (fmix32), in place on an int64 tensor of values in [0, 2**32)."""
    h.bitwise_xor_(h >> 16)
    h.mul_(_FMIX1 - (1 << 32)).bitwise_and_(_MASK32)
    h.bitwise_xor_(h >> 13)
    h.mul_(_FMIX2 - (1 << 32)).bitwise_and_(_MASK32)
    return h.bitwise_xor_(h >> 16)


@functools.lru_cache(maxsize=8)
def _index_blocks(vocab_size: int, device: torch.device) -> torch.Tensor:
    """(V,) int64: each vocabulary index's block as the body mixes it, rotated by the body's 13 bits. Rotation
    distributes over xor, so rotl(h ^ k, 13) = rotl(h, 13) ^ rotl(k, 13): the per-row part is rotated once, and an
    element costs one xor here. Kept per (V, device): a recorded step then allocates nothing for it."""
    index = torch.arange(vocab_size, dtype=torch.long, device=device)
    return _rotl32(_mul32(_rotl32(_mul32(index, _C1), 15), _C2), 13)


def counter_bits(seed: torch.Tensor, row, step, vocab_size: int) -> torch.Tensor:
    """MurmurHash3_x86_32 of the words (seed >> 32, row, step, index) with seed's low word as the hash's seed, for every
    vocabulary index: the counter-based sampler's random bits.

    Args:
        seed: (A,) int64, each row's seed (a 64-bit seed as its two's-complement int64; see :class:`CounterChoice`).
        row: (A,) int64 tensor or an int: the row's part of the key, taken mod 2**32.
        step: a 0-d or (A,) int64 tensor, or an int: the draw's index, taken mod 2**32.
        vocab_size: V, the indices hashed (0 .. V - 1).

    Returns:
        (A, V) int64 in [0, 2**32): hash[a, i] of (seed[a], row[a], step[a], i); bit for bit MurmurHash3_x86_32 of those
        16 bytes (tests/test_counter_sampler.py holds it to a plain-Python implementation).
    """
    seed = torch.as_tensor(seed, dtype=torch.long)
    # The high word by an arithmetic shift and a mask: the high 32 bits of the 64-bit two's complement.
    h = _mix_block(seed & _MASK32, (seed >> 32) & _MASK32)
    h = _mix_block(h, row & _MASK32)
    h = _mix_block(h, step & _MASK32)
    prefix = _rotl32(h, 13)  # the index block's rotation of the state, done once a row (see _index_blocks)
    bits = torch.bitwise_xor(prefix.unsqueeze(-1), _index_blocks(vocab_size, seed.device))  # (A, V), fresh
    bits.mul_(5).add_(_ROUND_ADD).bitwise_and_(_MASK32).bitwise_xor_(_MESSAGE_BYTES)
    return _fmix32_(bits)


def counter_uniform(seed: torch.Tensor, row, step, vocab_size: int) -> torch.Tensor:
    """Uniform(0, 1) noise from :func:`counter_bits`: (k + 1/2) / 2**23 with k its top :data:`UNIFORM_BITS` bits.

    Args:
        seed, row, step, vocab_size: as :func:`counter_bits`.

    Returns:
        (A, V) float32 in [2**-24, 1 - 2**-24], exact (the same bits on any device).
    """
    uniform = (counter_bits(seed, row, step, vocab_size) >> (32 - UNIFORM_BITS)).to(torch.float32)
    return uniform.add_(0.5).mul_(2.0**-UNIFORM_BITS)


def counter_gumbel(seed: torch.Tensor, row, step, vocab_size: int) -> torch.Tensor:
    """Gumbel(0, 1) noise -log(-log U), U from :func:`counter_uniform` (float32 ``log``: a device's rounding of it may
    differ from another's in the last bit, which moves a draw only where two perturbed scores tie to that bit).

    Args:
        seed, row, step, vocab_size: as :func:`counter_bits`.

    Returns:
        (A, V) float32, finite.
    """
    return counter_uniform(seed, row, step, vocab_size).log_().neg_().log_().neg_()


def counter_draw(scores: torch.Tensor, seed: torch.Tensor, row, step, warpers: Sequence = ()) -> torch.Tensor:
    """One token a row by the Gumbel-max trick on counter noise: argmax(scores' + G), scores' the scores after
    ``warpers``, G from :func:`counter_gumbel`. argmax(s + G) is a draw from softmax(s) (Gumbel, 1954; as
    :func:`per_row_choice` uses it), so this needs no log-softmax: a row's constant shifts no argmax. Pure: no state,
    no host read, so a CUDA graph can record it.

    Args:
        scores: (A, V) float scores of the rows drawing.
        seed, row, step: each row's key, as :func:`counter_bits`.
        warpers: applied in order, each ``(input_ids, scores) -> scores`` (input_ids None), as :func:`per_row_choice`.

    Returns:
        (A,) int64 tokens.
    """
    for warper in warpers:
        scores = warper(None, scores)
    rows, vocab = scores.shape
    # On a CPU the noise's ~25 passes over (A, V) run from memory at 200 rows of a 49k vocabulary (int64: 80 MB each)
    # and from cache in blocks of rows: 3.8x faster at 200 x 49,152 on one core. On CUDA one block: one kernel an op
    # (what a recorded step wants). Rows are independent, so blocks change no bit.
    block = rows if scores.device.type != "cpu" else max(1, CPU_BLOCK_ELEMENTS // vocab)
    tokens = []
    for start in range(0, rows, block):
        part = slice(start, start + block)
        noise = counter_gumbel(seed[part], _rows_part(row, part), _rows_part(step, part), vocab)
        tokens.append(torch.argmax(noise.add_(scores[part]), dim=-1))
    return tokens[0] if len(tokens) == 1 else torch.cat(tokens)


CPU_BLOCK_ELEMENTS = 1 << 20
"""Elements of (rows, V) a CPU draws its noise for at once in :func:`counter_draw` (8 MiB of int64)."""


def _rows_part(key, part: slice):
    """A key's entries for the rows ``part``: a (A,) tensor sliced, a 0-d tensor or an int as it is (shared)."""
    return key[part] if isinstance(key, torch.Tensor) and key.dim() == 1 else key


def _int64(seed: int) -> int:
    """A seed mod 2**64 as a signed int64 (its two's complement), the form :func:`counter_bits` reads."""
    return (int(seed) + (1 << 63)) % (1 << 64) - (1 << 63)


class CounterChoice:
    """A :data:`Choose` whose noise is hashed from (seed, row, step, vocabulary index) (:func:`counter_draw`): a row's
    tokens depend on its seed and its logits only, not on the device, the batch, the rows dropped or CUDA graphs.

    The step is a counter on the device, ``step`` (0-d int64), read by each draw and advanced in place after it: no
    host read and no Python state that changes from step to step, so `gtpo.decoding.graph.decode_static` can record
    the draw inside the replayed step (it then keys each draw on its own copy of the counter and advances ``step`` by
    the draws it made when it returns). All rows of a call start at the same step, as :func:`decode` and
    `decode_static` decode them, so a row's t-th token is drawn at step ``start + t``.

    Attributes:
        seeds: (N,) int64 on the device, one a row of the batch :func:`decode` gets (each mod 2**64).
        step: 0-d int64 on the device, the index of the next draw (0 when made).
        warpers: applied to the scores before the draw, in order.
        key_rows: whether the row's index is part of the key (else 0 is).
    """

    def __init__(self, seeds: Sequence[int], warpers: Sequence = (), device=None, key_rows: bool = False):
        self.seeds = torch.tensor([_int64(seed) for seed in seeds], dtype=torch.long, device=device)
        self.step = torch.zeros((), dtype=torch.long, device=device)
        self.warpers = tuple(warpers)
        self.key_rows = key_rows

    def to(self, device) -> CounterChoice:
        """The seeds and the counter on ``device`` (moved once, where they are not). Returns self."""
        if self.seeds.device != torch.device(device):
            self.seeds, self.step = self.seeds.to(device), self.step.to(device)
        return self

    def row_keys(self, rows: torch.Tensor):
        """The row part of each row's key: its index in the original batch, or 0 where rows are not keyed."""
        return rows if self.key_rows else 0

    def __call__(self, scores: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        self.to(scores.device)
        rows = rows.to(scores.device)
        tokens = counter_draw(scores, self.seeds.index_select(0, rows), self.row_keys(rows), self.step, self.warpers)
        self.step.add_(1)
        return tokens


def counter_choice(seeds: Sequence[int], warpers: Sequence = (), device=None, key_rows: bool = False) -> CounterChoice:
    """Each row's token by the Gumbel-max trick on noise hashed from (its seed, the step, the vocabulary index)
    (:class:`CounterChoice`, :func:`counter_draw`), after ``warpers`` (temperature, top-k, top-p) in order, as
    :func:`per_row_choice` applies them. A row keyed on its seed alone draws the same tokens in any batch, at any
    position, on any device, with or without CUDA graphs (float rounding of its logits aside); rows with equal seeds
    draw equal noise unless ``key_rows``.

    Args:
        seeds: one seed per row of the batch :func:`decode` gets (any int, taken mod 2**64).
        warpers: logits warpers applied in order, each ``(input_ids, scores) -> scores`` (input_ids unused).
        device: where the seeds and the counter live (default: moved to the scores' device at the first draw).
        key_rows: also key the noise on the row's index in the original batch (for rows that share one seed);
            evaluation leaves it off, so that a sample's tokens depend on its seed, not its place in a batch.

    Returns:
        a :class:`CounterChoice`.
    """
    return CounterChoice(seeds, warpers, device=device, key_rows=key_rows)


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
