"""gtpo.decoding.graph.decode_static (fixed shapes for CUDA graphs) draws the tokens
`gtpo.decoding.sampling.decode` draws.

Per-row seeds (`per_row_choice`): a row's tokens do not depend on the other rows, so the static path (every row kept,
a full-width mask, transformers' StaticCache) must give exactly `decode`'s completions, ended rows dropped or not.
`multinomial_choice` draws on one global generator for the rows in the batch, so the static path equals `decode`
with ``drop_finished=False`` (generate's behaviour, every row kept). On the tiny model, float32, CPU; the CUDA
graph itself is checked on a GPU (gpu-marked test, scripts/gpu_checks.sh); on the CPU a stand-in recorder runs each
recorded step twice, as the CUDA graph's warm-up and replay do, and the tokens must not change.

Issue 47: a recorded step is kept for the next call of the same shape (nothing captured anew, the same bits) and
not for other shapes or weights at new addresses; registering the stand-in as the CPU's recorder
(`gtpo.decoding.graph.RECORDERS`) runs the selection of training (`generation_plan`) and of `gtpo eval`'s backend on
a CPU, whose tokens must equal the eager paths'.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper

from gtpo.decoding.graph import decode_static, supports_fixed_decode
from gtpo.decoding.sampling import DecodeStats, decode, left_pad, multinomial_choice, per_row_choice
from gtpo.models import load_model, load_tokenizer


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_path):
    return load_model(tiny_model_path).eval(), load_tokenizer(tiny_model_path)


def _prompts(tokenizer):
    # two groups of four rows, prompts of different lengths (left padding), as a GRPO step or an evaluation batch
    short, long = (tokenizer(t)["input_ids"] for t in ("What is 3 + 4?", "Hello there, what is seventeen plus twenty?"))
    return [short] * 4 + [long] * 4


@pytest.mark.parametrize("warped", [False, True], ids=["plain", "temperature-top-k"])
def test_static_path_draws_decodes_tokens_with_per_row_seeds(model_and_tokenizer, warped):
    model, tokenizer = model_and_tokenizer
    prompts, seeds = _prompts(tokenizer), list(range(8))
    warpers = [TemperatureLogitsWarper(0.7), TopKLogitsWarper(50)] if warped else []
    common = (32, [tokenizer.eos_token_id], tokenizer.pad_token_id)
    expected = decode(model, prompts, per_row_choice(seeds, warpers), *common)
    got = decode_static(model, prompts, per_row_choice(seeds, warpers), *common)
    assert got == expected
    assert any(len(c) < 32 for c in expected) and any(len(c) == 32 for c in expected)  # rows end at different steps


def test_static_path_with_the_global_generator_equals_decode_keeping_every_row(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    prompts = _prompts(tokenizer)
    processors = LogitsProcessorList([TemperatureLogitsWarper(0.9)])
    common = (24, [tokenizer.eos_token_id], tokenizer.pad_token_id)
    torch.manual_seed(3)
    expected = decode(model, prompts, multinomial_choice(True), *common, processors=processors, drop_finished=False)
    torch.manual_seed(3)
    stats = DecodeStats()
    got = decode_static(model, prompts, multinomial_choice(True), *common, processors=processors, stats=stats)
    assert got == expected
    assert stats.prefill_rows == 8 and stats.useful_row_steps == sum(len(c) for c in got)


class RunTwice:
    """Stands in for `gtpo.decoding.graph.CudaGraph` on a CPU: at capture it runs the step once (the warm-up on the side
    stream) and at every replay runs it again, so each recorded step computes twice, as warm-up + replay does on a
    GPU. The first attempt (2f84930) let transformers' StaticLayer advance its write position inside the step, so the
    extra run shifted every later token's keys one slot past its mask column."""

    replays = 0

    def __init__(self, forward):
        forward()
        self.forward = forward

    def __call__(self):
        RunTwice.replays += 1
        return self.forward()


def _recording(seeds, seen):
    choose = per_row_choice(seeds)

    def wrapped(scores, rows):
        seen.append(scores.clone())
        return choose(scores, rows)

    return wrapped


def test_a_completion_is_cut_after_its_first_eos_by_hand():
    from gtpo.decoding.graph import until_eos

    assert until_eos([5, 2, 0, 0], [2]) == [5, 2]
    assert until_eos([5, 6, 9], [2]) == [5, 6, 9]  # never ended: every token
    assert until_eos([2, 2], [2]) == [2]
    assert until_eos([4, 3, 7, 7], [7, 3]) == [4, 3]  # the first of any EOS id
    assert until_eos([4, 0, 0], [0]) == [4, 0]  # padding that is also the EOS id


def test_replayed_steps_look_at_the_rows_end_every_few_steps_and_keep_the_completions(model_and_tokenizer):
    """Issue 47 (the host syncs of a replayed step): where steps are replayed, the loop asks the device whether every
    row has ended only every END_CHECK_EVERY steps, and copies the tokens to the host once. Every row is made to end
    at step 5: the eager path stops there, the replayed one at step 8, fed padding; the completions are the same."""
    import gtpo.decoding.graph as graph_decode

    model, tokenizer = model_and_tokenizer
    graph_decode.forget_graphs(model)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    prompts, seeds = _prompts(tokenizer), list(range(8))

    def ending_at_step_5(calls):
        choose = per_row_choice(seeds)

        def wrapped(scores, rows):
            calls.append(len(rows))
            tokens = choose(scores, rows)
            return torch.full_like(tokens, eos) if len(calls) == 5 else tokens

        return wrapped

    eager_calls, replay_calls = [], []
    eager = decode_static(model, prompts, ending_at_step_5(eager_calls), 32, [eos], pad, use_graph=False)
    stats = DecodeStats()
    got = decode_static(model, prompts, ending_at_step_5(replay_calls), 32, [eos], pad, recorder=RunTwice, stats=stats)
    assert got == eager and all(1 <= len(c) <= 5 and c[-1] == eos for c in got)
    assert len(eager_calls) == 5 and len(replay_calls) == graph_decode.END_CHECK_EVERY == 8
    assert stats.row_steps == 8 * len(prompts) and stats.useful_row_steps == sum(len(c) for c in got)
    graph_decode.forget_graphs(model)


def test_a_step_run_twice_as_warm_up_and_replay_computes_the_same_scores(model_and_tokenizer):
    """Every step's scores equal the eager fixed-shape path's bit for bit, and the tokens `decode`'s. Scores, not only
    tokens: with the first attempt's cache the tokens of this test still matched (the tiny model's scores moved by up
    to 0.13, not enough to flip a draw in 32 steps), while the scores differed from the fourth step on."""
    model, tokenizer = model_and_tokenizer
    prompts, seeds = _prompts(tokenizer), list(range(8))
    common = (32, [tokenizer.eos_token_id], tokenizer.pad_token_id)
    eager_scores, twice_scores = [], []
    eager = decode_static(model, prompts, _recording(seeds, eager_scores), *common)
    RunTwice.replays = 0
    twice = decode_static(model, prompts, _recording(seeds, twice_scores), *common, recorder=RunTwice)
    assert RunTwice.replays >= 20  # the recorded path ran (steps 3 onwards), not only the eager first two
    assert len(twice_scores) == len(eager_scores) >= 21
    for step, (a, b) in enumerate(zip(twice_scores, eager_scores, strict=True)):
        assert torch.equal(a, b), f"step {step + 1}: scores differ by {float((a - b).abs().max())}"
    assert twice == eager == decode(model, prompts, per_row_choice(seeds), *common)


def test_under_bf16_autocast_the_fixed_cache_keeps_float32_keys_and_bf16_values(model_and_tokenizer):
    """Under autocast a float32 model's keys leave the rotary embedding in float32 and its values the projection in
    bfloat16 (transformers' StaticLayer gives both buffers the keys' dtype and index_copy_ refuses the values): the
    fixed cache keeps each in its own dtype, as `decode`'s dynamic cache does, and draws `decode`'s tokens."""
    model, tokenizer = model_and_tokenizer
    prompts, seeds = _prompts(tokenizer), list(range(8))
    common = (24, [tokenizer.eos_token_id], tokenizer.pad_token_id)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = decode(model, prompts, per_row_choice(seeds), *common)
        got = decode_static(model, prompts, per_row_choice(seeds), *common, recorder=RunTwice)
    assert got == expected


def test_models_with_sliding_window_layers_are_refused_in_one_line():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, use_sliding_window=True, sliding_window=4, max_window_layers=1,
    )  # fmt: skip
    assert "sliding_attention" in config.layer_types  # the model this test means: one sliding-window layer
    why = supports_fixed_decode(Qwen2ForCausalLM(config))
    assert why == "Qwen2ForCausalLM's static cache has layers other than full-attention ones"


def test_the_tiny_model_is_supported(model_and_tokenizer):
    assert supports_fixed_decode(model_and_tokenizer[0]) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_replay_computes_the_eager_static_step(tiny_model_path):
    """On CUDA the captured graph replays the step the eager static path runs: each step's scores agree with the
    eager ones up to kernel rounding (the capture can pick another attention kernel) until the first differing token,
    and tokens differ only where rounding flips a near-tie (most are equal)."""
    model = load_model(tiny_model_path).to("cuda").eval()
    tokenizer = load_tokenizer(tiny_model_path)
    prompts, seeds = _prompts(tokenizer), list(range(8))
    common = (40, [tokenizer.eos_token_id], tokenizer.pad_token_id)

    def recording(seen):
        choose = per_row_choice(seeds, device="cuda")

        def wrapped(scores, rows):
            seen.append(scores.clone())
            return choose(scores, rows)

        return wrapped

    eager_scores, graph_scores = [], []
    eager = decode_static(model, prompts, recording(eager_scores), *common, use_graph=False)
    graph = decode_static(model, prompts, recording(graph_scores), *common, use_graph=True)

    def tokens_at(k):
        return [(e[k:k + 1], g[k:k + 1]) for e, g in zip(eager, graph, strict=True)]  # fmt: skip

    steps = range(min(len(eager_scores), len(graph_scores)))
    first_diff = next((k for k in steps if any(a != b for a, b in tokens_at(k))), None)
    last = len(eager_scores) if first_diff is None else first_diff + 1
    for k in range(min(last, len(graph_scores))):
        torch.testing.assert_close(graph_scores[k], eager_scores[k], rtol=1e-3, atol=1e-3)
    same = sum(a == b for e, g in zip(eager, graph, strict=True) for a, b in zip(e, g, strict=False))
    assert same >= 0.9 * sum(len(e) for e in eager)


def _train_two_steps(tmp_path, tiny_model_path, device_kwargs):
    from gtpo import GTPOConfig, GTPOTrainer
    from trainer_helpers import make_dataset, table_reward

    args = GTPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4, max_completion_length=12,
        max_steps=2, report_to=[], logging_steps=1, save_strategy="no", seed=0, disable_tqdm=True,
        initial_entropy=1.0, cuda_graph_generation=True, **device_kwargs,
    )  # fmt: skip
    trainer = GTPOTrainer(model=tiny_model_path, reward_funcs=table_reward, args=args, train_dataset=make_dataset())
    trainer.train()
    return trainer


def test_cuda_graph_generation_is_ignored_off_cuda(tmp_path, tiny_model_path, monkeypatch):
    """cuda_graph_generation=True on a CPU: training generates through `decode` (dropping ended rows), never the
    static path."""
    import gtpo.trainer.generation as generation

    monkeypatch.setattr(generation, "decode_static", lambda *a, **k: pytest.fail("the static path ran on a CPU"))
    trainer = _train_two_steps(tmp_path, tiny_model_path, dict(use_cpu=True, bf16=False))
    assert trainer.state.global_step == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_generation_trains_on_cuda(tmp_path, tiny_model_path, monkeypatch):
    """cuda_graph_generation=True on CUDA: generation goes through the static, graph-replayed path; training runs."""
    import gtpo.trainer.generation as generation

    calls = []
    real = generation.decode_static

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(generation, "decode_static", counting)
    trainer = _train_two_steps(tmp_path, tiny_model_path, dict(bf16=True))
    assert trainer.state.global_step == 2 and len(calls) >= 2


class CountingRunTwice(RunTwice):
    """:class:`RunTwice` that counts its captures (one per recorded step object)."""

    captures = 0

    def __init__(self, forward):
        CountingRunTwice.captures += 1
        super().__init__(forward)


def test_a_recorded_step_is_kept_for_the_next_call_of_the_same_shape(model_and_tokenizer):
    """Issue 47: a second call of the same shape captures nothing new, a different shape captures anew, and every
    call's tokens and scores equal the eager fixed-shape path's bit for bit (the kept cache is reset in place)."""
    import gtpo.decoding.graph as graph_decode

    model, tokenizer = model_and_tokenizer
    graph_decode.forget_graphs(model)
    prompts, seeds = _prompts(tokenizer), list(range(8))
    common = (32, [tokenizer.eos_token_id], tokenizer.pad_token_id)
    eager_scores = []
    eager = decode_static(model, prompts, _recording(seeds, eager_scores), *common, use_graph=False)
    CountingRunTwice.captures = 0
    for call in range(3):  # same prompts, fresh per-row generators: the same draws each call
        scores = []
        got = decode_static(model, prompts, _recording(seeds, scores), *common, recorder=CountingRunTwice)
        assert got == eager, f"call {call + 1}"
        assert all(torch.equal(a, b) for a, b in zip(scores, eager_scores, strict=True))
        assert CountingRunTwice.captures == 1, f"call {call + 1} captured anew"
    other = prompts[:4]  # another batch size: another shape
    got = decode_static(model, other, per_row_choice(seeds[:4]), *common, recorder=CountingRunTwice)
    assert CountingRunTwice.captures == 2
    assert got == decode_static(model, other, per_row_choice(seeds[:4]), *common, use_graph=False)
    graph_decode.forget_graphs(model)


def test_kept_graphs_follow_new_weights_at_new_addresses(model_and_tokenizer):
    """A graph replays reads of fixed addresses: weights given new tensors (as `merged_lora` gives them) must not be
    read through the old graph. The next call captures anew and computes with the new weights."""
    import gtpo.decoding.graph as graph_decode

    model, tokenizer = model_and_tokenizer
    graph_decode.forget_graphs(model)
    prompts, seeds = _prompts(tokenizer), list(range(8))
    common = (16, [tokenizer.eos_token_id], tokenizer.pad_token_id)
    CountingRunTwice.captures = 0
    decode_static(model, prompts, per_row_choice(seeds), *common, recorder=CountingRunTwice)
    weight = model.lm_head.weight
    original = weight.data
    try:
        with torch.no_grad():
            weight.data = original * 1.5  # a new tensor, as merged_lora makes
        got = decode_static(model, prompts, per_row_choice(seeds), *common, recorder=CountingRunTwice)
        assert CountingRunTwice.captures == 2
        assert got == decode_static(model, prompts, per_row_choice(seeds), *common, use_graph=False)
    finally:
        weight.data = original
        graph_decode.forget_graphs(model)


def test_the_device_seam_selects_the_recorded_path_in_training(tmp_path, tiny_model_path, monkeypatch):
    """`generation_plan` on a CPU with a recorder registered for it (as CUDA has one): training generates through
    `decode_static` with that recorder; cuda_graph_generation=False, or no recorder for the device, keeps `decode`.
    Also the draws: the recorded path's completions equal the eager fixed-shape path's under the same seed."""
    import gtpo.decoding.graph as graph_decode
    import gtpo.trainer.generation as generation

    sys_path_helpers()
    from gtpo import GTPOConfig, GTPOTrainer
    from trainer_helpers import make_dataset, table_reward

    args = GTPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4, max_completion_length=12,
        max_steps=1, report_to=[], save_strategy="no", seed=0, disable_tqdm=True, initial_entropy=1.0, use_cpu=True,
        bf16=False,
    )  # fmt: skip
    assert args.cuda_graph_generation is True  # on by default
    trainer = GTPOTrainer(model=tiny_model_path, reward_funcs=table_reward, args=args, train_dataset=make_dataset())
    assert generation.generation_plan(trainer).recorder is None  # a CPU records nothing
    monkeypatch.setitem(graph_decode.RECORDERS, "cpu", CountingRunTwice)
    assert generation.generation_plan(trainer).recorder is CountingRunTwice
    trainer.args.cuda_graph_generation = False
    assert generation.generation_plan(trainer).recorder is None
    trainer.args.cuda_graph_generation = True

    tokenizer = trainer.processing_class
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 3 + 4?"}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    calls = []
    real = generation.decode_static
    monkeypatch.setattr(generation, "decode_static", lambda *a, **k: calls.append(k.get("recorder")) or real(*a, **k))
    torch.manual_seed(5)
    recorded, _ = trainer._generate_single_turn([prompt] * 4, None, {}, 4)
    assert calls == [CountingRunTwice]
    monkeypatch.delitem(graph_decode.RECORDERS, "cpu")
    torch.manual_seed(5)
    model, multiple = trainer.accelerator.unwrap_model(trainer.model), trainer.pad_to_multiple_of
    with torch.no_grad():
        eager = real(
            model, [prompt] * 4, multinomial_choice(True), 12, trainer.eos_token_ids, tokenizer.pad_token_id,
            processors=generation.processors_for(
                model, trainer.generation_config, *left_pad([prompt] * 4, tokenizer.pad_token_id, multiple)
            )[1],
            pad_to_multiple_of=multiple, use_graph=False,
        )  # fmt: skip
    assert recorded == eager


def sys_path_helpers():
    import sys
    from pathlib import Path

    path = str(Path(__file__).parent / "scripts")
    if path not in sys.path:
        sys.path.insert(0, path)


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_evaluation_with_per_row_seeds_gives_the_same_tokens_with_and_without_graphs(
    monkeypatch, temperature, shared_data
):
    """`gtpo eval`'s transformers backend with the graph path (on the CPU stand-in recorder) gives every row the
    tokens of the eager `decode` path for the same per-row seeds; a model's kept graph serves the second batch."""
    import gtpo.decoding.graph as graph_decode
    from gtpo.eval.backends import SamplingSettings, TransformersBackend

    plain = TransformersBackend("tiny")
    assert plain.recorder is None  # a CPU: eager `decode`
    monkeypatch.setitem(graph_decode.RECORDERS, "cpu", CountingRunTwice)
    graphs = TransformersBackend("tiny")
    assert graphs.recorder is CountingRunTwice
    from gtpo.eval.runner import load_problems

    problems = load_problems("gsm8k", "test", str(shared_data / "gsm8k" / "test.jsonl"), limit=2)
    prompts = [p.prompt for p in problems for _ in range(4)]
    seeds = list(range(100, 108))
    sampling = SamplingSettings(temperature=temperature, max_new_tokens=16)
    # A token of the first row's completion also ends a completion, so rows end at different steps.
    first = plain.generate(prompts, seeds, sampling)[0].text
    stop = plain.tokenizer(first, add_special_tokens=False)["input_ids"][3]
    for backend in (plain, graphs):
        backend.eos_ids = [*backend.eos_ids, stop]
    CountingRunTwice.captures = 0
    got = [graphs.generate(prompts, seeds, sampling) for _ in range(2)]
    expected = plain.generate(prompts, seeds, sampling)
    assert got[0] == expected and got[1] == expected
    assert CountingRunTwice.captures == 1
    assert any(not c.truncated for c in expected)
    if temperature > 0:
        assert any(c.truncated for c in expected)


def test_decode_stats_add_sums_every_field():
    """`DecodeStats.add` (decode_static and decode add each call's stats to the caller's) sums every field, the capture
    count and seconds included: by hand, 1..7 plus 10..70."""
    from dataclasses import fields

    names = [f.name for f in fields(DecodeStats)]
    total = DecodeStats(**{name: i + 1 for i, name in enumerate(names)})
    total.add(DecodeStats(**{name: 10 * (i + 1) for i, name in enumerate(names)}))
    assert [getattr(total, name) for name in names] == [11 * (i + 1) for i in range(len(names))]
    assert {"captures", "capture_seconds", "useful_row_steps"} <= set(names)
