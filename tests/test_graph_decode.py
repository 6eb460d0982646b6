"""gtpo.graph_decode.decode_static (fixed shapes for CUDA graphs) draws the tokens `gtpo.sampling.decode` draws.

Per-row seeds (`per_row_choice`): a row's tokens do not depend on the other rows, so the static path (every row kept,
a full-width mask, transformers' StaticCache) must give exactly `decode`'s completions, ended rows dropped or not.
`multinomial_choice` draws on one global generator for the rows in the batch, so the static path equals `decode`
with ``drop_finished=False`` (generate's behaviour, every row kept). On the tiny model, float32, CPU; the CUDA
graph itself is checked on a GPU (gpu-marked test, scripts/gpu_checks.sh); on the CPU a stand-in recorder runs each
recorded step twice, as the CUDA graph's warm-up and replay do, and the tokens must not change.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper

from gtpo.graph_decode import decode_static, supports_fixed_decode
from gtpo.models import load_model, load_tokenizer
from gtpo.sampling import DecodeStats, decode, multinomial_choice, per_row_choice


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
    """Stands in for `gtpo.graph_decode.CudaGraph` on a CPU: at capture it runs the step once (the warm-up on the side
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
