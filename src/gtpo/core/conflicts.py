"""How `gtpo.core.conflict_spans` finds conflict positions fast: pairwise compare or sort, chunked.

A conflict (Sec. 5.1) is a token that appears at the same aligned position in a completion with A>0
and in one with A<0 of the same group. `gtpo.core.conflict_spans` encodes each position as a key;
this module answers "does the partner key occur at this position in another row of the group?" with
no step depending on the vocabulary size. docs/core.md, "Conflict detection", has the measurements.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["aligned_conflicts"]

# Work bound: bytes of the largest temporary per chunk. On CPU 1 MiB stays in cache (about 2x faster
# than 64 MiB on a batch of 64 groups of 12x1500, benchmarks/bench_conflict.py); on accelerators larger
# chunks mean fewer kernel launches.
_SPAN_CHUNK_BYTES = {"cpu": 1 << 20}
_SPAN_CHUNK_BYTES_DEFAULT = 1 << 26
# Up to this group size conflicts are found by comparing all pairs of rows (O(G²) per position, fully
# vectorized); above it by sorting each position's G keys (O(G log G)). Measured crossover: between
# G=32 (pairs 2x faster) and G=64 (sorting up to 1.3x faster), benchmarks/bench_conflict.py.
PAIRWISE_MAX_GROUP = 32


def aligned_conflicts(keys: Tensor, group_size: int) -> Tensor:
    """Conflict flags for keys aligned across the rows of each group.

    ``keys`` encodes, per row and aligned position, token v of a completion with A>0 as 2v, with A<0
    as 2v+1, and anything that takes no part (A=0, padding) as -1. Position p of row i is a conflict
    iff its *partner* key (2v <-> 2v+1, i.e. key XOR 1) occurs at p in another row of the group: then v
    appears there in both a positive and a negative completion (Sec. 5.1). Key -1 looks for -2, which
    never occurs. No step depends on the vocabulary size.

    Args:
        keys: (N, T') int64 keys, N a multiple of group_size.

    Returns:
        (N, T') bool conflict flags.

    >>> aligned_conflicts(torch.tensor([[10, 6], [11, -1]]), 2).tolist()  # token 5 in A>0 and A<0 rows
    [[True, False], [True, False]]
    """
    budget = _SPAN_CHUNK_BYTES.get(keys.device.type, _SPAN_CHUNK_BYTES_DEFAULT)
    if group_size <= PAIRWISE_MAX_GROUP:
        return _partners_by_pairs(keys, group_size, budget)  # (N, T')
    return _partners_by_sorting(keys, group_size, budget)  # (N, T')


def _partners_by_pairs(keys: Tensor, g: int, budget: int) -> Tensor:
    """Compare every row's partner key with every row's key at the same position: O(G²·T')."""
    n_rows, width = keys.shape
    k = keys.view(n_rows // g, g, width)  # (n_groups, G, T')
    partner = k ^ 1  # (n_groups, G, T')
    hits = torch.empty(k.shape, dtype=torch.bool, device=keys.device)  # (n_groups, G, T')
    step = max(1, budget // max(1, k.shape[0] * g * g))  # positions per chunk of the (.., G, G, t) compare
    if step >= width:  # one chunk: no copy into a result buffer
        return (partner[:, :, None] == k[:, None]).any(dim=2).view(n_rows, width)  # (N, T')
    for s in range(0, width, step):
        same = partner[:, :, None, s : s + step] == k[:, None, :, s : s + step]  # (n_groups, G, G, t)
        hits[:, :, s : s + step] = same.any(dim=2)  # (n_groups, G, t)
    return hits.view(n_rows, width)  # (N, T')


def _partners_by_sorting(keys: Tensor, g: int, budget: int) -> Tensor:
    """Sort each (group, position) column of G keys and binary-search the partners: O(G log G·T')."""
    n_rows, width = keys.shape
    cols = keys.view(n_rows // g, g, width).transpose(1, 2).contiguous().view(-1, g)  # (n_groups·T', G)
    hits = torch.empty(cols.shape, dtype=torch.bool, device=keys.device)  # (n_groups·T', G)
    step = max(1, budget // (8 * g))  # columns per chunk of int64 temporaries
    for s in range(0, cols.shape[0], step):
        col = cols[s : s + step]  # (c, G)
        ordered = col.sort(dim=-1).values  # (c, G)
        partner = col ^ 1  # (c, G)
        at = torch.searchsorted(ordered, partner).clamp_(max=g - 1)  # (c, G)
        hits[s : s + step] = ordered.gather(-1, at) == partner  # (c, G)
    return hits.view(n_rows // g, width, g).transpose(1, 2).reshape(n_rows, width)  # (N, T')
