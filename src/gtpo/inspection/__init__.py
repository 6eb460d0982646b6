"""Inspection: one group of completions through GTPO's eyes (the paper's Fig. 9 on your own model): advantages,
conflict spans, λ, per-token entropy, δ and the shifted advantages, rendered for a terminal, a PNG or JSON."""

from gtpo.inspection.group import GroupAnalysis, analyse_group, group_advantages

__all__ = ["GroupAnalysis", "analyse_group", "group_advantages"]
