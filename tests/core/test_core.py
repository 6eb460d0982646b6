"""Conflict spans and token weights λ (gtpo.core), checked against hand-derived values and a plain
Python loop written straight from the definitions of Sec. 5.1."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gtpo.core import conflict_spans, conflict_weights

# --------------------------------------------------------------------------------------------------
# Reference: a plain loop over the definitions (independent of gtpo.core)
# --------------------------------------------------------------------------------------------------


def reference_spans(ids, mask, advantages, group_size):
    """Forward/backward spans as nested lists of bools, straight from Sec. 5.1.

    Forward conflict at position p of completion i: its token v appears at p in some completion of
    the group with A>0 and in some completion with A<0. Backward: the same with positions counted
    from each completion's own last valid token. Span: the leading run of conflicts scanned from the
    first (forward) or last (backward) valid token. Rows with A=0 are never scanned.
    """
    n, t = len(ids), len(ids[0]) if ids else 0
    forward = [[False] * t for _ in range(n)]
    backward = [[False] * t for _ in range(n)]
    for g0 in range(0, n, group_size):
        rows = range(g0, g0 + group_size)
        tokens = {i: [ids[i][p] for p in range(t) if mask[i][p]] for i in rows}  # o_i
        positive = [i for i in rows if advantages[i] > 0]
        negative = [i for i in rows if advantages[i] < 0]

        # {v : ∃ j ∈ G+ with o_{j,p} = v} and the same for G-, per aligned position p (or offset r).
        longest = max([len(tokens[i]) for i in rows] + [0])
        pos_fw = [{tokens[j][p] for j in positive if p < len(tokens[j])} for p in range(longest)]
        neg_fw = [{tokens[k][p] for k in negative if p < len(tokens[k])} for p in range(longest)]
        pos_bw = [{tokens[j][-1 - r] for j in positive if r < len(tokens[j])} for r in range(longest)]
        neg_bw = [{tokens[k][-1 - r] for k in negative if r < len(tokens[k])} for r in range(longest)]

        for i in positive + negative:
            length = len(tokens[i])
            p = 0  # scan left to right from the first valid token
            while p < length and tokens[i][p] in pos_fw[p] and tokens[i][p] in neg_fw[p]:
                forward[i][p] = True
                p += 1
            r = 0  # scan right to left from the last valid token
            while r < length and tokens[i][length - 1 - r] in pos_bw[r] and tokens[i][length - 1 - r] in neg_bw[r]:
                backward[i][length - 1 - r] = True
                r += 1
    return forward, backward


def as_tensors(rows, advantages, pad_id=0, width=None, mask_dtype=torch.bool):
    """Right-pad token lists into (ids, mask, advantages) tensors."""
    width = max([len(r) for r in rows] + [0]) if width is None else width
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = True
    return ids, mask.to(mask_dtype), torch.tensor(advantages, dtype=torch.float32)


def assert_matches_reference(ids, mask, adv, group_size):
    fw, bw = conflict_spans(ids, mask, adv, group_size)
    ref_fw, ref_bw = reference_spans(ids.tolist(), (mask != 0).tolist(), adv.tolist(), group_size)
    assert fw.dtype == torch.bool and bw.dtype == torch.bool
    assert fw.tolist() == ref_fw
    assert bw.tolist() == ref_bw


# --------------------------------------------------------------------------------------------------
# The paper's Figure 9 group, "What is 2+2?", worked by hand
# --------------------------------------------------------------------------------------------------

REASONING = ["<", "reason", "ing", ">"]
END_REASONING = ["</", "reason", "ing", ">"]
ANSWER = ["<", "answer", ">"]
END_ANSWER = ["</", "answer", ">"]
FIGURE9 = [  # (tokens, advantage)
    (REASONING + ["2", "+", "2", "=", "4"] + END_REASONING + ANSWER + ["4"] + END_ANSWER, 1.0),  # ✓, 20 tokens
    (REASONING + ["two", "plus", "two", "is", "3"] + END_REASONING + ANSWER + ["3"] + END_ANSWER, -0.5),  # ✗, 20
    (REASONING + ["adding", "gives", "4"] + END_REASONING + ANSWER + ["4"] + END_ANSWER, 1.0),  # ✓, 18
    (["<", "think", ">", "2", "+", "2", "=", "5"] + END_ANSWER, -1.5),  # ✗ bad format, 11
    (REASONING + ["4"] + END_REASONING + ANSWER + ["4"] + END_ANSWER, 0.0),  # A=0 takes no part, 16
]


def figure9_batch():
    vocab = {}
    rows = [[vocab.setdefault(tok, len(vocab) + 1) for tok in toks] for toks, _ in FIGURE9]
    # Pad with the id of ">" (the EOS-like last token): validity must come from the mask only.
    return as_tensors(rows, [a for _, a in FIGURE9], pad_id=vocab[">"], width=22)


def span_positions(span_row):
    return [p for p, x in enumerate(span_row) if x]


def test_figure9_spans_cover_reasoning_tag_and_closing_answer_tag_only():
    ids, mask, adv = figure9_batch()
    fw, bw = conflict_spans(ids, mask, adv, group_size=5)
    # Forward: "<", "reason", "ing", ">" sit at positions 0-3 in ✓ and ✗ completions; position 4
    # holds "2" (✓) vs "two"/"+" (✗): the run stops. "</reasoning><answer>" at 9-15 also conflicts
    # in rows 0 and 1 but lies in the middle, after the run has stopped, so it is not in the span.
    assert [span_positions(r) for r in fw.tolist()] == [[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3], [0], []]
    # Row 3 ("<think>") shares only "<" at position 0.
    # Backward: "</", "answer", ">" are the last three tokens everywhere; offset 3 holds "4" (✓) vs
    # "3"/"5" (✗), which appear in completions of opposite signs but never at the same offset.
    assert [span_positions(r) for r in bw.tolist()] == [[17, 18, 19], [17, 18, 19], [15, 16, 17], [8, 9, 10], []]
    assert not (fw & ~mask).any() and not (bw & ~mask).any()


def test_figure9_lambda_is_two_on_positive_spans_zero_on_negative_spans_one_elsewhere():
    ids, mask, adv = figure9_batch()
    fw, bw = conflict_spans(ids, mask, adv, group_size=5)
    lam = conflict_weights(fw, bw, adv)
    expected = torch.ones(5, 22)
    expected[0, [0, 1, 2, 3, 17, 18, 19]] = 2.0
    expected[1, [0, 1, 2, 3, 17, 18, 19]] = 0.0
    expected[2, [0, 1, 2, 3, 15, 16, 17]] = 2.0
    expected[3, [0, 8, 9, 10]] = 0.0
    assert torch.equal(lam, expected)
    # The spans do not overlap here, so the authors' product gives the same λ.
    assert torch.equal(conflict_weights(fw, bw, adv, combine="product"), expected)


def test_figure9_matches_reference_loop():
    ids, mask, adv = figure9_batch()
    assert_matches_reference(ids, mask, adv, 5)


# --------------------------------------------------------------------------------------------------
# Small hand examples for the edge cases
# --------------------------------------------------------------------------------------------------


def test_identical_opposite_completions_are_entirely_in_both_spans():
    ids, mask, adv = as_tensors([[7, 8, 9], [7, 8, 9]], [1.0, -1.0], width=4)
    fw, bw = conflict_spans(ids, mask, adv, 2)
    assert fw.tolist() == [[True, True, True, False]] * 2
    assert bw.tolist() == [[True, True, True, False]] * 2


def test_pad_equal_to_a_conflicting_eos_does_not_extend_spans():
    eos = 2
    # Row 0 is shorter; its padding is EOS, which is also the genuine last token of both rows.
    ids, mask, adv = as_tensors([[5, 6, eos], [5, 7, 7, 6, eos]], [1.0, -1.0], pad_id=eos)
    fw, bw = conflict_spans(ids, mask, adv, 2)
    assert fw.tolist() == [[True, False, False, False, False], [True, False, False, False, False]]
    # Backward: offset 0 is EOS in both, offset 1 is 6 in both, offset 2 is 5 vs 7.
    assert bw.tolist() == [[False, True, True, False, False], [False, False, False, True, True]]


def test_same_sign_groups_and_zero_advantage_rows_get_no_spans():
    rows = [[1, 2, 3]] * 4
    for adv in ([1.0, 2.0, 0.5, 0.1], [-1.0, -1.0, -2.0, -0.1], [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 2.0]):
        ids, mask, a = as_tensors(rows, adv)
        fw, bw = conflict_spans(ids, mask, a, 4)
        assert not fw.any() and not bw.any(), adv


def test_zero_advantage_row_does_not_create_conflicts_between_others():
    # Row 2 (A=0) shares "1" with both, but rows 0 (+) and 1 (-) differ at position 0.
    ids, mask, adv = as_tensors([[1, 5], [2, 5], [1, 5]], [1.0, -1.0, 0.0])
    fw, bw = conflict_spans(ids, mask, adv, 3)
    assert fw.tolist() == [[False, False]] * 3
    assert bw.tolist() == [[False, True], [False, True], [False, False]]


def test_empty_completions_and_empty_batches_have_no_spans():
    # Group 0: the positive completion is empty, so nothing conflicts; group 1: a real conflict.
    ids, mask, adv = as_tensors([[], [4], [4], [4]], [1.0, -1.0, 1.0, -1.0], width=2)
    fw, bw = conflict_spans(ids, mask, adv, 2)
    assert fw.tolist() == bw.tolist() == [[False, False], [False, False], [True, False], [True, False]]
    for width in (0, 3):
        fw, bw = conflict_spans(torch.zeros(0, width, dtype=torch.long), torch.zeros(0, width), torch.zeros(0), 4)
        assert fw.shape == bw.shape == (0, width)
    fw, bw = conflict_spans(torch.zeros(4, 0, dtype=torch.long), torch.zeros(4, 0), torch.tensor([1.0, -1, 1, -1]), 2)
    assert fw.shape == (4, 0)


def test_groups_are_independent():
    # Same tokens in two groups, but group 0 has only positives and group 1 only negatives.
    ids, mask, adv = as_tensors([[3, 3], [3, 3], [3, 3], [3, 3]], [1.0, 1.0, -1.0, -1.0])
    fw, bw = conflict_spans(ids, mask, adv, 2)
    assert not fw.any() and not bw.any()
    fw, bw = conflict_spans(ids, mask, adv, 4)
    assert fw.all() and bw.all()


# --------------------------------------------------------------------------------------------------
# Vectorized spans == reference loop on random groups
# --------------------------------------------------------------------------------------------------


@st.composite
def group_batches(draw):
    """Batches of 1-6 groups: structure drawn by hypothesis, contents by a hypothesis-seeded RNG."""
    group_size = draw(st.one_of(st.integers(2, 8), st.integers(2, 64)))
    n_groups = draw(st.integers(1, 3 if group_size > 16 else 6))
    vocab = draw(st.integers(1, 4))  # tiny vocabularies: conflicts everywhere
    max_len = draw(st.integers(0, 40))
    kinds = draw(
        st.lists(
            st.sampled_from(["mixed", "all_pos", "all_neg", "zero", "identical", "ragged_prefix"]),
            min_size=n_groups,
            max_size=n_groups,
        )
    )
    rng = draw(st.randoms(use_true_random=False))
    rows, advantages = [], []
    for kind in kinds:
        if kind == "identical":
            shared = [rng.randrange(vocab) for _ in range(rng.randint(0, max_len))]
            rows += [list(shared) for _ in range(group_size)]
        elif kind == "ragged_prefix":  # one shared sequence cut at different lengths
            shared = [rng.randrange(vocab) for _ in range(max_len)]
            rows += [shared[: rng.randint(0, max_len)] for _ in range(group_size)]
        else:
            rows += [[rng.randrange(vocab) for _ in range(rng.randint(0, max_len))] for _ in range(group_size)]
        signs = {"all_pos": [1], "all_neg": [-1], "zero": [0]}.get(kind, [-1, 0, 1])
        advantages += [rng.choice(signs) * rng.choice([0.5, 1.0, 3.0]) for _ in range(group_size)]
    extra = draw(st.integers(0, 3))  # padding columns beyond the longest row
    mask_dtype = draw(st.sampled_from([torch.bool, torch.long, torch.float32]))
    pad_id = rng.randrange(vocab + 1)
    ids, mask, adv = as_tensors(rows, advantages, pad_id=pad_id, width=max_len + extra, mask_dtype=mask_dtype)
    return ids, mask, adv, group_size


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(group_batches())
def test_vectorized_spans_equal_reference_loop(batch):
    ids, mask, adv, group_size = batch
    assert_matches_reference(ids, mask, adv, group_size)


def random_batch(rng: random.Random, n_groups: int, group_size: int, max_len: int, vocab: int):
    rows, advantages = [], []
    for _ in range(n_groups):
        prefix = [rng.randrange(vocab) for _ in range(rng.randrange(0, 6))]  # shared formatting-like head
        suffix = [rng.randrange(vocab) for _ in range(rng.randrange(0, 6))]
        for _ in range(group_size):
            body = [rng.randrange(vocab) for _ in range(rng.randrange(0, max_len))]
            rows.append((prefix + body + suffix)[: max_len + 10])
            advantages.append(rng.choice([-1.0, -0.3, 0.0, 0.7, 1.0]))
    return as_tensors(rows, advantages, pad_id=rng.randrange(vocab))


@pytest.mark.parametrize("group_size", [2, 5, 12, 64])
def test_vectorized_spans_equal_reference_loop_on_thousands_of_seeded_groups(group_size):
    rng = random.Random(group_size)
    n_groups = {2: 3000, 5: 1500, 12: 800, 64: 100}[group_size]
    ids, mask, adv = random_batch(rng, n_groups, group_size, max_len=30, vocab=3)
    assert_matches_reference(ids, mask, adv, group_size)


@pytest.mark.parametrize("pairwise_max_group", [0, 64])  # sorting for every G / pairs for every G
@pytest.mark.parametrize("chunk_bytes", [1, 1 << 30])  # one position or column per chunk / one chunk
def test_both_detection_methods_and_any_chunking_give_the_same_spans(monkeypatch, pairwise_max_group, chunk_bytes):
    from gtpo.core import conflicts  # the detection switches live there

    for group_size, seed in ((3, 0), (6, 1), (40, 2)):
        ids, mask, adv = random_batch(random.Random(seed), 240 // group_size, group_size, max_len=25, vocab=2)
        expected = reference_spans(ids.tolist(), mask.tolist(), adv.tolist(), group_size)
        monkeypatch.setattr(conflicts, "PAIRWISE_MAX_GROUP", pairwise_max_group)
        monkeypatch.setattr(conflicts, "_SPAN_CHUNK_BYTES", {"cpu": chunk_bytes})
        fw, bw = conflict_spans(ids, mask, adv, group_size)
        assert (fw.tolist(), bw.tolist()) == expected


@settings(max_examples=100, deadline=None)
@given(group_batches(), st.integers(0, 2**40), st.integers(1, 2**20))
def test_spans_invariant_to_pad_content_and_token_relabeling(batch, offset, scale):
    ids, mask, adv, group_size = batch
    fw, bw = conflict_spans(ids, mask, adv, group_size)
    # An injective relabeling of token ids (huge ids: far beyond any vocabulary) and arbitrary
    # padding content change nothing: detection never looks at the vocabulary or at a pad id.
    valid = mask != 0
    relabeled = torch.where(valid, ids * (2 * scale + 1) + offset, torch.randint_like(ids, 0, 1000))
    fw2, bw2 = conflict_spans(relabeled, mask, adv, group_size)
    assert torch.equal(fw, fw2) and torch.equal(bw, bw2)


def test_spans_permute_with_rows_of_a_group():
    ids, mask, adv = random_batch(random.Random(1), 1, 10, max_len=12, vocab=2)
    perm = torch.randperm(10, generator=torch.Generator().manual_seed(0))
    fw, bw = conflict_spans(ids, mask, adv, 10)
    fw_p, bw_p = conflict_spans(ids[perm], mask[perm], adv[perm], 10)
    assert torch.equal(fw[perm], fw_p) and torch.equal(bw[perm], bw_p)


def test_spans_accept_any_integer_id_dtype_and_bfloat16_advantages():
    ids, mask, adv = random_batch(random.Random(2), 30, 4, max_len=15, vocab=3)
    fw, bw = conflict_spans(ids, mask, adv, 4)
    for dtype in (torch.int32, torch.int16, torch.uint8):
        got = conflict_spans(ids.to(dtype), mask, adv.to(torch.bfloat16), 4)
        assert torch.equal(got[0], fw) and torch.equal(got[1], bw)


# --------------------------------------------------------------------------------------------------
# λ: union vs product
# --------------------------------------------------------------------------------------------------


def test_weights_are_one_outside_spans_zero_and_positive_weight_inside_by_sign():
    fw = torch.tensor([[True, False, False], [True, True, False], [True, False, False]])
    bw = torch.tensor([[False, False, True], [False, False, False], [False, False, False]])
    adv = torch.tensor([0.5, -2.0, 0.0])
    lam = conflict_weights(fw, bw, adv, positive_weight=3.0)
    assert lam.tolist() == [[3.0, 1.0, 3.0], [0.0, 0.0, 1.0], [1.0, 1.0, 1.0]]


@settings(max_examples=200, deadline=None)
@given(group_batches(), st.sampled_from([0.0, 0.5, 2.0, 3.0]))
def test_union_and_product_differ_exactly_on_positive_tokens_inside_both_spans(batch, weight):
    ids, mask, adv, group_size = batch
    fw, bw = conflict_spans(ids, mask, adv, group_size)
    union = conflict_weights(fw, bw, adv, positive_weight=weight, combine="union")
    product = conflict_weights(fw, bw, adv, positive_weight=weight, combine="product")
    both_positive = fw & bw & (adv > 0).unsqueeze(-1)
    assert torch.equal(union[~both_positive], product[~both_positive])
    assert (union[both_positive] == weight).all() and (product[both_positive] == weight * weight).all()


def test_union_and_product_differ_on_overlapping_positive_spans():
    ids, mask, adv = as_tensors([[7, 8], [7, 8]], [1.0, -1.0])
    fw, bw = conflict_spans(ids, mask, adv, 2)
    assert conflict_weights(fw, bw, adv).tolist() == [[2.0, 2.0], [0.0, 0.0]]
    assert conflict_weights(fw, bw, adv, combine="product").tolist() == [[4.0, 4.0], [0.0, 0.0]]


# --------------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------------

IDS = torch.tensor([[1, 2, 3], [1, 2, 0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
ADV = torch.tensor([1.0, -1.0])


@pytest.mark.parametrize(
    "args, message",
    [
        ((IDS, MASK[:, :2], ADV, 2), "completion_mask has shape"),
        ((IDS, MASK, ADV[:1], 1), "advantages has 1 entries"),
        ((IDS, MASK, ADV.view(2, 1), 2), "advantages must have shape (N,)"),
        ((IDS[0], MASK[0], ADV, 2), "completion_ids must be an (N, T) tensor"),
        ((IDS.float(), MASK, ADV, 2), "integer token ids"),
        ((IDS, MASK, ADV, 3), "not a multiple of group_size=3"),
        ((IDS, MASK, ADV, 0), "group_size must be a positive int"),
        ((IDS, MASK, torch.tensor([1.0, float("nan")]), 2), "advantages must be finite"),
        ((IDS, MASK, torch.tensor([float("inf"), 1.0]), 2), "non-finite values at rows [0]"),
        ((IDS, MASK, torch.tensor([1, -1]), 2), "advantages must be a floating tensor"),
        ((IDS, torch.tensor([[1, 1, 1], [0, 1, 1]]), ADV, 2), "must be right-padded"),
        ((IDS, torch.tensor([[1, 1, 2], [1, 1, 0]]), ADV, 2), "only 0/1"),
        ((-IDS, MASK, ADV, 2), "non-negative"),
    ],
)
def test_conflict_spans_rejects_bad_input_with_a_clear_message(args, message):
    with pytest.raises(
        ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")
    ):
        conflict_spans(*args)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(combine="sum"), "unknown combine mode 'sum'; valid: product, union"),
        (dict(positive_weight=float("nan")), "positive_weight must be finite"),
        (dict(positive_weight=-1.0), "positive_weight must be finite and >= 0"),
        (dict(advantages=torch.tensor([1.0])), "advantages has 1 entries"),
        (dict(backward=torch.zeros(2, 2, dtype=torch.bool)), "spans differ in shape"),
        (dict(forward=torch.zeros(2, 3)), "forward must be an \\(N, T\\) bool tensor"),
    ],
)
def test_conflict_weights_rejects_bad_input_with_a_clear_message(kwargs, message):
    args = dict(
        forward=torch.zeros(2, 3, dtype=torch.bool), backward=torch.zeros(2, 3, dtype=torch.bool), advantages=ADV
    )
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        conflict_weights(**args)


# --------------------------------------------------------------------------------------------------
# Devices
# --------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_spans_and_weights_on_cuda_equal_cpu():
    ids, mask, adv = random_batch(random.Random(3), 200, 8, max_len=40, vocab=3)
    fw, bw = conflict_spans(ids, mask, adv, 8)
    fw_c, bw_c = conflict_spans(ids.cuda(), mask.cuda(), adv.cuda().bfloat16(), 8)
    assert fw_c.is_cuda and torch.equal(fw_c.cpu(), fw) and torch.equal(bw_c.cpu(), bw)
    lam = conflict_weights(fw_c, bw_c, adv.cuda())
    assert lam.is_cuda and torch.equal(lam.cpu(), conflict_weights(fw, bw, adv))


# --------------------------------------------------------------------------------------------------
# Window-by-window search (spans.FIRST_SPAN_WINDOW): exact whatever the window, cost ∝ span length
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("first_window", [1, 2, 3, 7])
def test_spans_are_the_same_whatever_the_first_window(monkeypatch, first_window):
    """Invariant: searching in windows of w, 8w, 64w, ... positions finds the reference spans exactly,
    also when spans end inside, at, or across window boundaries (tiny vocabularies: long runs)."""
    from gtpo.core import spans

    monkeypatch.setattr(spans, "FIRST_SPAN_WINDOW", first_window)
    for group_size, seed in ((2, 0), (5, 1), (12, 2), (40, 3)):
        ids, mask, adv = random_batch(random.Random(seed), 400 // group_size, group_size, max_len=40, vocab=2)
        assert_matches_reference(ids, mask, adv, group_size)


@pytest.mark.parametrize("shared", [0, 1, 63, 64, 65, 575, 576, 577, 700])
def test_long_shared_heads_and_tails_cross_the_default_windows(shared):
    """Spans of 63-65, 575-577 tokens and whole completions (windows end at 64 and 64 + 512 = 576) are found
    in full at the default first window of 64 positions, against the reference loop."""
    rng = random.Random(shared)
    head = [rng.randrange(50) for _ in range(shared)]
    tail = [rng.randrange(50) for _ in range(shared)]
    rows = []
    for i in range(6):  # two positives, two negatives, a zero, and one completion that is all head
        body = [rng.randrange(50, 1000) for _ in range(rng.randrange(0, 30))]
        rows.append(head if i == 5 else (head + body + tail)[:700])
    ids, mask, adv = as_tensors(rows, [1.0, 1.0, -1.0, -0.5, 0.0, 1.0], pad_id=7, width=720)
    assert_matches_reference(ids, mask, adv, 6)
    fw, bw = conflict_spans(ids, mask, adv, 6)
    assert fw[0].sum().item() >= min(shared, mask[0].sum().item())  # the shared head is inside the span


def test_skipping_validation_changes_no_span_and_the_default_still_validates():
    """validate=False is for callers that checked their batch's producer: same spans on valid input;
    the default still rejects a left-padded mask (the check is not weakened for everyone else)."""
    ids, mask, adv = random_batch(random.Random(9), 50, 4, max_len=30, vocab=3)
    checked = conflict_spans(ids, mask, adv, 4)
    unchecked = conflict_spans(ids, mask.int(), adv, 4, validate=False)
    assert torch.equal(checked[0], unchecked[0]) and torch.equal(checked[1], unchecked[1])
    left_padded = mask.flip(-1)  # some rows are shorter than T, so their valid tokens now follow padding
    assert not left_padded.all()
    with pytest.raises(ValueError, match="right-padded"):
        conflict_spans(ids, left_padded, adv, 4)


# ------------------------------------------------------------------ the correction's ablations (issue 38, item 3)
def _ablation_group():
    """Two completions of one group, A = +1 and -1, sharing the opening [5, 7] and the ending [9]: forward spans
    cover positions 0-1 of both, backward spans the last position of both."""
    ids = torch.tensor([[5, 7, 1, 9], [5, 7, 2, 9]])
    mask = torch.ones(2, 4, dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0])
    fw, bw = conflict_spans(ids, mask, adv, 2)
    assert fw.int().tolist() == [[1, 1, 0, 0], [1, 1, 0, 0]] and bw.int().tolist() == [[0, 0, 0, 1], [0, 0, 0, 1]]
    return fw, bw, adv


@pytest.mark.parametrize(
    "options, positive_row, negative_row",
    [
        ({}, [2, 2, 1, 2], [0, 0, 1, 0]),  # the paper: doubled positives, protected negatives, on both spans
        (dict(negative_weight=1.0), [2, 2, 1, 2], [1, 1, 1, 1]),  # doubling without protecting negatives
        (dict(positive_weight=1.0), [1, 1, 1, 1], [0, 0, 1, 0]),  # protection without doubling
        (dict(sides="forward"), [2, 2, 1, 1], [0, 0, 1, 1]),  # the opening only
        (dict(sides="backward"), [1, 1, 1, 2], [1, 1, 1, 0]),  # the ending only
    ],
    ids=["paper", "no-protection", "no-doubling", "forward-only", "backward-only"],
)
def test_conflict_weight_ablations_on_a_hand_built_group(options, positive_row, negative_row):
    """λ of Eq. 5 under each ablation flag, by hand; with no option it is the paper's."""
    fw, bw, adv = _ablation_group()
    lam = conflict_weights(fw, bw, adv, **options)
    assert lam.tolist() == [[float(x) for x in positive_row], [float(x) for x in negative_row]]


def test_negative_weight_and_sides_are_checked():
    fw, bw, adv = _ablation_group()
    with pytest.raises(ValueError, match="negative_weight must be finite and >= 0"):
        conflict_weights(fw, bw, adv, negative_weight=-0.5)
    with pytest.raises(ValueError, match="span sides"):
        conflict_weights(fw, bw, adv, sides="middle")
