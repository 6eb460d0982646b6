"""The packed layout's attention through FlexAttention: a block mask in place of the dense N x N one (issue 58, item 1).

The packed layout's dense mask (`packing.PackedBatch.attention_mask`) makes SDPA compute every one of the N² (query,
key) pairs of the packed sequence and throw most of them away: on one H100 at Qwen2.5-3B's config about 10.1 M pairs
where about 1.2 M are needed. Here the same predicate (causal, same prompt, the key in the prefix or in the query's
own segment) is handed to torch's FlexAttention as a `BlockMask`: the (query, key) plane cut into 128 x 128 blocks,
each absent (skipped), full (computed with no mask) or partial (computed, the predicate evaluated per pair). The
blocks are classified from per-position intervals, not from an N x N tensor: each query sees at most two runs of keys,
its prompt's prefix (up to itself) and its own piece from its start to itself, so one (N, N / 128) comparison
classifies every block (:func:`block_mask`). The classes are exactly those torch's `create_block_mask` gives from the
dense predicate (tested), and :func:`visible_pairs` expands a block mask the way the kernel reads it, for tests.

How it runs: transformers' own flex attention (`transformers.integrations.flex_attention.flex_attention_forward`,
compiled by torch on first use) receives the BlockMask as the model's 4D attention mask, which transformers passes
through unchanged. Switching the model's implementation around the forward (`set_attn_implementation`) would not do:
TRL checkpoints gradients by default, and the recompute runs inside the backward, after a switch back. So
:func:`install` wraps, once and only when flex attention is asked for, the function registered for "sdpa" in
transformers' AttentionInterface: a BlockMask goes to flex attention, every other mask to the function that was
there, unchanged. A model whose config says "sdpa" then routes the packed layout's block mask to flex, in the forward
and in its recompute alike.

Opt-in (`layout_choice.ATTENTION_ENV`, ``GTPO_PACKED_ATTENTION=flex``), not the default: no GPU has measured it.
Where it cannot run, :func:`problem` says why and the dense mask scores the batch.
"""

from __future__ import annotations

import importlib

import torch

from gtpo.forward.packing import visible

BLOCK_SIZE = 128  # torch's default sparse block (_DEFAULT_SPARSE_BLOCK_SIZE): the kernels' tiles divide it
# Devices where torch's flex_attention refuses a backward (torch 2.13: "FlexAttention does not support backward on
# CPU"): there the flex layout scores only batches that need no gradient.
NO_BACKWARD = ("cpu", "mps")
_installed: dict = {}  # {"previous": the "sdpa" function :func:`install` wrapped, "dispatch": the wrapper}


def _intervals(packed):
    """Per position q of the packed sequence, the keys it may see as two runs [lo, hi): its prompt's prefix, cut at
    q (``prefix``), and its own piece, prefix or segment, from the piece's first position to q (``piece``). From the
    layout's (N,) ``segment`` and ``prompt_of`` on their device, in a fixed number of operations (no host sync)."""
    segment, prompt_of = packed.segment, packed.prompt_of
    n = segment.numel()
    position = torch.arange(n, device=segment.device)
    changed = torch.ones(n, dtype=torch.bool, device=segment.device)
    new_prompt = changed.clone()
    new_prompt[1:] = prompt_of[1:] != prompt_of[:-1]
    changed[1:] = new_prompt[1:] | (segment[1:] != segment[:-1])
    piece_start = torch.where(changed, position, 0).cummax(0).values
    prompt_start = torch.where(new_prompt, position, 0).cummax(0).values
    # A prompt's positions are its prefix (segment -1), then its segments: the prefix ends after its -1 positions.
    prefix_length = torch.zeros(packed.prompts, dtype=torch.long, device=segment.device)
    prefix_length.index_add_(0, prompt_of, (segment < 0).long())
    prefix_end = torch.minimum(prompt_start + prefix_length[prompt_of], position + 1)
    return (prompt_start, prefix_end), (piece_start, position + 1)


def _mask_mod(packed, padded_length: int):
    """FlexAttention's per-pair predicate: `PackedBatch.attention_mask`'s, read from (N,) tensors padded to a whole
    number of blocks (a kernel may evaluate it on a ragged last block's indices; padded rows see only padded keys)."""
    pad = padded_length - packed.length
    segment = torch.nn.functional.pad(packed.segment, (0, pad), value=-2)
    prompt_of = torch.nn.functional.pad(packed.prompt_of, (0, pad), value=-1)

    def mask_mod(batch, head, query, key):
        return visible(segment, prompt_of, query, key)

    return mask_mod


def block_mask(packed, block_size: int = BLOCK_SIZE):
    """The packed layout's mask as a FlexAttention `BlockMask` of (1, 1, N, N), on the layout's device.

    Args:
        packed: a `packing.PackedBatch` of N > 0 positions.
        block_size: the side of a block (the kernels need a multiple of their tiles; 128 is torch's default).

    Returns:
        A BlockMask whose partial and full blocks (counts and ordered indices) are those `create_block_mask` gives for
        the same predicate: a block is full where every pair in it is visible (a block cut by the sequence's end never
        is), partial where some are. Built from per-position intervals: (N, N / block_size) comparisons, never N x N.
    """
    from torch.nn.attention.flex_attention import BlockMask

    n = packed.length
    blocks = -(-n // block_size)
    device = packed.segment.device
    (prefix_lo, prefix_hi), (piece_lo, piece_hi) = (
        (lo.unsqueeze(1), hi.unsqueeze(1)) for lo, hi in _intervals(packed)
    )  # each (N, 1)
    first = torch.arange(blocks, device=device).unsqueeze(0) * block_size  # (1, blocks): a key block's first key
    end = (first + block_size).clamp(max=n)
    touches = ((prefix_lo < prefix_hi) & (prefix_lo < end) & (prefix_hi > first)) | (
        (piece_lo < end) & (piece_hi > first)
    )  # (N, blocks): the row sees some key of the block
    covers = (first + block_size <= n) & (
        ((first >= prefix_lo) & (end <= prefix_hi))
        | ((first >= piece_lo) & (end <= piece_hi))
        | ((prefix_hi >= piece_lo) & (first >= prefix_lo) & (end <= piece_hi))  # the two runs adjoin
    )  # (N, blocks): the row sees every key of the block
    pad = blocks * block_size - n  # rows past the end: none of their pairs is visible (create_block_mask's padding)
    touches = torch.nn.functional.pad(touches, (0, 0, 0, pad)).view(blocks, block_size, blocks).any(1)
    full = torch.nn.functional.pad(covers, (0, 0, 0, pad)).view(blocks, block_size, blocks).all(1)
    partial = touches & ~full

    def ordered(dense):  # create_block_mask's order: the blocks present first, each group ascending
        dense = dense.to(torch.int32).view(1, 1, blocks, blocks)
        order = torch.argsort(dense, dim=-1, descending=True, stable=True)
        return dense.sum(-1).to(torch.int32), order.to(torch.int32)

    return BlockMask.from_kv_blocks(
        *ordered(partial), *ordered(full), BLOCK_SIZE=block_size,
        mask_mod=_mask_mod(packed, blocks * block_size), seq_lengths=(n, n),
    )  # fmt: skip


def visible_pairs(mask) -> torch.Tensor:
    """(1, 1, N, N) bool: the (query, key) pairs a FlexAttention kernel attends under ``mask``, as it reads one: every
    pair of a full block, the pairs of a partial block where the mask's predicate holds, none elsewhere. For tests:
    this materialises N x N."""
    q_block, kv_block = mask.BLOCK_SIZE
    n_q, n_kv = mask.seq_lengths

    def dense(counts, indices):
        present = torch.arange(indices.size(-1), device=indices.device) < counts[..., None]
        out = torch.zeros(indices.shape[-2], indices.size(-1) + 1, dtype=torch.bool, device=indices.device)
        out.scatter_(1, torch.where(present, indices, indices.size(-1))[0, 0].long(), True)
        return out[:, :-1].repeat_interleave(q_block, 0).repeat_interleave(kv_block, 1)[:n_q, :n_kv]

    partial = dense(mask.kv_num_blocks, mask.kv_indices)
    full = dense(mask.full_kv_num_blocks, mask.full_kv_indices)
    query, key = torch.arange(n_q).view(-1, 1), torch.arange(n_kv).view(1, -1)
    predicate = mask.mask_mod(0, 0, query.to(partial.device), key.to(partial.device))
    return (full | (partial & predicate)).view(1, 1, n_q, n_kv)


def _dispatch(previous):
    def attention(module, query, key, value, attention_mask, *args, **kwargs):
        from torch.nn.attention.flex_attention import BlockMask

        if isinstance(attention_mask, BlockMask) and not args:  # models pass the rest by keyword
            from transformers.integrations.flex_attention import flex_attention_forward

            return flex_attention_forward(module, query, key, value, attention_mask, **kwargs)
        return previous(module, query, key, value, attention_mask, *args, **kwargs)

    attention.__doc__ = f"{previous.__name__}, a FlexAttention BlockMask sent to flex attention (gtpo.forward.flex)"
    return attention


def install() -> None:
    """Wrap transformers' "sdpa" attention function so that a BlockMask goes to transformers' flex attention; every
    other mask reaches the function that was registered, unchanged. Idempotent; run on the flex layout's first use."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if _installed and ALL_ATTENTION_FUNCTIONS["sdpa"] is _installed["dispatch"]:
        return
    previous = ALL_ATTENTION_FUNCTIONS["sdpa"]
    _installed.update(previous=previous, dispatch=_dispatch(previous))
    ALL_ATTENTION_FUNCTIONS["sdpa"] = _installed["dispatch"]


def uninstall() -> None:
    """Undo :func:`install` (for tests): "sdpa" maps to the function it wrapped."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if _installed and ALL_ATTENTION_FUNCTIONS["sdpa"] is _installed["dispatch"]:
        ALL_ATTENTION_FUNCTIONS["sdpa"] = _installed["previous"]
    _installed.clear()


def problem(model, device_type: str, needs_grad: bool) -> str | None:
    """Why the flex layout cannot score a packed batch of ``model`` here, or None (then :func:`install` has run).

    Args:
        model: the (unwrapped) model; its config's attention implementation must be "sdpa".
        device_type: where the batch runs.
        needs_grad: whether the forward must support a backward (``torch.is_grad_enabled()``).
    """
    from transformers.utils import is_torch_flex_attn_available

    config = model.config
    if not is_torch_flex_attn_available():
        return "this torch has no FlexAttention"
    if config._attn_implementation != "sdpa":
        return f"the block mask is routed from sdpa's attention function, not {config._attn_implementation!r}'s"
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not getattr(base, "_supports_flex_attn", False):
        return f"{type(base).__name__} does not support flex_attention in transformers"
    if needs_grad and device_type in NO_BACKWARD:
        return f"torch {torch.__version__.split('+')[0]}'s FlexAttention has no backward on {device_type}"
    if model.training and getattr(config.get_text_config(), "attention_dropout", 0.0):
        return "transformers' flex attention refuses attention dropout"
    install()
    table = getattr(importlib.import_module(type(base).__module__), "ALL_ATTENTION_FUNCTIONS", None)
    if table is None or table.get("sdpa") is not _installed["dispatch"]:
        return f"{type(base).__name__} does not look its attention up in transformers' AttentionInterface"
    return None
