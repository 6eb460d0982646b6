"""Decoding with fixed shapes, for a GPU: a static cache, no row dropped, each step replayed as one CUDA graph.

On a GPU a small model's decoding step is bound by kernel launches, not by the weights' read (issue 39: about 19 ms a
token step for Qwen2.5-1.5B's config at 8 and 64 rows, 19 times one read of its weights). A CUDA graph replays the
step's launches as one. A graph needs the same shapes at every step, so this path keeps every row in the batch (an
ended row is fed padding, as `generate` does, and its tokens are dropped afterwards) and uses transformers'
`StaticCache` (keys and values of the full capacity, written in place at ``cache_position``) with an attention mask
of the full width. `gtpo.sampling.decode` stays the path on a CPU, where dropping ended rows is what saves time.

Every prompt row is prefilled (a group's rows are not shared as `decode` shares them): the prefill is a small part of
a GPU decode. Off a GPU, or with ``use_graph=False``, the same steps run eagerly; the CPU tests hold this path's
tokens to `decode`'s for the same seeds (tests/test_graph_decode.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gtpo.sampling import Choose, DecodeStats, left_pad


class _Step:
    """One decoding step with fixed shapes; on CUDA captured once and replayed (`torch.cuda.CUDAGraph`)."""

    def __init__(self, model, cache, rows: int, width: int, device, use_graph: bool):
        self.model, self.cache = model, cache
        self.tokens = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.cache_position = torch.zeros(1, dtype=torch.long, device=device)
        self.mask = torch.zeros(rows, width, dtype=torch.long, device=device)
        self.graph, self.logits = None, None
        self.use_graph = use_graph and device.type == "cuda"
        self.calls = 0

    def _forward(self):
        out = self.model(
            input_ids=self.tokens, attention_mask=self.mask, position_ids=self.positions,
            past_key_values=self.cache, use_cache=True, cache_position=self.cache_position,
        )  # fmt: skip
        return out.logits[:, -1]

    def __call__(self) -> torch.Tensor:
        self.calls += 1
        if not self.use_graph:
            return self._forward().float()
        if self.graph is None and self.calls > 2:  # captured after two eager steps (warm-up, as CUDA graphs want)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self._forward()
            torch.cuda.current_stream().wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.logits = self._forward()
        if self.graph is None:
            return self._forward().float()
        self.graph.replay()
        return self.logits.float()


@torch.no_grad()
def decode_static(
    model,
    prompts: Sequence[Sequence[int]],
    choose: Choose,
    max_new_tokens: int,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    processors=None,
    pad_to_multiple_of: int | None = None,
    stats: DecodeStats | None = None,
    use_graph: bool = True,
) -> list[list[int]]:
    """`gtpo.sampling.decode`'s contract (same arguments, same completions for the same draws) with fixed shapes.

    Args:
        model, prompts, choose, max_new_tokens, eos_token_ids, pad_token_id, processors, pad_to_multiple_of, stats:
            as `gtpo.sampling.decode`.
        use_graph: on CUDA, replay each step as a CUDA graph (captured at the third step); elsewhere ignored.

    Returns:
        B lists of token ids, each up to and including its first EOS, or ``max_new_tokens`` tokens.
    """
    from transformers import StaticCache

    device = next(model.parameters()).device
    batch = len(prompts)
    if batch == 0:
        return []
    ids, mask = left_pad(prompts, pad_token_id, pad_to_multiple_of)
    ids, mask = ids.to(device), mask.to(device)
    length = ids.shape[1]
    width = length + max_new_tokens
    cache = StaticCache(config=model.config, max_cache_len=width)
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)  # `generate`'s position ids under left padding
    step = _Step(model, cache, batch, width, device, use_graph)
    step.mask[:, :length] = mask
    out = model(
        input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True,
        cache_position=torch.arange(length, device=device), logits_to_keep=1,
    )  # fmt: skip
    logits = out.logits[:, -1].float()
    step.positions[:, 0] = positions[:, -1]
    rows = torch.arange(batch, device=device)
    eos = torch.tensor(list(eos_token_ids), device=device, dtype=torch.long)
    sequences = ids
    completions: list[list[int]] = [[] for _ in range(batch)]
    ended = torch.zeros(batch, dtype=torch.bool, device=device)
    steps = 0
    for t in range(max_new_tokens):
        scores = processors(sequences, logits) if processors else logits
        tokens = choose(scores, rows).masked_fill(ended, int(pad_token_id))  # (B,) an ended row is fed padding
        steps += 1
        for r, token, done in zip(range(batch), tokens.tolist(), ended.tolist(), strict=True):
            if not done:
                completions[r].append(token)
        ended = ended | torch.isin(tokens, eos)
        if t == max_new_tokens - 1 or bool(ended.all()):
            break
        sequences = torch.cat([sequences, tokens[:, None]], dim=1)
        step.tokens.copy_(tokens[:, None])  # the graph's inputs are written in place
        step.positions.add_(1)
        step.cache_position.fill_(length + t)
        step.mask[:, length + t] = 1
        logits = step()
    if stats is not None:
        longest = max(len(c) for c in completions)
        stats.add(
            DecodeStats(
                prefill_rows=batch, prompt_rows=batch, row_steps=steps * batch,
                useful_row_steps=sum(len(c) for c in completions), generate_row_steps=longest * batch,
            )
        )  # fmt: skip
    return completions
