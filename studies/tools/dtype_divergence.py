"""Why a float32 run cannot reproduce a bf16 run number for number: the same seed samples other tokens.

Study B (docs/study-gtpo-vs-grpo.md) runs the partial study's setting in float32; the partial study ran in
bf16. This script takes the first prompt of the SmolLM2 synthetic recipe's training set (one worked
example), computes the next-token distribution in both dtypes, and samples the 8 completions of a group
(temperature 1, up to 96 tokens, the recipe's settings) from the same seed in each dtype. It prints how
far the log-probabilities differ and where each pair of completions first differs. (transformers runs the
GGUF model's bf16 matmuls in float32 kernels with bf16 inputs and outputs, so this shows how sensitive the
samples are to the dtype, not a replay of the partial study's CPU arithmetic.)

    .venv/bin/python studies/tools/dtype_divergence.py          # about 30 s on this project's 2-core CPU
"""

from __future__ import annotations

import time

import torch

from gtpo.models import load_model, load_tokenizer
from gtpo.tasks.registry import load_task

GROUP, MAX_NEW_TOKENS, SEED = 8, 96, 0


def _until_eos(tokens: list[int], eos: int) -> list[int]:
    return tokens[: tokens.index(eos) + 1] if eos in tokens else tokens


def main() -> None:
    torch.set_num_threads(2)
    tokenizer = load_tokenizer("smollm2")
    prompt = load_task("synthetic", "train", few_shot=1, seed=SEED)[0]["prompt"]
    ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    completions, logprobs = {}, {}
    for dtype in (torch.float32, torch.bfloat16):
        model = load_model("smollm2", dtype=dtype).eval()
        with torch.no_grad():
            logits = model(**ids).logits[0, -1].float()  # (V,) next-token logits after the prompt
            logprobs[dtype] = torch.log_softmax(logits, dim=-1)
            torch.manual_seed(SEED)
            start = time.perf_counter()
            out = model.generate(
                **ids,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=MAX_NEW_TOKENS,
                num_return_sequences=GROUP,
                pad_token_id=tokenizer.pad_token_id,
            )
        # Rows of a batch are padded to its longest: cut each at its end of sequence (kept) before comparing.
        completions[dtype] = [
            _until_eos(row, tokenizer.eos_token_id) for row in out[:, ids["input_ids"].shape[1] :].tolist()
        ]
        print(f"{str(dtype):<15} sampled {GROUP} x <= {MAX_NEW_TOKENS} tokens in {time.perf_counter() - start:.1f} s")
    a, b = logprobs[torch.float32], logprobs[torch.bfloat16]
    top = a.argmax()
    print(
        f"next-token log-probabilities after the prompt: max |float32 - bf16| {float((a - b).abs().max()):.4f}, "
        f"on the most likely token {float((a[top] - b[top]).abs()):.4f} nats"
    )
    firsts = []
    for i, (x, y) in enumerate(zip(completions[torch.float32], completions[torch.bfloat16], strict=True)):
        first = next((p for p, (s, t) in enumerate(zip(x, y, strict=False)) if s != t), None)
        if first is None and len(x) != len(y):
            first = min(len(x), len(y))
        firsts.append(first)
        where = "identical" if first is None else f"first differ at token {first}"
        print(f"completion {i}: {where} (lengths {len(x)} / {len(y)})")
    same = sum(f is None for f in firsts)
    print(f"{same} of {GROUP} completions identical across dtypes from the same seed")


if __name__ == "__main__":
    main()
