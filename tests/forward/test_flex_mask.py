"""The packed layout's mask as FlexAttention's block mask (gtpo.forward.flex.block_mask; issue 58, item 1).

Invariants, on hand-built layouts (several prompts, left-padded prompts, completions of different lengths, empty
completions, one-token prompts whose prefix is empty) and block sizes from 2 to torch's default 128:
- the pairs a FlexAttention kernel attends under the block mask (every pair of a full block, the predicate's pairs in a
  partial block, none elsewhere; `flex.visible_pairs`) are exactly `PackedBatch.attention_mask`'s, the dense mask
  the default packed layout hands SDPA and whose numbers the trainer tests hold to TRL's;
- its partial and full blocks, counts and ordered indices both ways, are exactly those torch's own
  `create_block_mask` computes from the dense predicate, so a kernel skips and masks the same blocks;
- it is built without an N x N tensor (the largest it makes is N x N / block_size).
"""

from __future__ import annotations

import pytest
import torch

from gtpo.forward import flex, packing

FIELDS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks", "q_indices",
          "full_q_num_blocks", "full_q_indices")  # fmt: skip


def _rows(prompts: list[list[int]], rows: list[tuple[int, int]], width: int):
    """(ids, mask) in TRL's layout: row r = prompt ``rows[r][0]`` left-padded to the longest prompt, then
    ``rows[r][1]`` completion tokens right-padded to ``width``."""
    prompt_width = max(len(p) for p in prompts)
    ids = torch.zeros(len(rows), prompt_width + width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, (prompt, length) in enumerate(rows):
        tokens = prompts[prompt]
        ids[row, prompt_width - len(tokens) : prompt_width] = torch.tensor(tokens)
        mask[row, prompt_width - len(tokens) : prompt_width + length] = 1
        ids[row, prompt_width : prompt_width + length] = torch.arange(100 + row, 100 + row + length)
    return ids, mask


LAYOUTS = {
    # test_shared_prefix's by-hand example: prompt A twice, prompt B (left-padded) once; N = 8.
    "two-prompts": (_rows([[11, 12, 13], [21, 22]], [(0, 2), (1, 1), (0, 2)], 2), 2),
    # Three prompts of 7, 4 and 5 tokens, rows shuffled, completions 6, 2, 0 (empty), 4, 6, 1, 3, 5; N = 40.
    "three-prompts": (
        _rows(
            [list(range(3, 10)), [31, 32, 33, 34], [41, 42, 43, 44, 45]],
            [(0, 6), (1, 2), (2, 0), (0, 4), (1, 6), (2, 1), (0, 3), (1, 5)],
            6,
        ),
        6,
    ),
    # One-token prompts: empty prefixes, each segment starting at its prompt's first position.
    "one-token-prompts": (_rows([[7], [8], [9, 10]], [(0, 3), (1, 4), (0, 2), (2, 5), (1, 1)], 5), 5),
    # Long enough for torch's default 128-blocks to be absent, partial and full: a 300-token prompt (G = 6,
    # completions of 20-110 tokens) and a 40-token one, left-padded (G = 2); N = 881.
    "long": (
        _rows(
            [list(range(3, 303)), list(range(400, 440))],
            [(0, 110), (1, 60), (0, 20), (0, 95), (1, 33), (0, 70), (0, 110), (0, 45)],
            110,
        ),
        110,
    ),
}


@pytest.mark.parametrize("block", [2, 3, 8, 16, 128])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_block_mask_attends_the_dense_masks_pairs_and_create_block_masks_blocks(layout, block):
    (ids, mask), width = LAYOUTS[layout]
    assert packing.layout_problem(mask, width) is None
    packed = packing.pack(ids, mask, width)
    n = packed.length
    built = flex.block_mask(packed, block)
    assert built.shape == (1, 1, n, n) and tuple(built.BLOCK_SIZE) == (block,) * 2
    assert torch.equal(flex.visible_pairs(built), packed.attention_mask)

    from torch.nn.attention.flex_attention import create_block_mask

    blocks = -(-n // block)
    reference = create_block_mask(flex._mask_mod(packed, blocks * block), 1, 1, n, n, device="cpu", BLOCK_SIZE=block)
    for name in FIELDS:
        assert torch.equal(getattr(built, name), getattr(reference, name)), name
    if layout == "long" and block == 128:  # every class of block occurs: the kernel skips and unmasks some
        present = built.kv_num_blocks + built.full_kv_num_blocks
        assert built.full_kv_num_blocks.sum() > 0 and present.sum() < blocks * blocks
        assert built.kv_num_blocks.sum() > 0


def test_block_mask_makes_no_n_by_n_tensor():
    """The classification reads per-position intervals against key blocks: on the long layout (N = 881) at block
    size 16 the largest tensor it makes holds about N x N / 16 elements, not N²."""
    from torch.utils._python_dispatch import TorchDispatchMode

    (ids, mask), width = LAYOUTS["long"]
    packed = packing.pack(ids, mask, width)
    n, block = packed.length, 16

    class Largest(TorchDispatchMode):
        numel = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for tensor in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(tensor, torch.Tensor):
                    Largest.numel = max(Largest.numel, tensor.numel())
            return out

    with Largest():
        flex.block_mask(packed, block)
    blocks = -(-n // block)
    assert Largest.numel <= blocks * block * blocks < n * n // 8, (Largest.numel, n)


def test_the_pair_counts_the_performance_page_quotes_are_the_logged_batches():
    """docs/performance.md's counts for the H100 record's 1.5B and 3B batches (their logged prompt and completion
    lengths; one prompt, G = 8): the packed layout's N and N² pairs, the padded layout's B x L², the visible pairs, and
    the blocks (and pairs) FlexAttention's block mask computes at 128 x 128."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    page = " ".join((root / "docs" / "performance.md").read_text().split())
    quoted = []
    for log in ("qwen-t07.log", "qwen3b-t07.log"):
        text = (root / "docs" / "measurements" / "gpu-h100-20261128" / log).read_text()
        found = re.search(r"prompt (\d+) tokens, G = 8, completion lengths \[([\d, ]+)\] \(padded to (\d+)\)", text)
        prompt, lengths, width = int(found[1]), [int(n) for n in found[2].split(",")], int(found[3])
        ids, mask = _rows([list(range(3, 3 + prompt))], [(0, n) for n in lengths], width)
        packed = packing.pack(ids, mask, width)
        n = packed.length
        built = flex.block_mask(packed)
        full, partial = int(built.full_kv_num_blocks.sum()), int(built.kv_num_blocks.sum())
        blocks, visible = full + partial, int(packed.attention_mask.sum())
        quoted.append(
            dict(n=f"{n:,}", pairs=f"{n * n / 1e6:.2f} M", padded=f"{8 * (prompt + width) ** 2 / 1e6:.2f} M",
                 visible=f"{visible / 1e6:.2f} M", blocks=f"{blocks} of {(-(-n // 128)) ** 2}",
                 flex=f"{blocks * 128 * 128 / 1e6:.2f} M pairs", full=full)
        )  # fmt: skip
    small, large = quoted
    assert (
        f"N = {small['n']} positions, {small['pairs']} pairs against the padded layout's {small['padded']}, of which "
        f"{small['visible']} are visible; at 3B's, N = {large['n']}, {large['pairs']} pairs against {large['padded']}, "
        f"{large['visible']} visible"
    ) in page
    assert (
        f"it computes {small['blocks']} blocks ({small['flex']}, {small['full']} blocks full, with no mask evaluated) "
        f"and {large['blocks']} ({large['flex']}, {large['full']} full)"
    ) in page


def test_the_visibility_rule_both_masks_read_matches_a_hand_written_layout():
    """`packing.visible`, the one rule of the dense mask and the block mask: two prompts packed as prefix 0 (2
    positions), its completions a (2) and b (1), prefix 1 (1), its completion c (2). Written by hand: each position
    sees, causally, its own prompt's prefix and its own segment, nothing of the other prompt or a sibling."""
    from gtpo.forward.packing import visible

    segment = torch.tensor([-1, -1, 0, 0, 1, -1, 2, 2])
    prompt_of = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1])
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0, 0, 0],  # prefix 0
            [1, 1, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0, 0],  # a
            [1, 1, 1, 1, 0, 0, 0, 0],
            [1, 1, 0, 0, 1, 0, 0, 0],  # b: not a
            [0, 0, 0, 0, 0, 1, 0, 0],  # prefix 1: nothing of prompt 0
            [0, 0, 0, 0, 0, 1, 1, 0],  # c
            [0, 0, 0, 0, 0, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    position = torch.arange(8)
    assert torch.equal(visible(segment, prompt_of, position.unsqueeze(1), position.unsqueeze(0)), expected)
