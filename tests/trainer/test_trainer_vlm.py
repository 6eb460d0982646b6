"""Vision-language models with the default entropy_filter='auto': ⟨H⟩_ini is measured through TRL's own
generation path (images included) and training runs, on a tiny Gemma3 built from a config offline.

The expected ⟨H⟩_ini is recomputed independently: a plain forward of the model (full logits, temperature 1)
on the ids TRL generated, with the image features of the processor, one completion at a time.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import Dataset
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
from test_trainer import settings  # noqa: E402

from gtpo import GTPOConfig, GTPOTrainer  # noqa: E402
from tiny_vlm import build_tiny_gemma3  # noqa: E402


def length_reward(completions, **kwargs):
    return [float(len(c[0]["content"])) for c in completions]


def test_vlm_trains_with_initial_entropy_measured_through_trls_generation_path(tmp_path):
    model_dir = build_tiny_gemma3(tmp_path / "tiny-gemma3")
    rng = np.random.default_rng(0)
    images = [Image.fromarray((rng.random((28, 28, 3)) * 255).astype("uint8")) for _ in range(8)]
    data = Dataset.from_dict(
        {"prompt": [[{"role": "user", "content": f"What is in picture {i}?"}] for i in range(8)], "image": images}
    )
    args = GTPOConfig(
        **settings(
            tmp_path,
            per_device_train_batch_size=4,
            num_generations=2,
            initial_entropy_prompts=3,
            temperature=0.7,
            learning_rate=0.1,
            max_steps=1,
        )
    )
    processor = AutoProcessor.from_pretrained(model_dir)
    trainer = GTPOTrainer(
        model=str(model_dir), reward_funcs=length_reward, args=args, train_dataset=data, processing_class=processor
    )
    sampled, original = [], trainer._generate

    def recording(prompts):
        result = original(prompts)
        sampled.append((prompts, result[0], result[1]))
        return result

    trainer._generate = recording
    trainer.train()
    assert trainer._initial_entropy_source == "measured"
    measure_prompts, prompt_ids, completion_ids = sampled[0]  # the first _generate call is the measurement
    # One call of a training generation batch's 4 rows: the 3 prompts, then prompt 0 again with weight 0.
    assert len(completion_ids) == 4 and measure_prompts[3] == measure_prompts[0]
    measure_prompts, prompt_ids, completion_ids = measure_prompts[:3], prompt_ids[:3], completion_ids[:3]

    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    expected = []
    for prompt, ids, completion, image in zip(measure_prompts, prompt_ids, completion_ids, images, strict=False):
        text = processor.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        inputs = processor(images=[image], text=[text], return_tensors="pt")
        assert inputs["input_ids"][0].tolist() == list(ids)  # the same prompt, image tokens included
        full = torch.tensor([list(ids) + list(completion)])
        k = len(completion)
        token_type_ids = torch.cat([inputs["token_type_ids"], torch.zeros(1, k, dtype=torch.long)], dim=1)
        with torch.no_grad():
            logits = model(input_ids=full, pixel_values=inputs["pixel_values"], token_type_ids=token_type_ids).logits
        logp = torch.log_softmax(logits[0, -k - 1 : -1].double(), dim=-1)
        expected.append((-(logp.exp() * logp).sum(-1)).mean().item())
    assert trainer.initial_entropy == pytest.approx(sum(expected) / len(expected), abs=1e-4)
    assert trainer.state.log_history[0]["gtpo/initial_entropy"] == pytest.approx(trainer.initial_entropy)
