"""Decoding for training's generation and `gtpo eval`'s transformers backend, one loop in two forms.

`sampling`: the decode loop (one prefill per distinct prompt, ended rows dropped, the samplers and LoRA merging);
`counter`: the counter-based sampler (noise hashed from seed, row, step and token; drawn inside a recorded step);
`graph`: the same contract with fixed shapes, each step replayed as one CUDA graph (`cuda_graph_generation`).
"""
