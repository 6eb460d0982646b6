"""`keyword_loss`: the core tests' shorthand for `gtpo.core.gtpo_loss`, which takes (LossInputs, LossSettings) only.

Each keyword goes to the one dataclass that has a field of that name (they share none), so a test reads as before:
``keyword_loss(logps, mask, adv, gamma=0.0, forward_span=fw)``. This is test code: the library's one entry point is
``gtpo_loss(LossInputs(...), LossSettings(...))``.
"""

from __future__ import annotations

from dataclasses import fields

from gtpo.core import LossInputs, LossSettings, gtpo_loss

INPUT_FIELDS = {f.name for f in fields(LossInputs)}
SETTING_FIELDS = {f.name for f in fields(LossSettings)}


def keyword_loss(per_token_logps=None, completion_mask=None, advantages=None, *, terms=None, **keywords):
    unknown = set(keywords) - INPUT_FIELDS - SETTING_FIELDS
    if unknown:
        raise TypeError(f"keyword_loss: {sorted(unknown)} are fields of neither LossInputs nor LossSettings")
    inputs = LossInputs(
        per_token_logps, completion_mask, advantages, **{k: v for k, v in keywords.items() if k in INPUT_FIELDS}
    )
    settings = LossSettings(**{k: v for k, v in keywords.items() if k in SETTING_FIELDS})
    return gtpo_loss(inputs, settings, terms=terms)
