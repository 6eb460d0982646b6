"""The policy's forward over completions: per-token log-probs and entropies through TRL's fused head, padded or packed.

`trl_head`: TRL's LM-head kernel behind one door (the private names the forward relies on, checked at import, and
`HeadPatch`, the one patch of the kernel); `lm_head`: one pass of the head, the tempered log-probs and the
temperature-1 entropy from the same tiles, with `head_kernels`, its Triton kernels; `untempered`: that head installed
in TRL's fused forward; `packing`: the packed layout (each prompt once, no padding); `layout_choice`: packed or
padded; `flex`: the packed layout's mask as FlexAttention's block mask (opt-in). No module here knows GRPOTrainer:
the trainer's hook that uses them is `gtpo.trainer.prefix_sharing`.
"""
