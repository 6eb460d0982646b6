"""Decoding for training's generation and `gtpo eval`'s transformers backend, one loop in two forms.

`sampling`: the decode loop (one prefill per distinct prompt, ended rows dropped, the samplers and LoRA merging);
`graph`: the same contract with fixed shapes, each step replayed as one CUDA graph (`cuda_graph_generation`).
"""
