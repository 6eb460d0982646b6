"""Model sources: the offline names resolve to files on disk and bad paths fail with the valid choices."""

import pytest
import torch

from gtpo.models import load_model_and_tokenizer, resolve_model


def test_tiny_model_builds_once_and_generates_with_chat_template(tiny_model_path):
    model, tokenizer = load_model_and_tokenizer(tiny_model_path)
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    inputs = tokenizer(text, return_tensors="pt")
    out = model.generate(**inputs, max_new_tokens=5, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert out.shape[1] == inputs["input_ids"].shape[1] + 5
    # The tags are single tokens, so conflict spans on them are easy to reason about in tests.
    assert len(tokenizer.tokenize("<reasoning>")) == 1 and len(tokenizer.tokenize("</answer>")) == 1
    assert resolve_model("tiny").path == tiny_model_path


def test_smollm2_resolves_to_the_gguf_inside_the_wheel():
    source = resolve_model("smollm2")
    assert source.gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert (resolve_model("smollm2").path + "/" + source.gguf_file).endswith(".gguf")


@pytest.mark.parametrize("bad", ["./no/such/dir", "/nonexistent/model"])
def test_missing_model_path_names_the_valid_choices(bad):
    with pytest.raises(ValueError, match="does not exist.*offline names"):
        resolve_model(bad)


def test_dtype_by_name(tiny_model_path):
    model, _ = load_model_and_tokenizer(tiny_model_path, dtype="bfloat16")
    assert next(model.parameters()).dtype == torch.bfloat16


def test_smollm2_loads_as_a_model_trainer_accepts(tmp_path):
    # transformers de-quantizes the GGUF weights but leaves the model flagged as quantized, and Trainer
    # refuses to fine-tune a model so flagged; load_model must clear the flag (the weights are dense).
    from transformers import Trainer, TrainingArguments

    model = load_model_and_tokenizer("smollm2")[0]
    assert all(p.dtype == torch.float32 for p in model.parameters())
    Trainer(model=model, args=TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[]))


def test_cpu_bf16_units_are_read_from_the_cpu_flags():
    """bf16 on a CPU without bf16 units is emulated (~10x slower than float32): `gtpo train` warns then."""
    from gtpo.models import cpu_computes_bf16

    epyc_avx2 = "processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma\n"  # the project's CI and dev CPU
    sapphire_rapids = "processor\t: 0\nflags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
    graviton3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"
    assert cpu_computes_bf16(epyc_avx2) is False
    assert cpu_computes_bf16(sapphire_rapids) is True and cpu_computes_bf16(graviton3) is True
    assert cpu_computes_bf16("") is None


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_smollm2_loads_from_its_folder_as_from_the_gguf(dtype):
    """`load_model("smollm2")` reads the de-quantised folder built once from the GGUF (seconds instead of 15 s): the
    weights equal a direct GGUF load bit for bit, in float32 and in bfloat16, and the tokenizer (ids, chat
    template, special tokens) is the GGUF's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gtpo.models import load_model, load_tokenizer

    source = resolve_model("smollm2")
    direct = AutoModelForCausalLM.from_pretrained(source.path, gguf_file=source.gguf_file, dtype=getattr(torch, dtype))
    fast = load_model("smollm2", dtype=dtype)
    direct_state, fast_state = direct.state_dict(), fast.state_dict()
    assert direct_state.keys() == fast_state.keys()
    for name, value in direct_state.items():
        assert fast_state[name].dtype == value.dtype and torch.equal(fast_state[name], value), name
    gguf_tokenizer = AutoTokenizer.from_pretrained(source.path, gguf_file=source.gguf_file)
    tokenizer = load_tokenizer("smollm2")
    messages = [
        {"role": "system", "content": "Respond in <reasoning>...</reasoning>"},
        {"role": "user", "content": "x"},
    ]
    for text in ("What is 35 + 19?\n<answer>\n54\n</answer>", "  ünïcode\t\tand 1,234.5 ∑ 😀", ""):
        assert tokenizer(text)["input_ids"] == gguf_tokenizer(text)["input_ids"]
    assert tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        gguf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    )
    assert (tokenizer.eos_token_id, tokenizer.bos_token_id) == (
        gguf_tokenizer.eos_token_id,
        gguf_tokenizer.bos_token_id,
    )
