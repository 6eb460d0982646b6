"""The packed layout of Prefix Grouper (arXiv 2506.05433): a micro-batch's completions scored with each prompt once.

TRL scores a micro-batch as B rows of (left-padded prompt + completion right-padded to the batch's longest), so
a group's prompt is encoded G times and most positions can be padding. Here the rows are packed into ONE
sequence, with no padding: for each distinct prompt, its tokens but the last (the *prefix*) once, then for each
of its completions a *segment* [the prompt's last token, completion[:-1]] (a segment's position t predicts
completion token t). A custom 4D mask lets each segment attend to itself causally and to its own prefix, and
nothing else; position ids are the ones TRL's padded row gives each token (its column), so every completion
token sees exactly the keys, values and positions it sees in TRL's layout. The outputs are then TRL's up to
floating-point summation order, and the gradient of the shared prefix is the sum over its completions, as in
TRL's (Prefix Grouper, Sec. 3).

Position ids alone are not enough: transformers then reads a drop in positions as the start of an independent
sequence, and a segment would not see its prefix. A dense mask costs (P + ΣL)² in attention, more than the padded
layout's Σ(P + L_max)² when completions are long, so `gtpo.forward.layout_choice.choose_layout` compares the two
from the model's config, the batch's lengths and the device's fixed costs, or takes the user's choice, and TRL's
padded path runs where packing would cost more (`gtpo.trainer.prefix_sharing`, GRPOTrainer's scoring hook, decides
per micro-batch and runs the packed forward).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch

from gtpo.forward import trl_head

# Attention implementations that honour a custom 4D mask (flash and paged attention ignore it).
MASKED_ATTENTION = ("sdpa", "eager")


def visible(segment: torch.Tensor, prompt_of: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """Whether packed position ``query`` may attend to packed position ``key``: causally, within its own prompt, to
    the prompt's prefix (segment -1) or to its own segment. The one rule both forms of the mask read
    (`PackedBatch.attention_mask`, dense; `gtpo.forward.flex`'s block mask, per pair).

    Args:
        segment, prompt_of: (N,) each position's segment (-1: a prompt's prefix) and prompt index.
        query, key: position indices of any shapes that broadcast together.

    Returns:
        bool, the broadcast shape of ``query`` and ``key``.
    """
    same_prompt = prompt_of[query] == prompt_of[key]
    return (query >= key) & same_prompt & ((segment[key] == -1) | (segment[query] == segment[key]))


@dataclass
class PackedBatch:
    """One micro-batch packed as a single sequence of N positions.

    Attributes:
        input_ids: (1, N) long: prefixes and segments, no padding.
        position_ids: (1, N) long: each token's column in TRL's padded row.
        shift_labels: (1, N) long: the next-token label of each position, -100 where nothing is scored.
        source: (B, K) long: the packed position that scores completion token (b, k), -1 where (b, k) is padding.
        scored_index: (M,) long, ascending: the packed positions that carry a label (where :attr:`scored` is True),
            planned on the host, so that laying values out by them takes no host sync (``masked_scatter`` takes one).
        prompts: the number of distinct prompts (prefixes) packed.
        segment: (N,) long: the batch row a position's segment belongs to, -1 in a prefix.
        prompt_of: (N,) long: the prefix (distinct prompt) each position belongs to.
        mask_dtype: None for a boolean mask (sdpa), or the float dtype of an additive mask (eager attention).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    shift_labels: torch.Tensor
    source: torch.Tensor
    scored_index: torch.Tensor
    prompts: int
    segment: torch.Tensor
    prompt_of: torch.Tensor
    mask_dtype: torch.dtype | None = None

    @property
    def length(self) -> int:
        """N, the packed sequence's length."""
        return self.input_ids.size(1)

    @functools.cached_property
    def attention_mask(self) -> torch.Tensor:
        """(1, 1, N, N): where a query position may attend to a key position (True, or 0 in an additive mask):
        causally, within its own prompt, to the prefix or to its own segment. Built on first use, so a batch that
        `choose_layout` sends to the padded layout never allocates the N x N mask."""
        n = self.length
        position = torch.arange(n, device=self.segment.device)
        mask = visible(self.segment, self.prompt_of, position.unsqueeze(1), position.unsqueeze(0)).reshape(1, 1, n, n)
        if self.mask_dtype is None:
            return mask
        additive = torch.zeros(mask.shape, dtype=self.mask_dtype, device=mask.device)
        return additive.masked_fill_(~mask, torch.finfo(self.mask_dtype).min)

    @property
    def scored(self) -> torch.Tensor:
        """(N,) bool: the positions with a label."""
        return self.shift_labels[0] != -100

    def unpack(self, values: torch.Tensor) -> torch.Tensor:
        """(1, N) per-position values -> (B, K) per completion token, 0 where (b, k) is padding (as TRL's)."""
        flat = values.reshape(-1)
        gathered = flat[self.source.clamp(min=0)]  # (B, K)
        return gathered.masked_fill(self.source < 0, 0)


def layout_problem(attention_mask: torch.Tensor, logits_to_keep: int) -> str | None:
    """Why the packed layout cannot represent this batch, or None.

    Args:
        attention_mask: (B, L) 0/1, prompt (left-padded) then completion (right-padded).
        logits_to_keep: K, the completion width.
    """
    prompt_mask = attention_mask[:, : attention_mask.shape[1] - logits_to_keep]
    completion_mask = attention_mask[:, attention_mask.shape[1] - logits_to_keep :]
    if prompt_mask.shape[1] == 0:
        return "the batch has no prompt tokens"
    # Left padding: a row's mask never falls from 1 to 0 in the prompt, never rises from 0 to 1 in the completion.
    # The three checks travel to the host together (one sync on a GPU, not three).
    prompt_hole, prompt_ends_padded, completion_hole = torch.stack(
        [
            (prompt_mask[:, 1:] < prompt_mask[:, :-1]).any(),
            ~(prompt_mask[:, -1] != 0).all(),
            (completion_mask[:, 1:] > completion_mask[:, :-1]).any(),
        ]
    ).tolist()
    if prompt_hole or prompt_ends_padded:
        return "a prompt is not left-padded (its attention mask has a hole or ends in padding)"
    if completion_hole:
        return "a completion's attention mask has a hole (tool output or a custom rollout)"
    return None


def host_copy(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int) -> torch.Tensor:
    """(B, P + L) on the host: the prompts' ids (P = L - K columns), then the attention mask; what :func:`pack` and
    :func:`layout_problem` read, in one device-to-host copy (a GPU's one sync for both)."""
    return torch.cat([input_ids[:, : input_ids.shape[1] - logits_to_keep], attention_mask], dim=1).cpu()


def pack(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int, *, mask_dtype=None, on_host=None
) -> PackedBatch:
    """Pack a (B, L) batch of prompt + completion rows (TRL's layout) into one sequence; see the module docstring.

    Args:
        input_ids: (B, L) long, left-padded prompts then right-padded completions of width K = logits_to_keep.
        attention_mask: (B, L) 0/1 of the same layout (:func:`layout_problem` must return None for it).
        logits_to_keep: K.
        mask_dtype: None for a boolean mask (sdpa), or the float dtype of an additive mask (eager attention).
        on_host: (B, P + L) :func:`host_copy` of these rows, where the caller made one already; else made here.

    Returns:
        PackedBatch. Rows with the same prompt tokens (and padding) share one prefix, in order of first appearance.
    """
    device = input_ids.device
    batch, length = input_ids.shape
    prompt_width = length - logits_to_keep
    # The layout is planned on the host from one copy of the prompts' ids and the mask (on a GPU its one sync).
    on_host = host_copy(input_ids, attention_mask, logits_to_keep) if on_host is None else on_host
    prompt_ids, mask = on_host[:, :prompt_width], on_host[:, prompt_width:]
    prompt_mask = mask[:, :prompt_width]
    # Group rows by their prompt row (TRL shuffles rows, so a group's completions need not be adjacent).
    keys = torch.cat([prompt_ids * prompt_mask, prompt_mask], dim=1)
    _, group_of_row = torch.unique(keys, dim=0, return_inverse=True)
    completion_lengths = mask[:, prompt_width:].sum(dim=1).tolist()
    pads = (prompt_width - prompt_mask.sum(dim=1)).tolist()
    group_of_row = group_of_row.tolist()
    order: dict[int, list[int]] = {}
    for row, group in enumerate(group_of_row):
        order.setdefault(group, []).append(row)

    # The plan, on the host: the packed sequence as pieces (a prefix, or a segment), each a run of consecutive
    # columns of one row of the padded batch: (row, first column, length, segment's row or -1, prompt number).
    # A prefix is prompt[pad : P-1] of its group's first row; a segment is columns P-1 .. P-2+n of its row, which
    # hold [the prompt's last token, completion[:n-1]] (the rows of a group share the prompt, padding included).
    pieces = []
    offset = 0
    for number, rows in enumerate(order.values()):
        first = rows[0]
        pieces.append((first, pads[first], prompt_width - 1 - pads[first], -1, number))
        offset += prompt_width - 1 - pads[first]
        for row in rows:
            n = completion_lengths[row]
            if n == 0:
                continue  # an empty completion scores nothing (TRL's row is all -100 there)
            pieces.append((row, prompt_width - 1, n, row, number))
            offset += n
    plan = torch.tensor(pieces, dtype=torch.long).reshape(-1, 5)  # (S, 5)
    sizes = plan[:, 2]
    within = torch.arange(offset) - (torch.cumsum(sizes, 0) - sizes).repeat_interleave(sizes)  # (N,) index in piece
    row_of, column, segment, prompt_of = (plan[:, k].repeat_interleave(sizes) for k in (0, 1, 3, 4))
    column = column + within  # (N,) each position's column in the padded batch: its position id there
    source = torch.full((batch, logits_to_keep), -1, dtype=torch.long)
    in_segment = segment >= 0  # a position is scored (has a label) exactly where it is in a segment
    scored_index = torch.arange(offset)[in_segment]
    source[segment[in_segment], within[in_segment]] = scored_index  # token k of row b: here
    # Then on the device: one copy of the plan, two gathers (a few kernels, where a loop over rows launched ~10 a row).
    on_device = torch.cat([row_of, column, segment, prompt_of, source.reshape(-1), scored_index]).to(device)
    row_of, column, segment, prompt_of, source, scored_index = on_device.split(
        [offset] * 4 + [source.numel(), scored_index.numel()]
    )
    labels = input_ids[row_of, column + 1].masked_fill(segment < 0, -100)  # the next column's token; none in a prefix
    return PackedBatch(
        input_ids=input_ids[row_of, column].unsqueeze(0),
        position_ids=column.unsqueeze(0),
        shift_labels=labels.unsqueeze(0),
        source=source.view(batch, logits_to_keep),
        scored_index=scored_index,
        prompts=len(order),
        segment=segment,
        prompt_of=prompt_of,
        mask_dtype=mask_dtype,
    )


@contextlib.contextmanager
def scoring_only(scored: torch.Tensor):
    """Within the block, TRL's fused LM head projects only the packed positions where ``scored`` (N,) is True (on
    devices without Triton TRL's fused forward scores every position, prefix positions too, and zeroes those outputs
    afterwards, so skipping them changes no number). Configures the one `trl_head.HeadPatch`, whose entropy policy
    (`gtpo.forward.untempered`) stays as it is, and yields it."""
    with trl_head.fused_head() as head:
        saved = head.scored
        head.scored = scored
        try:
            yield head
        finally:
            head.scored = saved
