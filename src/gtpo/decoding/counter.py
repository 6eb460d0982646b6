"""The counter-based sampler: Gumbel noise hashed from (seed, row, step, vocabulary index), drawn on the device.

`sampling.per_row_choice` draws each row from its own seeded ``torch.Generator``: a host loop over the rows every step,
a stream that differs between a CPU and CUDA, and state a CUDA graph cannot carry. Here a draw is a pure function of
where it is (:func:`counter_bits`): no generator, no host read, the same bits on any device, so
`gtpo.decoding.graph.decode_static` records the draw inside the replayed step (:func:`in_step_draw`) and a row's
tokens are the same with and without graphs, in any batch, on a CPU or a GPU (float rounding of its logits aside).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

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
    `sampling.per_row_choice` uses it), so this needs no log-softmax: a row's constant shifts no argmax. Pure: no state,
    no host read, so a CUDA graph can record it.

    Args:
        scores: (A, V) float scores of the rows drawing.
        seed, row, step: each row's key, as :func:`counter_bits`.
        warpers: applied in order, each ``(input_ids, scores) -> scores`` (input_ids None), as
            `sampling.per_row_choice` applies them.

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
    """A `sampling.Choose` whose noise is hashed from (seed, row, step, vocabulary index) (:func:`counter_draw`): a
    row's tokens depend on its seed and its logits only, not on the device, the batch, the rows dropped or CUDA graphs.

    The step is a counter on the device, ``step`` (0-d int64), read by each draw and advanced in place after it: no
    host read and no Python state that changes from step to step, so `gtpo.decoding.graph.decode_static` can record
    the draw inside the replayed step (it then keys each draw on its own copy of the counter and advances ``step`` by
    the draws it made when it returns). All rows of a call start at the same step, as `sampling.decode` and
    `decode_static` decode them, so a row's t-th token is drawn at step ``start + t``.

    Attributes:
        seeds: (N,) int64 on the device, one a row of the batch `sampling.decode` gets (each mod 2**64).
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
    `sampling.per_row_choice` applies them. A row keyed on its seed alone draws the same tokens in any batch, at any
    position, on any device, with or without CUDA graphs (float rounding of its logits aside); rows with equal seeds
    draw equal noise unless ``key_rows``.

    Args:
        seeds: one seed per row of the batch `sampling.decode` gets (any int, taken mod 2**64).
        warpers: logits warpers applied in order, each ``(input_ids, scores) -> scores`` (input_ids unused).
        device: where the seeds and the counter live (default: moved to the scores' device at the first draw).
        key_rows: also key the noise on the row's index in the original batch (for rows that share one seed);
            evaluation leaves it off, so that a sample's tokens depend on its seed, not its place in a batch.

    Returns:
        a :class:`CounterChoice`.
    """
    return CounterChoice(seeds, warpers, device=device, key_rows=key_rows)


# Processors a recorded step may apply before its draw: they read the scores alone (not the tokens so far, whose shape
# grows every step), launch the same kernels at every step and read nothing back to the host.
GRAPH_SAFE_PROCESSORS = frozenset(
    {"TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper"}
)


def _processor_key(processor) -> tuple | None:
    """What a graph-safe processor's recorded kernels depend on (its class and its scalar settings: a kept graph
    replays them as recorded), or None where it is not graph-safe or holds anything else."""
    if type(processor).__name__ not in GRAPH_SAFE_PROCESSORS:
        return None
    settings = sorted(vars(processor).items())
    if not all(isinstance(value, (bool, int, float, str, type(None))) for _, value in settings):
        return None
    return (type(processor).__module__, type(processor).__qualname__, tuple(settings))


def in_step_draw(choose, processors) -> tuple | None:
    """Whether `gtpo.decoding.graph.decode_static` records the draw inside the step: the key of that draw (what its
    kept graph depends on: whether rows are keyed, each processor's and warper's class and settings, in the order they
    apply), or None where the draw stays after the step (a sampler other than :class:`CounterChoice`, or a processor or
    warper outside :data:`GRAPH_SAFE_PROCESSORS`)."""
    if not isinstance(choose, CounterChoice):
        return None
    keys = tuple(_processor_key(p) for p in (*(processors or ()), *choose.warpers))
    return None if any(key is None for key in keys) else (choose.key_rows, keys)
