"""Training's fast generation (`gtpo.decoding.sampling.decode` behind `GTPOTrainer._generate_single_turn`) against
`generate` and TRL's own branch, on the tiny model.

Invariants: greedy decoding gives exactly `generate`'s tokens (left padding, prompts of different lengths, repeated
prompts, logits processors, TRL's cut after the first EOS); sampling draws from the softmax of the processed logits,
also after ended rows were dropped (a chi-square test over many draws); the same seed gives the same completions;
and what the fast path cannot do goes to TRL's branch, with one log line.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
from gtpo.decoding.sampling import DecodeStats, decode, left_pad, multinomial_choice, preallocated_cache  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tiny_model_path):
    from gtpo.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(tiny_model_path)
    return model.eval(), tokenizer


def prompts_of(tokenizer, texts, repeat):
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    return [p for p in ids for _ in range(repeat)]


def generate_as_trl(model, prompts, config, multiple=None):
    """TRL's transformers branch: left-pad, `generate`, keep each row up to and including its first EOS.
    Returns (completions, processed scores of each step (steps, B, V))."""
    ids, mask = left_pad(prompts, config.pad_token_id, multiple)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            generation_config=config,
            return_dict_in_generate=True,
            output_scores=True,
        )
    eos = config.eos_token_id
    result = []
    for row in out.sequences[:, ids.shape[1] :].tolist():
        stop = next((i for i, t in enumerate(row) if t in eos), None)
        result.append(row if stop is None else row[: stop + 1])
    return result, torch.stack(out.scores)


def recording(choose, record: list):
    """``choose`` that also keeps each step's (rows, scores)."""

    def wrapped(scores, rows):
        record.append((rows.clone(), scores.clone()))
        return choose(scores, rows)

    return wrapped


def frequent_token(model, prompt) -> int:
    """The tiny model's most likely first token after ``prompt``, used as an EOS so that rows end early."""
    with torch.no_grad():
        return int(model(torch.tensor([prompt])).logits[0, -1].argmax())


def test_preallocated_cache_holds_what_transformers_dynamic_cache_holds(tiny):
    """decode's cache writes each step's keys and values into a reserved buffer instead of concatenating. Held to
    transformers' own DynamicCache, operation by operation: a prefill, gathers with repeats (one prefill per prompt),
    steps past the reserve (the buffer grows), dropping rows, repeat_interleave, crop, and reset (then as a new cache).
    Same values, same length, and attention reads them as it reads DynamicCache's (equal logits)."""
    from transformers import DynamicCache

    model, _ = tiny
    ours, theirs = preallocated_cache(model, reserve=2), DynamicCache(config=model.config)
    assert type(ours.layers[0]).__name__ == "PreallocatedLayer" and len(ours.layers) == len(theirs.layers)
    generator = torch.Generator().manual_seed(0)
    config = model.config
    heads, dim = config.num_key_value_heads, config.hidden_size // config.num_attention_heads

    def update(rows, length):
        for layer in range(len(theirs.layers)):
            k = torch.randn(rows, heads, length, dim, generator=generator)
            v = torch.randn(rows, heads, length, dim, generator=generator)
            a, b = ours.update(k, v, layer), theirs.update(k, v, layer)
            assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])

    def same():
        assert ours.get_seq_length() == theirs.get_seq_length()
        for x, y in zip(ours.layers, theirs.layers, strict=True):
            assert torch.equal(x.keys, y.keys) and torch.equal(x.values, y.values)

    update(2, 5)  # prefill of 2 distinct prompts
    same()
    for cache in (ours, theirs):
        cache.batch_select_indices(torch.tensor([0, 0, 1, 0]))  # 4 rows share 2 prefills
    same()
    for _ in range(4):  # 2 steps within the reserve, then 2 past it
        update(4, 1)
        same()
    for cache in (ours, theirs):
        cache.batch_select_indices(torch.tensor([1, 3]))  # two rows ended
    same()
    update(2, 1)
    for cache in (ours, theirs):
        cache.batch_repeat_interleave(2)
        cache.crop(-2)
    same()
    update(4, 1)
    same()
    ids = torch.tensor([[5, 6, 7]] * 4)
    with torch.no_grad():
        logits = [model(ids, past_key_values=c).logits for c in (ours, theirs)]
    torch.testing.assert_close(logits[0], logits[1], rtol=0, atol=0)
    # After reset it holds what a new cache holds (transformers 5.17's own DynamicLayer.reset zeroes its tensors and
    # keeps their length, 5.23's drops them; compared with a fresh DynamicCache, the test holds in both).
    ours.reset()
    theirs = DynamicCache(config=model.config)
    update(3, 2)
    same()


@pytest.mark.parametrize("multiple", [None, 8])
def test_greedy_decode_gives_generates_tokens_with_padding_repeats_and_processors(tiny, multiple):
    from transformers import GenerationConfig

    model, tokenizer = tiny
    prompts = prompts_of(tokenizer, ["What is 2+2?", "Add 17 and 25, then explain every step of it", "hi"], 3)
    prompts = prompts[3:6] + prompts[:3] + prompts[6:]  # distinct prompts not in order of length
    eos = [tokenizer.eos_token_id, frequent_token(model, prompts[0])]  # the first group ends at its first token
    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=24,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
        repetition_penalty=1.3,  # sees the left padding and the prompt, as in `generate`
        no_repeat_ngram_size=3,
    )
    expected, expected_scores = generate_as_trl(model, prompts, config, multiple)
    ids, mask = left_pad(prompts, tokenizer.pad_token_id, multiple)
    from gtpo.trainer.generation import processors_for

    prepared, processors, why = processors_for(model, config, ids, mask)
    assert why is None and len(processors) == 2
    stats, steps = DecodeStats(), []
    choose = recording(multinomial_choice(False), steps)
    got = decode(model, prompts, choose, 24, eos, tokenizer.pad_token_id, processors, multiple, stats)
    assert got == expected
    # Every step's processed scores of every row still decoding are generate's (finite ones; -inf where banned).
    for step, (rows, scores) in enumerate(steps):
        want = expected_scores[step, rows]
        assert torch.equal(torch.isinf(scores), torch.isinf(want))
        finite = torch.isfinite(want)
        torch.testing.assert_close(scores[finite], want[finite], rtol=1e-4, atol=1e-4)
    assert {len(c) for c in got[:3]} == {1} and max(len(c) for c in got) > 1  # rows did end at different steps
    assert stats.prefill_rows == 3 and stats.prompt_rows == 9
    assert stats.row_steps == sum(len(c) for c in got) < stats.generate_row_steps


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of Pearson's chi-square test of ``counts`` against ``probs`` (bins with expectation < 5 pooled)."""
    n = counts.sum()
    expected = probs * n
    small = expected < 5
    if small.any():
        counts = torch.cat([counts[~small], counts[small].sum()[None]])
        expected = torch.cat([expected[~small], expected[small].sum()[None]])
    stat = ((counts - expected) ** 2 / expected).sum()
    dof = len(counts) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat.double() / 2))


def test_sampling_draws_from_the_processed_softmax_also_after_rows_ended(tiny):
    """One prompt x 3000 rows, two tokens each, top-k 3 at temperature 0.8: the first token and, for each
    first token that did not end the row, the second token follow the softmax computed by independent forwards."""
    from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper

    model, tokenizer = tiny
    prompt = prompts_of(tokenizer, ["What is 2+2?"], 1)[0]
    rows = 3000
    processors = LogitsProcessorList([TemperatureLogitsWarper(0.8), TopKLogitsWarper(3)])

    def probs_after(ids) -> torch.Tensor:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1].float()
        top = torch.topk(logits / 0.8, 3)
        return top.indices, torch.softmax(top.values, -1)

    first_ids, first_p = probs_after(prompt)
    eos = [int(first_ids[0])]  # the likeliest first token ends its row: the others are decoded on, re-indexed
    torch.manual_seed(0)
    got = decode(model, [prompt] * rows, multinomial_choice(True), 2, eos, tokenizer.pad_token_id, processors)
    firsts = torch.tensor([c[0] for c in got])
    counts = torch.stack([(firsts == t).sum() for t in first_ids]).double()
    assert counts.sum() == rows and chi_square_p(counts, first_p.double()) > 1e-3
    assert all(len(c) == 1 for c in got if c[0] == eos[0]) and all(len(c) == 2 for c in got if c[0] != eos[0])
    for t in first_ids[1:].tolist():
        second_ids, second_p = probs_after(prompt + [t])
        seconds = torch.tensor([c[1] for c in got if c[0] == t])
        counts = torch.stack([(seconds == s).sum() for s in second_ids]).double()
        assert counts.sum() == len(seconds) > 100
        assert chi_square_p(counts, second_p.double()) > 1e-3


def test_chi_square_rejects_a_wrong_distribution():
    """The test above could not pass by accident: the same statistic rejects draws from another distribution."""
    torch.manual_seed(0)
    draws = torch.multinomial(torch.tensor([0.5, 0.3, 0.2]), 3000, replacement=True)
    counts = torch.bincount(draws, minlength=3).double()
    assert chi_square_p(counts, torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)) > 1e-3
    assert chi_square_p(counts, torch.tensor([0.45, 0.35, 0.2], dtype=torch.float64)) < 1e-3


def make_trainer(tiny_model_path, output_dir, peft_config=None):
    from gtpo import GTPOConfig, GTPOTrainer
    from trainer_helpers import make_dataset, table_reward

    args = GTPOConfig(
        output_dir=output_dir,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=16,
        max_steps=1,
        report_to=[],
        use_cpu=True,
        bf16=False,
        seed=0,
        disable_tqdm=True,
        initial_entropy=1.0,
    )
    return GTPOTrainer(
        model=tiny_model_path,
        reward_funcs=table_reward,
        args=args,
        train_dataset=make_dataset(8),
        peft_config=peft_config,
    )


@pytest.fixture(scope="module")
def trainer(tiny_model_path, tmp_path_factory):
    return make_trainer(tiny_model_path, str(tmp_path_factory.mktemp("gen") / "out"))


def two_groups(trainer):
    tokenizer = trainer.processing_class
    prompts = [[{"role": "user", "content": "What is 3 + 4?"}], [{"role": "user", "content": "Name a prime number"}]]
    ids = [
        tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=False) for p in prompts
    ]
    assert len(ids[0]) != len(ids[1])
    return [p for p in ids for _ in range(4)]


def generate_both(trainer, prompt_ids, seed=0):
    """(fast path, TRL's branch) completions, each after torch.manual_seed(seed)."""
    out = []
    for fast in (True, False):
        trainer.args.fast_generation = fast
        torch.manual_seed(seed)
        completions, logprobs = trainer._generate_single_turn(prompt_ids, None, {}, 4)
        assert logprobs is None
        out.append(completions)
    del trainer.args.fast_generation
    return out


def test_trainer_greedy_generation_is_trls(trainer, monkeypatch):
    """With do_sample off the fast path and TRL's branch give the same completion ids (EOS cut included)."""
    calls = []
    import gtpo.trainer.generation as generation

    monkeypatch.setattr(generation, "decode", lambda *a, **k: calls.append(1) or decode(*a, **k))
    monkeypatch.setitem(trainer.generation_kwargs, "do_sample", False)
    monkeypatch.setattr(trainer.generation_config, "do_sample", False)
    fast, trl = generate_both(trainer, two_groups(trainer))
    assert calls == [1]  # the fast path ran (once), TRL's did not call it
    assert fast == trl
    assert all(1 <= len(c) <= 16 for c in fast)


def test_lora_trainer_greedy_generation_with_folded_adapters_is_trls(tiny_model_path, tmp_path, monkeypatch):
    """A float32 LoRA policy generates with its adapters folded in (merged_lora): same greedy tokens as TRL's
    branch, which runs the adapters unmerged, and the base weights untouched after."""
    from peft import LoraConfig

    import gtpo.decoding.sampling

    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = make_trainer(tiny_model_path, str(tmp_path / "out"), lora)
    with torch.no_grad():
        for name, p in trainer.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    folded = []
    original = gtpo.decoding.sampling.merged_lora
    monkeypatch.setattr("gtpo.trainer.generation.merged_lora", lambda m: folded.append(1) or original(m))
    monkeypatch.setitem(trainer.generation_kwargs, "do_sample", False)
    monkeypatch.setattr(trainer.generation_config, "do_sample", False)
    fast, trl = generate_both(trainer, two_groups(trainer))
    assert folded == [1] and fast == trl
    assert all(torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())


def test_trainer_sampling_repeats_with_the_seed_and_draws_fresh_otherwise(trainer):
    prompt_ids = two_groups(trainer)
    trainer.args.fast_generation = True
    runs = []
    for seed in (5, 5, 6):
        torch.manual_seed(seed)
        runs.append(trainer._generate_single_turn(prompt_ids, None, {}, 4)[0])
    del trainer.args.fast_generation
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]
    assert len({tuple(c) for c in runs[0]}) > 1  # the rows of a group are not copies of each other


@pytest.mark.parametrize(
    "change, reason",
    [
        (lambda t: setattr(t, "use_vllm", True), "vLLM"),
        (lambda t: setattr(t, "use_transformers_continuous_batching", True), "continuous_batching"),
        (lambda t: setattr(t.generation_config, "num_beams", 2), "beam"),
        (lambda t: setattr(t.generation_config, "stop_strings", ["."]), "stop_strings"),
        (lambda t: setattr(t.args, "fast_generation", False), "fast_generation=False"),
    ],
)
def test_what_the_fast_path_cannot_do_goes_to_trls_branch_with_one_log_line(trainer, change, reason, caplog):
    from trl import GRPOTrainer

    from gtpo.trainer.generation import fast_generation_blocker

    saved = (trainer.use_vllm, trainer.use_transformers_continuous_batching, trainer.generation_config.to_dict())
    change(trainer)
    try:
        why = fast_generation_blocker(trainer)
        assert why is not None and reason in why
        called = []
        original = GRPOTrainer._generate_single_turn
        GRPOTrainer._generate_single_turn = lambda self, *a, **k: called.append(a) or ([[1]], None)
        try:
            with caplog.at_level(logging.INFO, logger="gtpo.trainer.generation"):
                for _ in range(2):
                    assert trainer._generate_single_turn([[1, 2]], None, {}, 1) == ([[1]], None)
        finally:
            GRPOTrainer._generate_single_turn = original
        assert len(called) == 2
        lines = [r.getMessage() for r in caplog.records if "TRL's path" in r.getMessage()]
        assert len(lines) <= 1 and (lines == [] or reason in lines[0])
    finally:
        trainer.use_vllm, trainer.use_transformers_continuous_batching = saved[:2]
        trainer.generation_config.num_beams = saved[2]["num_beams"]
        trainer.generation_config.stop_strings = saved[2]["stop_strings"]
        if "fast_generation" in vars(trainer.args):
            del trainer.args.fast_generation
        trainer.__dict__.pop("_gtpo_generation_fallbacks", None)


def lora_model(tiny_model_path, dtype=torch.float32, dropout=0.0):
    from peft import LoraConfig, get_peft_model

    from gtpo.models import load_model

    model = load_model(tiny_model_path, dtype=dtype)
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=["q_proj", "v_proj", "down_proj"])
    model = get_peft_model(model, config).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)  # B = 0 at initialisation would make merging a no-op
    return model


def test_merged_lora_gives_the_same_logits_and_puts_the_base_weights_back_bit_for_bit(tiny_model_path):
    from gtpo.decoding.sampling import merged_lora

    model = lora_model(tiny_model_path)
    ids = torch.tensor([[5, 17, 42, 99, 7, 3]])
    bases = {n: (p, p.data.clone()) for n, p in model.named_parameters() if "base_layer" in n}
    with torch.no_grad():
        plain = model(ids).logits
        with merged_lora(model) as merged:
            assert merged
            folded = model(ids).logits
            assert any(not torch.equal(p.data, before) for p, before in bases.values())  # the weights were folded
        after = model(ids).logits
    torch.testing.assert_close(folded, plain, rtol=1e-5, atol=1e-5)
    assert torch.equal(after, plain)
    assert all(torch.equal(p.data, before) for p, before in bases.values())


@pytest.mark.parametrize("dtype, dropout", [(torch.bfloat16, 0.0), (torch.float32, 0.1)])
def test_merged_lora_leaves_bf16_and_dropout_models_as_they_are(tiny_model_path, dtype, dropout):
    """bf16 would round most of BA away in W + BA; dropout would be skipped by a merged layer."""
    from gtpo.decoding.sampling import lora_layers, merged_lora

    model = lora_model(tiny_model_path, dtype, dropout)
    assert lora_layers(model)[1] is not None
    with merged_lora(model) as merged:
        assert not merged
        assert not any(layer.merged for layer in lora_layers(model)[0])


def test_a_decoding_mode_from_the_models_own_generation_config_goes_to_trls_branch(trainer, monkeypatch, caplog):
    """`generate` merges the model's generation defaults into TRL's config: a checkpoint that ships num_beams=2 would
    beam-search there, so the fast path must not sample instead."""
    from trl import GRPOTrainer

    model = trainer.accelerator.unwrap_model(trainer.model)
    monkeypatch.setattr(model.generation_config, "num_beams", 2)
    called = []
    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", lambda self, *a: called.append(a) or ([[1]], None))
    with caplog.at_level(logging.INFO, logger="gtpo.trainer.generation"):
        assert trainer._generate_single_turn(two_groups(trainer), None, {}, 4) == ([[1]], None)
    trainer.__dict__.pop("_gtpo_generation_fallbacks", None)
    assert len(called) == 1
    assert any("beam" in r.getMessage() for r in caplog.records)
