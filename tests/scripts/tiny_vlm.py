"""A tiny Gemma3 vision-language model and processor built from a config, offline (gtpo's tiny tokenizer)."""

from __future__ import annotations

from pathlib import Path

TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<start_of_image>{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tiny_gemma3(directory: Path, seed: int = 0) -> Path:
    """Save a ~43k-parameter Gemma3ForConditionalGeneration (28x28 images, 4 tokens each) and its processor."""
    import torch
    from transformers import AutoTokenizer, Gemma3Config, Gemma3ForConditionalGeneration, Gemma3Processor
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    from gtpo.models import tiny_model_dir

    tokenizer = AutoTokenizer.from_pretrained(
        tiny_model_dir(),
        extra_special_tokens={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
    )
    tokenizer.chat_template = TEMPLATE
    processor = Gemma3Processor(
        image_processor=Gemma3ImageProcessorPil(size={"height": 28, "width": 28}),
        tokenizer=tokenizer,
        chat_template=TEMPLATE,
        image_seq_length=4,
    )
    config = Gemma3Config(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            max_position_embeddings=512,
            sliding_window=64,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=tokenizer.bos_token_id,
        ),
        vision_config=dict(
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            image_size=28,
            patch_size=7,
            vision_use_head=False,
        ),
        mm_tokens_per_image=4,
        boi_token_index=tokenizer.boi_token_id,
        image_token_index=tokenizer.image_token_id,
        eoi_token_index=tokenizer.convert_tokens_to_ids("<end_of_image>"),
    )
    torch.manual_seed(seed)
    model = Gemma3ForConditionalGeneration(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)  # far from uniform, so entropies differ between completions
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory
