"""The paper's constants and default settings (arXiv 2508.03772), each defined once, torch-free.

`gtpo.core`'s functions, `LossSettings`, `GTPOConfig`, `gtpo inspect`, the collapse monitor and the study reports
read them from here, so that importing a constant does not import torch (`gtpo.core` loads its modules lazily).
"""

from __future__ import annotations

import math

LN2 = math.log(2.0)
"""ln 2 nats (Eq. 6): the entropy filter's default threshold on ⟨H⟩_i and the gate on ⟨H⟩_ini of mode ``auto``."""

ENTROPY_THRESHOLD = LN2
"""Default threshold of Eq. 6 (the authors' code used 0.7; 1.02-1.05 for Qwen, Sec. 12)."""

POSITIVE_WEIGHT = 2.0
"""λ of a positive completion's conflict tokens (Eq. 5; App. 11, Eq. 19: keeps the group's total signal)."""

NEGATIVE_WEIGHT = 0.0
"""λ of a negative completion's conflict tokens (Eq. 5: no negative update on them)."""

GAMMA = 0.1
"""γ, the weight of the entropy term −γ⟨H⟩_i (Eq. 7)."""

INITIAL_ENTROPY_PROMPTS = 100
"""Training prompts on which ⟨H⟩_ini is measured before step 1 (Sec. 6)."""
