"""The counter-based sampler (`gtpo.decoding.counter.counter_choice`) and its draw inside the recorded step
(`gtpo.decoding.graph.decode_static`), issue 58 item 2.

Invariants, each against something computed independently of the code under test:
- the noise is MurmurHash3_x86_32 of (seed high word, row, step, index) with the seed's low word as the hash's seed,
  bit for bit: against a plain-Python MurmurHash3 over bytes, itself checked against the hash's published test
  vectors;
- a draw follows softmax of the warped scores (temperature, top-k, top-p, in that order): token frequencies over
  many fixed seeds against probabilities computed with `math`, by a chi-square bound (fixed seeds: it cannot flake);
- a draw is a function of (seed, row, step) alone: the same key gives the same token, rows and steps are
  independent (a chi-square test of the joint frequencies), and a row's tokens do not depend on which rows share
  its batch, where it sits, or whether ended rows are dropped;
- `decode` and the fixed-shape path, eager or recorded (the CPU stand-in that runs a recorded step twice), give the
  same tokens, with the draw inside the step where its processors allow it and after the step where they do not;
- on CUDA (gpu-marked, skipped elsewhere): the same noise bits as the CPU, and the graph with the draw inside gives
  the eager path's tokens (up to the kernel rounding the other graph tests allow).
"""

from __future__ import annotations

import math
import struct

import pytest
import torch
from transformers import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

import gtpo.decoding.graph as graph_decode
from gtpo.decoding.counter import (
    CounterChoice,
    counter_bits,
    counter_choice,
    counter_draw,
    counter_gumbel,
    counter_uniform,
    in_step_draw,
)
from gtpo.decoding.graph import decode_static
from gtpo.decoding.sampling import DecodeStats, decode
from gtpo.models import load_model, load_tokenizer
from test_graph_decode import CountingRunTwice, RunTwice, _prompts

M32 = 0xFFFFFFFF


def murmur3_x86_32(data: bytes, seed: int) -> int:
    """MurmurHash3_x86_32 over bytes, transcribed from the reference C (smhasher's MurmurHash3.cpp), tail included."""

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & M32

    c1, c2, h = 0xCC9E2D51, 0x1B873593, seed & M32
    blocks = len(data) // 4
    for i in range(blocks):
        k = int.from_bytes(data[4 * i : 4 * i + 4], "little")
        k = (rotl((k * c1) & M32, 15) * c2) & M32
        h = (rotl(h ^ k, 13) * 5 + 0xE6546B64) & M32
    tail = data[4 * blocks :]
    if tail:
        k = int.from_bytes(tail, "little")
        h ^= (rotl((k * c1) & M32, 15) * c2) & M32
    h ^= len(data)
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    return h ^ (h >> 16)


def reference_bits(seed: int, row: int, step: int, index: int) -> int:
    """The sampler's bits for one key, by the definition: the hash of four little-endian words."""
    seed %= 1 << 64
    return murmur3_x86_32(struct.pack("<4I", seed >> 32, row & M32, step & M32, index), seed & M32)


def test_the_reference_murmur3_gives_the_published_test_vectors():
    """MurmurHash3_x86_32's widely quoted vectors (empty input, one zero block, a tail of 1 and 3 bytes, seeds)."""
    vectors = [
        (b"", 0, 0), (b"", 1, 0x514E28B7), (b"", 0xFFFFFFFF, 0x81F16F39), (b"\0\0\0\0", 0, 0x2362F9DE),
        (b"aaaa", 0x9747B28C, 0x5A97808A), (b"Hello, world!", 0x9747B28C, 0x24884CBA),
        (b"The quick brown fox jumps over the lazy dog", 0x9747B28C, 0x2FA826CD),
    ]  # fmt: skip
    assert [murmur3_x86_32(data, seed) for data, seed, _ in vectors] == [want for *_, want in vectors]


KEYS = [(0, 0, 0), (1, 2, 3), (2**40 + 7, 5, 1000), (-1, 2**32 - 1, 2**31 + 5), (2**63 - 1, 7, 9), (-(2**63), 1, 2**32)]


def test_the_noise_bits_are_murmur3_of_seed_row_step_and_index_bit_for_bit():
    vocab = 70
    seeds = torch.tensor([seed for seed, _, _ in KEYS])
    rows = torch.tensor([row for _, row, _ in KEYS])
    steps = torch.tensor([step for _, _, step in KEYS])
    got = counter_bits(seeds, rows, steps, vocab)
    assert got.shape == (len(KEYS), vocab) and got.dtype == torch.long
    expected = [[reference_bits(*key, index) for index in range(vocab)] for key in KEYS]
    assert got.tolist() == expected
    # a 0-d step and an int row broadcast as the same keys
    assert counter_bits(seeds[:2], 0, torch.tensor(3), 5).tolist() == [
        [reference_bits(seed, 0, 3, i) for i in range(5)] for seed, _, _ in KEYS[:2]
    ]
    # the uniforms are the top 23 bits, centred: (k + 1/2) / 2**23, exact in float32
    uniform = counter_uniform(seeds, rows, steps, vocab)
    exact = [[((bits >> 9) + 0.5) / 2**23 for bits in row] for row in expected]
    assert uniform.dtype == torch.float32 and uniform.tolist() == exact
    gumbel = counter_gumbel(seeds, rows, steps, vocab)
    assert torch.isfinite(gumbel).all()
    torch.testing.assert_close(gumbel.double(), -torch.log(-torch.log(torch.tensor(exact, dtype=torch.float64))))


# Chi-square critical values at 0.999 (any chi-square table): a fixed-seed test above them would mean a wrong
# distribution far more surely than a chance of 1 in 1,000 (the seeds are fixed, so the outcome never changes).
CHI2_999 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 8: 26.124}


def _chi2(counts: list[int], probabilities: list[float]) -> float:
    total = sum(counts)
    return sum((c - total * p) ** 2 / (total * p) for c, p in zip(counts, probabilities, strict=True) if p > 0)


def _softmax(values: list[float]) -> list[float]:
    top = max(values)
    weights = [math.exp(v - top) for v in values]
    return [w / sum(weights) for w in weights]


LOGITS = [2.0, 1.0, 0.0, -1.0, -2.5]
DRAWS = 20_000


@pytest.mark.parametrize("over", ["seeds", "steps"])
def test_token_frequencies_follow_the_softmax(over):
    """Over 20,000 seeds at one step, or one seed over 20,000 steps: frequencies against softmax(LOGITS)."""
    scores = torch.tensor([LOGITS] * DRAWS)
    if over == "seeds":
        tokens = counter_draw(scores, torch.arange(DRAWS), 0, torch.tensor(0))
    else:
        tokens = counter_draw(scores, torch.full((DRAWS,), 12345), 0, torch.arange(DRAWS))
    counts = torch.bincount(tokens, minlength=len(LOGITS)).tolist()
    assert _chi2(counts, _softmax(LOGITS)) < CHI2_999[len(LOGITS) - 1], counts


def test_warpers_apply_in_order_temperature_then_top_k_then_top_p():
    """Temperature 0.5, then top-k 4, then top-p 0.9 keep tokens {0, 1} of LOGITS (top-p before the temperature would
    keep {0, 1, 2}): token 2 never drawn, the rest in softmax(LOGITS / 0.5)'s proportions over {0, 1}."""
    warpers = [TemperatureLogitsWarper(0.5), TopKLogitsWarper(4), TopPLogitsWarper(0.9)]
    sharp = _softmax([v / 0.5 for v in LOGITS])
    ascending = sorted(range(len(LOGITS)), key=lambda i: sharp[i])
    cumulative, kept = 0.0, set()
    for i in ascending[1:]:  # top-k 4 drops the least likely; top-p drops what sums to <= 0.1 (transformers' rule)
        cumulative += sharp[i] / sum(sharp[j] for j in ascending[1:])
        if cumulative > 1 - 0.9:
            kept.add(i)
    assert kept == {0, 1}
    expected = [sharp[i] / sum(sharp[j] for j in kept) if i in kept else 0.0 for i in range(len(LOGITS))]
    choose = counter_choice(range(DRAWS), warpers)
    tokens = choose(torch.tensor([LOGITS] * DRAWS), torch.arange(DRAWS))
    counts = torch.bincount(tokens, minlength=len(LOGITS)).tolist()
    assert counts[2] == counts[3] == counts[4] == 0
    assert _chi2(counts, expected) < CHI2_999[1], counts


def test_the_same_key_draws_the_same_token_and_the_counter_lives_on_the_device():
    scores = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    rows = torch.arange(6)
    first, second = counter_choice([3, 1, 4, 1, 5, 9]), counter_choice([3, 1, 4, 1, 5, 9])
    a = [first(scores, rows) for _ in range(4)]
    b = [second(scores, rows) for _ in range(4)]
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert first.step.item() == 4 and first.step.shape == ()
    assert torch.equal(a[0][1], a[0][3])  # rows 1 and 3 share seed 1 and are not keyed on their index
    keyed = counter_choice([1] * 6, key_rows=True)(scores.new_zeros(6, 50), rows)
    assert len(set(keyed.tolist())) > 1  # equal seeds, keyed rows: different noise


@pytest.mark.parametrize("between", ["steps", "seeds", "keyed rows"])
def test_draws_of_different_steps_seeds_or_keyed_rows_are_independent(between):
    """Uniform logits over 3 tokens: the pairs of draws (step 0, step 1) of one seed, (seed 2i, seed 2i + 1) at one
    step, or (row 2i, row 2i + 1) under one seed with keyed rows, against the product of their marginals (all 1/9)."""
    pairs = 18_000
    scores = torch.zeros(2 * pairs, 3)
    if between == "steps":
        seeds = torch.arange(pairs).repeat(2)
        tokens = counter_draw(scores, seeds, 0, torch.arange(2).repeat_interleave(pairs))
        first, second = tokens[:pairs], tokens[pairs:]
    else:
        keyed = between == "keyed rows"
        seeds = torch.zeros(2 * pairs, dtype=torch.long) if keyed else torch.arange(2 * pairs)
        tokens = counter_draw(scores, seeds, torch.arange(2 * pairs) if keyed else 0, torch.tensor(7))
        first, second = tokens[0::2], tokens[1::2]
    joint = torch.bincount(3 * first + second, minlength=9).tolist()
    assert _chi2(joint, [1 / 9] * 9) < CHI2_999[8], joint


def test_a_rows_draw_does_not_depend_on_the_other_rows_of_its_batch():
    """Rows dropped (as `decode` drops ended rows: the sampler gets the survivors' original indices) draw what they
    draw in the whole batch, and a CPU's blocks of rows (`CPU_BLOCK_ELEMENTS`) change no draw."""
    import gtpo.decoding.counter as counter

    scores = torch.randn(9, 40, generator=torch.Generator().manual_seed(1))
    seeds, rows, keep = [11, 12, 13, 14, 15, 16, 17, 18, 19], torch.arange(9), torch.tensor([1, 4, 8])
    for key_rows in (False, True):
        whole = counter_choice(seeds, key_rows=key_rows)(scores, rows)
        assert torch.equal(counter_choice(seeds, key_rows=key_rows)(scores[keep], keep), whole[keep])
        blocks = counter.CPU_BLOCK_ELEMENTS
        try:
            counter.CPU_BLOCK_ELEMENTS = 80  # two rows a block, the last one alone
            assert torch.equal(counter_choice(seeds, key_rows=key_rows)(scores, rows), whole)
        finally:
            counter.CPU_BLOCK_ELEMENTS = blocks


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_path):
    return load_model(tiny_model_path).eval(), load_tokenizer(tiny_model_path)


def test_a_rows_completion_follows_its_seed_in_any_batch(model_and_tokenizer):
    """On the tiny model: rows reversed, or half of them alone, draw the same completions by seed (rows end at
    different steps and are dropped as they end)."""
    model, tokenizer = model_and_tokenizer
    prompts, seeds = _prompts(tokenizer), [40 + i for i in range(8)]
    warpers = [TemperatureLogitsWarper(0.7), TopKLogitsWarper(50)]
    common = (32, [tokenizer.eos_token_id], tokenizer.pad_token_id)
    whole = decode(model, prompts, counter_choice(seeds, warpers), *common)
    assert any(len(c) < 32 for c in whole) and any(len(c) == 32 for c in whole)
    reversed_ = decode(model, prompts[::-1], counter_choice(seeds[::-1], warpers), *common)
    assert reversed_[::-1] == whole
    assert decode(model, prompts[2:6], counter_choice(seeds[2:6], warpers), *common) == whole[2:6]
    kept = decode(model, prompts, counter_choice(seeds, warpers), *common, drop_finished=False)
    assert kept == whole


class CountingCounterChoice(CounterChoice):
    """A counter sampler that counts the draws made on the host (its ``__call__``): none where the step draws."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.host_draws = 0

    def __call__(self, scores, rows):
        self.host_draws += 1
        return super().__call__(scores, rows)


CASES = {
    "plain": ([], None),
    "warpers": ([TemperatureLogitsWarper(0.7), TopKLogitsWarper(50), TopPLogitsWarper(0.95)], None),
    "graph-safe processors": ([TopKLogitsWarper(40)], [TemperatureLogitsWarper(0.8)]),
    "repetition penalty": ([], [RepetitionPenaltyLogitsProcessor(1.3)]),  # reads the tokens: drawn after the step
}


@pytest.mark.parametrize("case", list(CASES))
def test_decode_and_the_fixed_shape_path_eager_or_recorded_draw_the_same_tokens(model_and_tokenizer, case):
    model, tokenizer = model_and_tokenizer
    graph_decode.forget_graphs(model)
    warpers, processors = CASES[case]
    processors = LogitsProcessorList(processors) if processors else None
    prompts, seeds = _prompts(tokenizer), list(range(100, 108))
    common = (32, [tokenizer.eos_token_id], tokenizer.pad_token_id)
    reference = counter_choice(seeds, warpers)
    expected = decode(model, prompts, reference, *common, processors=processors)
    eager = CountingCounterChoice(seeds, warpers)
    got_eager = decode_static(model, prompts, eager, *common, processors=processors, use_graph=False)
    recorded = CountingCounterChoice(seeds, warpers)
    stats = DecodeStats()
    got_recorded = decode_static(model, prompts, recorded, *common, processors=processors, recorder=RunTwice,
                                 stats=stats)  # fmt: skip
    assert got_eager == expected and got_recorded == expected
    inside = in_step_draw(recorded, processors) is not None
    assert inside == (case != "repetition penalty")
    assert (eager.host_draws == recorded.host_draws == 0) == inside
    # The counter advanced by the draws made: `decode` once a step until every row ended (the eager path too); the
    # recorded path looks at the rows' end every 8 steps, so it may draw up to 7 more (on padding).
    longest = max(len(c) for c in expected)
    assert reference.step.item() == eager.step.item() == longest
    assert longest <= recorded.step.item() < longest + graph_decode.END_CHECK_EVERY
    assert stats.captures == 1 and stats.capture_seconds > 0
    graph_decode.forget_graphs(model)


def test_a_kept_step_with_its_draw_serves_the_same_settings_and_not_others(model_and_tokenizer):
    """The recorded draw bakes in its warpers' settings: a second call with equal settings replays the kept step
    (nothing captured anew, the same tokens), another temperature captures anew, and both equal the eager path."""
    model, tokenizer = model_and_tokenizer
    graph_decode.forget_graphs(model)
    prompts, seeds = _prompts(tokenizer), list(range(8))
    common = (24, [tokenizer.eos_token_id], tokenizer.pad_token_id)
    CountingRunTwice.captures = 0
    runs = []
    for temperature in (0.7, 0.7, 1.3):
        choose = counter_choice(seeds, [TemperatureLogitsWarper(temperature)])
        stats = DecodeStats()
        got = decode_static(model, prompts, choose, *common, recorder=CountingRunTwice, stats=stats)
        eager = decode_static(model, prompts, counter_choice(seeds, [TemperatureLogitsWarper(temperature)]), *common,
                              use_graph=False)  # fmt: skip
        assert got == eager
        runs.append((got, stats.captures))
    assert [captures for _, captures in runs] == [1, 0, 1] and CountingRunTwice.captures == 2
    assert runs[0][0] == runs[1][0] != runs[2][0]
    graph_decode.forget_graphs(model)


def test_the_capture_cost_is_counted_once_per_recorded_shape(model_and_tokenizer):
    """Any sampler: `DecodeStats.captures` and `capture_seconds` count what this call recorded (none when kept)."""
    from gtpo.decoding.sampling import per_row_choice

    model, tokenizer = model_and_tokenizer
    graph_decode.forget_graphs(model)
    prompts = _prompts(tokenizer)
    common = (12, [tokenizer.eos_token_id], tokenizer.pad_token_id)
    first, second, eager = DecodeStats(), DecodeStats(), DecodeStats()
    decode_static(model, prompts, per_row_choice(range(8)), *common, recorder=RunTwice, stats=first)
    decode_static(model, prompts, per_row_choice(range(8)), *common, recorder=RunTwice, stats=second)
    decode_static(model, prompts, per_row_choice(range(8)), *common, use_graph=False, stats=eager)
    assert first.captures == 1 and first.capture_seconds > 0
    assert second.captures == eager.captures == 0 and second.capture_seconds == eager.capture_seconds == 0
    graph_decode.forget_graphs(model)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_draws_the_cpus_noise():
    """Integer hashing is exact: the same bits and uniforms on CUDA as on the CPU; the Gumbel noise (float32 log)
    within a few ulps."""
    seeds = torch.tensor([seed for seed, _, _ in KEYS])
    rows = torch.tensor([row for _, row, _ in KEYS])
    steps = torch.tensor([step for _, _, step in KEYS])
    args = (seeds, rows, steps, 151_936)
    cuda_args = (seeds.cuda(), rows.cuda(), steps.cuda(), 151_936)
    assert torch.equal(counter_bits(*cuda_args).cpu(), counter_bits(*args))
    assert torch.equal(counter_uniform(*cuda_args).cpu(), counter_uniform(*args))
    torch.testing.assert_close(counter_gumbel(*cuda_args).cpu(), counter_gumbel(*args), rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_with_the_draw_inside_gives_the_eager_tokens(tiny_model_path):
    """On CUDA the replayed step (forward, warpers and draw in one graph) draws the eager fixed-shape path's tokens.
    As in test_graph_decode's CUDA test, the capture may pick other attention kernels, whose rounding can flip a
    near-tie: every row's first token (from the prefill, outside the graph) is equal and 90 % of all tokens are.
    Also `decode` on CUDA, and the steps were recorded (one capture, timed), with no draw on the host."""
    model = load_model(tiny_model_path).to("cuda").eval()
    tokenizer = load_tokenizer(tiny_model_path)
    graph_decode.forget_graphs(model)
    prompts, seeds = _prompts(tokenizer), list(range(8))
    warpers = [TemperatureLogitsWarper(0.7), TopKLogitsWarper(50)]
    common = (40, [tokenizer.eos_token_id], tokenizer.pad_token_id)
    eager = decode_static(model, prompts, counter_choice(seeds, warpers, device="cuda"), *common, use_graph=False)
    graphed = CountingCounterChoice(seeds, warpers, device="cuda")
    stats = DecodeStats()
    graph = decode_static(model, prompts, graphed, *common, use_graph=True, stats=stats)
    plain = decode(model, prompts, counter_choice(seeds, warpers, device="cuda"), *common)
    assert graphed.host_draws == 0 and stats.captures == 1 and stats.capture_seconds > 0
    for other in (graph, plain):
        assert [c[:1] for c in other] == [c[:1] for c in eager]
        same = sum(a == b for e, g in zip(eager, other, strict=True) for a, b in zip(e, g, strict=False))
        assert same >= 0.9 * sum(len(e) for e in eager)
    graph_decode.forget_graphs(model)
