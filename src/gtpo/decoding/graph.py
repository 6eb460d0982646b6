"""Decoding with fixed shapes, for a GPU: a preallocated cache, no row dropped, each step replayed as one CUDA graph.

On a GPU a small model's decoding step is bound by kernel launches, not by the weights' read (docs/performance.md,
"Generation", "On a GPU": the measured step against one read of the weights). A CUDA graph replays the step's
launches as one. A graph needs the same shapes and the same memory at every step, so this path keeps every
row in the batch (an ended row is fed padding, as `generate` does, and its tokens are dropped afterwards), writes
keys and values into a cache of the full length in place (:class:`FixedLayer`), and feeds the step through buffers
it rewrites in place (tokens, positions, the full-width attention mask, the write position). `sampling.decode`
stays the path on a CPU, where dropping ended rows is what saves time.

The write position is the decode loop's, not the cache's: transformers' `StaticLayer` advances its own counter inside
the forward, so the warm-up forward CUDA graphs need before capture advanced it once more than the tokens decoded
and every later token was written one slot past its mask column (the replayed scores of the first attempt, 2f84930,
differed from the eager ones by up to 0.13). Here the loop sets the position before every forward, so running a
step twice (warm-up, then replay) writes the same keys and values to the same slot.

With the counter-based sampler (`counter.counter_choice`) the draw is part of the recorded step: the forward, the
warpers and the draw replay as one graph that returns the tokens, no host work between them. Its noise is keyed on the
draw's index, which the step computes from the write position (the loop's, set before each step) plus an offset set
once a call, for the reason above: a step run twice draws the same token. Other samplers draw after each step.

Every prompt row is prefilled (a group's rows are not shared as `decode` shares them): the prefill is a small part of
a GPU decode. Off a GPU, or with ``use_graph=False``, the same steps run eagerly; the CPU tests hold this path's
tokens to `decode`'s for the same seeds, also through a stand-in that runs each captured step twice
(tests/test_graph_decode.py).
"""

from __future__ import annotations

import functools
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch

from gtpo.decoding.counter import counter_draw, in_step_draw
from gtpo.decoding.sampling import Choose, DecodeStats, left_pad


@functools.cache
def _fixed_layer_class():
    """:class:`FixedLayer`, defined once, on first use (transformers is imported lazily here)."""
    from transformers.cache_utils import StaticLayer

    class FixedLayer(StaticLayer):
        """A `StaticLayer` (keys and values of the full length ``max_cache_len``, written in place) whose write
        position is ``position``, a 0-d tensor the decode loop owns and sets before each forward; ``update`` never
        advances it, so a step run twice writes the same slot. It is also what ``get_seq_length`` returns, which
        transformers' masks read as the query's offset. Keys and values keep their own dtypes (under autocast a
        float32 model's keys leave the rotary embedding in float32 and its values the projection in bfloat16; a
        `StaticLayer` gives both buffers the keys' dtype and refuses the values), as a `DynamicLayer` keeps them."""

        _layer_type = None  # never registered in transformers' layer mappings

        def __init__(self, max_cache_len: int, position: torch.Tensor):
            super().__init__(max_cache_len=max_cache_len)
            self.cumulative_length = position  # StaticLayer's counter, here shared and set from outside

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            self.dtype, self.device = key_states.dtype, key_states.device
            self.batch_size, self.num_heads = key_states.shape[:2]
            self.k_head_dim, self.v_head_dim = key_states.shape[-1], value_states.shape[-1]
            shape = (self.batch_size, self.num_heads, self.max_cache_len)
            self.keys = key_states.new_zeros(shape + (self.k_head_dim,))
            self.values = value_states.new_zeros(shape + (self.v_head_dim,))
            self.is_initialized = True

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            # A decoding step writes one slot, the position itself: a view, no kernel (an arange and an add would be
            # 2 of the ~44 kernels a Qwen2 layer launches per step, and a replayed step is bound by their count).
            if key_states.shape[-2] == 1:
                slots = self.cumulative_length.reshape(1)
            else:
                slots = torch.arange(key_states.shape[-2], device=self.device) + self.cumulative_length
            self.keys.index_copy_(2, slots, key_states)
            self.values.index_copy_(2, slots, value_states)
            return self.keys, self.values

    return FixedLayer


def fixed_cache(model, max_cache_len: int, position: torch.Tensor):
    """A `StaticCache` for ``model`` whose layers are :class:`FixedLayer` writing at ``position``; ValueError where
    the model's static cache has other layer types (sliding windows, linear attention): :func:`supports_fixed_decode`
    says so first."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
    if any(type(layer) is not StaticLayer for layer in cache.layers):
        raise ValueError(f"{type(model).__name__}'s static cache has layers other than full-attention ones")
    layer_class = _fixed_layer_class()
    cache.layers = [layer_class(max_cache_len, position) for _ in cache.layers]
    return cache


def supports_fixed_decode(model) -> str | None:
    """None when :func:`decode_static` can run ``model``, else why not (one line)."""
    try:
        fixed_cache(model, 1, torch.zeros((), dtype=torch.long))
    except (ValueError, TypeError) as error:
        return str(error)
    return None


class CudaGraph:
    """Captures ``forward`` once as a `torch.cuda.CUDAGraph` (after one warm-up run on a side stream, as CUDA graphs
    want) and replays it; the outputs are the graph's static tensors, rewritten by each replay."""

    def __init__(self, forward: Callable[[], torch.Tensor]):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            forward()  # warm-up: writes this step's keys and values, as the replay below writes them again
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.output = forward()

    def __call__(self) -> torch.Tensor:
        self.graph.replay()
        return self.output


# What records a decoding step on each device type (``recorder(forward) -> replay``): a CUDA graph on CUDA, nothing
# (eager steps) elsewhere. The CPU tests put a stand-in here to run the graph path's selection and reuse on a CPU.
RECORDERS: dict[str, Callable] = {"cuda": CudaGraph}


def graph_recorder(device: torch.device) -> Callable | None:
    """The recorder of :data:`RECORDERS` for ``device``'s type, or None where steps run eagerly (a CPU)."""
    return RECORDERS.get(torch.device(device).type)


class _Step:
    """One decoding step with fixed shapes, fed through buffers rewritten in place; from the third step on, run
    through ``recorder(forward)`` (a :class:`CudaGraph` on CUDA) when one is given, else eagerly. With ``draw``
    (float32 logits (B, V) -> tokens (B,)) the step returns the drawn tokens, the draw recorded with the forward;
    without, the logits in float32."""

    def __init__(self, model, cache, mask: torch.Tensor, recorder, draw: Callable | None = None):
        rows, device = mask.shape[0], mask.device
        # The model weakly: the kept steps of :func:`_buffers_for` must not keep their model alive.
        self.model_ref, self.cache, self.mask = weakref.ref(model), cache, mask
        self.tokens = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.recorder, self.recorded, self.calls, self.draw = recorder, None, 0, draw
        self.captures, self.capture_seconds = 0, 0.0  # steps recorded and the seconds that took, since made

    def forward(self) -> torch.Tensor:
        out = self.model_ref()(
            input_ids=self.tokens, attention_mask=self.mask, position_ids=self.positions, past_key_values=self.cache,
            use_cache=True, logits_to_keep=1,
        )  # fmt: skip
        logits = out.logits[:, -1]
        return logits if self.draw is None else self.draw(logits.float())

    def _record(self) -> Callable[[], torch.Tensor]:
        """``recorder(forward)``, timed: on CUDA between two synchronisations, so the seconds are the warm-up step's and
        the capture's, not whatever was queued before."""
        device = self.mask.device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        recorded = self.recorder(self.forward)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self.captures += 1
        self.capture_seconds += time.perf_counter() - start
        return recorded

    def __call__(self) -> torch.Tensor:
        self.calls += 1
        if self.recorder is None or self.calls <= 2:  # two eager steps first (lazy initialisations, kernel choice)
            out = self.forward()
        else:
            if self.recorded is None:
                self.recorded = self._record()
            out = self.recorded()
        return out if self.draw is not None else out.float()


# How many shapes' buffers and captured graphs each model keeps (the least recently used goes first): each holds a
# key/value cache of the full length, so a training run whose padded prompt length changes from batch to batch keeps
# only the last few.
KEPT_SHAPES = 2
_kept: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> OrderedDict(key -> _Buffers)


class _Buffers:
    """What one shape's decoding reuses from call to call: the cache of the full length, its write position, the
    full-width mask and the step (with its recorded graph, which reads exactly these tensors). With ``transforms``
    (the processors then the counter sampler's warpers, :func:`in_step_draw`) the step also draws, from the rows'
    seeds and the draw's index offset, buffers set at each call."""

    def __init__(self, model, batch: int, width: int, device: torch.device, recorder, transforms=None, key_rows=False):
        self.position = torch.zeros((), dtype=torch.long, device=device)  # where the next keys and values are written
        self.cache = fixed_cache(model, width, self.position)
        self.mask = torch.zeros(batch, width, dtype=torch.long, device=device)  # full width: shapes never change
        self.draws = transforms is not None
        if self.draws:
            self.transforms = tuple(transforms)
            self.seeds = torch.zeros(batch, dtype=torch.long, device=device)  # each row's seed (the sampler's)
            self.row_keys = torch.arange(batch, device=device) if key_rows else 0  # every row kept: its index
            self.offset = torch.zeros((), dtype=torch.long, device=device)  # a step's draw index - its write position
        self.step = _Step(model, self.cache, self.mask, recorder, self.step_draw if self.draws else None)

    def draw_at(self, logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """The tokens (B,) the counter sampler draws from ``logits`` (B, V) float32 at draw ``index`` (0-d)."""
        return counter_draw(logits, self.seeds, self.row_keys, index, self.transforms)

    def step_draw(self, logits: torch.Tensor) -> torch.Tensor:
        """The recorded step's draw: the token after the one the step feeds, at its write position plus the offset.
        From the position, not a counter the step advances: a step run twice (warm-up, replay) draws the same."""
        return self.draw_at(logits, self.position + self.offset)

    def reset(self) -> None:
        """Back to the state of fresh buffers (zeros), in place: a recorded graph keeps reading the same memory."""
        self.position.zero_()
        self.mask.zero_()
        for layer in self.cache.layers:
            if layer.is_initialized:
                layer.keys.zero_()
                layer.values.zero_()


def _reuse_key(model, batch: int, length: int, width: int, recorder, draw_key=None) -> tuple:
    """What a kept graph depends on: the shapes, the recorder, autocast, the memory of every weight and buffer it
    reads (a graph replays reads of fixed addresses: `sampling.merged_lora` gives merged weights new tensors, so
    a LoRA policy's graph is kept only while its merged weights land at the same addresses), and the draw it records
    (:func:`in_step_draw`'s key; None: none)."""
    tensors = [*model.parameters(), *model.buffers()]
    weights = tuple((t.data_ptr(), t.dtype) for t in tensors)
    return (batch, length, width, recorder, torch.is_autocast_enabled(), weights, draw_key)


def _buffers_for(
    model, batch: int, length: int, width: int, device: torch.device, recorder, draw_key=None, transforms=None
) -> _Buffers:
    """The kept buffers (and graph) of this shape and draw, reset, or new ones (kept when a recorder is given: eager
    steps have nothing worth keeping). ``draw_key``/``transforms``: :func:`in_step_draw`'s key and what it applies."""
    key_rows = bool(draw_key and draw_key[0])
    if recorder is None:
        return _Buffers(model, batch, width, device, None, transforms, key_rows)
    kept = _kept.setdefault(model, OrderedDict())
    key = _reuse_key(model, batch, length, width, recorder, draw_key)
    if key in kept:
        kept.move_to_end(key)
        buffers = kept[key]
        buffers.reset()
        return buffers
    buffers = _Buffers(model, batch, width, device, recorder, transforms, key_rows)
    kept[key] = buffers
    while len(kept) > KEPT_SHAPES:
        kept.popitem(last=False)
    return buffers


def forget_graphs(model) -> None:
    """Drop the buffers and graphs kept for ``model`` (their memory is freed once nothing else holds them)."""
    _kept.pop(model, None)


# Where steps are replayed, how often the loop asks whether every row has ended (a copy to the host that waits for
# the device): up to END_CHECK_EVERY - 1 steps run after the last row ended, fed padding, and change no completion.
END_CHECK_EVERY = 8


def until_eos(tokens: list[int], eos_token_ids: Sequence[int]) -> list[int]:
    """A row's completion: its tokens up to and including the first EOS, or all of them (the row never ended; the
    padding an ended row is fed comes after its EOS and is cut)."""
    eos = set(eos_token_ids)
    end = next((i for i, token in enumerate(tokens) if token in eos), None)
    return tokens if end is None else tokens[: end + 1]


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
    recorder: Callable | None = None,
) -> list[list[int]]:
    """`sampling.decode`'s contract (same arguments, same completions for the same draws) with fixed shapes.

    Args:
        model, prompts, choose, max_new_tokens, eos_token_ids, pad_token_id, processors, pad_to_multiple_of, stats:
            as `gtpo.decoding.sampling.decode`.
        use_graph: record each step from the third on with the device's recorder (:func:`graph_recorder`: a
            :class:`CudaGraph` on CUDA, none on a CPU) and replay it; False: every step eager.
        recorder: what records a step (``recorder(forward) -> replay``) in place of the device's, on any device
            (the CPU tests pass a stand-in that runs the step twice, as warm-up and capture do). A recorded step is
            kept with its buffers for the next call of the same shape (batch, padded prompt length, width) on the
            same weights, which replays it from its first step without recording anew (:data:`KEPT_SHAPES` shapes
            a model). With a recorder the loop asks whether every row has ended every :data:`END_CHECK_EVERY`
            steps, not every step (the same completions; the extra steps are fed padding).

    With ``choose`` a `counter.CounterChoice` and processors and warpers that read the scores alone
    (:func:`in_step_draw`), each step draws its next token inside the recorded step (replayed, it returns the
    tokens), keyed as the sampler keys it: the t-th token of every row at the sampler's step + t, whose counter is
    advanced by the draws made when the call returns. ``stats`` also counts the steps recorded in this call and the
    seconds that took (``captures``, ``capture_seconds``).

    Returns:
        B lists of token ids, each up to and including its first EOS, or ``max_new_tokens`` tokens.
    """
    device = next(model.parameters()).device
    batch = len(prompts)
    if batch == 0:
        return []
    ids, prompt_mask = left_pad(prompts, pad_token_id, pad_to_multiple_of)
    ids, prompt_mask = ids.to(device), prompt_mask.to(device)
    length = ids.shape[1]
    width = length + max_new_tokens
    if not use_graph:
        recorder = None
    elif recorder is None:
        recorder = graph_recorder(device)
    draw_key = in_step_draw(choose, processors)
    transforms = None if draw_key is None else (*(processors or ()), *choose.warpers)
    buffers = _buffers_for(model, batch, length, width, device, recorder, draw_key, transforms)
    position, cache, mask, step = buffers.position, buffers.cache, buffers.mask, buffers.step
    captures, capture_seconds = step.captures, step.capture_seconds
    if buffers.draws:  # the sampler's seeds and counter, copied where the recorded draw reads them (on the device)
        choose.to(device)
        buffers.seeds.copy_(choose.seeds[:batch])
        # The step that writes position length + t draws token t + 1, at index start + t + 1 (start: the counter now).
        buffers.offset.copy_(choose.step - (length - 1))
    mask[:, :length] = prompt_mask
    positions = (prompt_mask.cumsum(-1) - 1).masked_fill(prompt_mask == 0, 0)  # `generate`'s under left padding
    out = model(
        input_ids=ids, attention_mask=prompt_mask, position_ids=positions, past_key_values=cache, use_cache=True,
        logits_to_keep=1,
    )  # fmt: skip
    logits = out.logits[:, -1].float()
    step.positions[:, 0] = positions[:, -1]
    # Every row stays in the batch, so the rows' indices never change: kept on the host, where a sampler that reads
    # them (`rows.tolist()`) does not wait for the device.
    rows = torch.arange(batch)
    eos = torch.tensor(list(eos_token_ids), device=device, dtype=torch.long)
    sequences = ids
    # The tokens stay on the device until the loop ends (one copy to the host, not one a step), and where steps are
    # replayed the end of every row is looked at every END_CHECK_EVERY steps only: each look waits for the device.
    generated = torch.full((batch, max_new_tokens), int(pad_token_id), dtype=torch.long, device=device)
    check_every = END_CHECK_EVERY if recorder is not None else 1
    ended = torch.zeros(batch, dtype=torch.bool, device=device)
    steps = 0
    drawn = None  # the tokens the last step drew inside itself (the counter sampler)
    for t in range(max_new_tokens):
        if drawn is not None:
            tokens = drawn
        elif buffers.draws:  # the first token, from the prefill's logits, at the sampler's counter
            tokens = buffers.draw_at(logits, choose.step)
        else:
            scores = processors(sequences, logits) if processors else logits
            tokens = choose(scores, rows)
        tokens = tokens.masked_fill(ended, int(pad_token_id))  # (B,) an ended row is fed padding
        generated[:, t] = tokens
        steps += 1
        ended = ended | torch.isin(tokens, eos)
        if t == max_new_tokens - 1 or (steps % check_every == 0 and bool(ended.all())):
            break
        if processors and not buffers.draws:  # only processors read the tokens so far (not the graph-safe ones)
            sequences = torch.cat([sequences, tokens[:, None]], dim=1)
        # The step's inputs, written in place before it runs (a replayed graph reads these very tensors).
        step.tokens.copy_(tokens[:, None])
        step.positions.add_(1)
        position.fill_(length + t)
        mask[:, length + t] = 1
        if buffers.draws:
            drawn = step()
        else:
            logits = step()
    if buffers.draws:
        choose.step.add_(steps)  # the draws made, as many calls of the sampler would have advanced it
    completions = [until_eos(row, eos_token_ids) for row in generated[:, :steps].tolist()]
    if stats is not None:
        longest = max(len(c) for c in completions)
        stats.add(
            DecodeStats(
                prefill_rows=batch, prompt_rows=batch, row_steps=steps * batch,
                useful_row_steps=sum(len(c) for c in completions), generate_row_steps=longest * batch,
                captures=step.captures - captures, capture_seconds=step.capture_seconds - capture_seconds,
            )
        )  # fmt: skip
    return completions
