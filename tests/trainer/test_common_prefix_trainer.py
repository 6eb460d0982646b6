"""`GTPOConfig.conflict_exclude_common_prefix` in the trainer: the λ it applies and records; off, nothing changes.

The groups are TABLE's (fixed completions): "Let us think." opens a positive and a negative completion alike, and so
does "We add."; the ending ". <eos>" is shared across signs by position from the end. So every forward-span token lies
in a common prefix (derived by hand from the table), and the variant's update must be, bit for bit, the update with the
correction on the trailing spans only (`conflict_span_sides="backward"`), an independent path through the loss.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
from test_conflict_guard_trainer import _train, not_seven  # noqa: E402

from gtpo import GTPOConfig  # noqa: E402
from gtpo.trainer import trainer as trainer_module  # noqa: E402
from trainer_helpers import max_abs_diff, table_reward, trainable_state  # noqa: E402


@pytest.mark.parametrize("reward", [table_reward, not_seven], ids=["two-and-two", "three-and-one"])
def test_the_variant_leaves_the_shared_openings_to_the_group_and_keeps_eq5_on_the_endings(
    tmp_path, tiny_model_path, reward
):
    variant, batches, record = _train(tiny_model_path, tmp_path, "variant", reward, conflict_exclude_common_prefix=True)
    endings, _, endings_record = _train(tiny_model_path, tmp_path, "endings", reward, conflict_span_sides="backward")
    paper, paper_batches, paper_record = _train(tiny_model_path, tmp_path, "paper", reward)
    assert max_abs_diff(trainable_state(variant.model), trainable_state(endings.model)) == 0
    assert max_abs_diff(trainable_state(variant.model), trainable_state(paper.model)) > 0  # the control
    c, p = record["columns"], paper_record["columns"]
    assert c["forward_span"] == p["forward_span"] and max(c["forward_span"]) > 0  # the spans are the paper's
    assert c["lambda_positions"] == endings_record["columns"]["lambda_positions"]  # λ ≠ 1 only on the endings
    assert c["lambda_positions"] != p["lambda_positions"]
    assert record["metadata"]["conflict_exclude_common_prefix"] is True
    assert trainer_module.COMMON_PREFIX_SPAN in batches[0]
    assert trainer_module.COMMON_PREFIX_SPAN not in paper_batches[0]  # off: Eq. 5 as before the option existed
    assert paper_record["metadata"]["conflict_exclude_common_prefix"] is False


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(conflict_correction=False), "without the correction every token already gets GRPO's update"),
        (dict(conflict_span_sides="backward"), "a common prefix lies in the leading span"),
        (dict(conflict_exclude_common_prefix="yes"), "must be True or False"),
    ],
)
def test_the_variant_refuses_settings_where_it_cannot_act(tmp_path, overrides, message):
    settings = dict(conflict_exclude_common_prefix=True) | overrides
    with pytest.raises(ValueError, match=message):
        GTPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], **settings)


def test_push_against_group_is_logged_as_derived_by_hand(tmp_path, tiny_model_path):
    # not_seven: three positives (A = a/3) and one negative (A = -a) per group. "Let us think." opens one positive and
    # the negative: S = a/3 - a < 0, U = 2·a/3 > 0 (Eq. 5), each of its k tokens held by n = 2 rows in their spans,
    # so it adds k·2·(U/2) = 2ka/3 against the group. The shared ending (e tokens, all four rows) has S = 0 and
    # U = 2·3·a/3 = 2a: 2ea pushed up, not against. "We add." opens two positives only: no span. So the metric is
    # (2ka/3) / (2ka/3 + 2ea) = k / (k + 3e).
    trainer, _, record = _train(tiny_model_path, tmp_path, "paper", not_seven)
    c = record["columns"]
    first = next(i for i in range(8) if c["completion"][i][0]["content"].startswith("Let us think."))
    k, e = c["forward_span"][first], c["backward_span"][first]
    assert k > 0 and e > 0
    logged = [row["gtpo/push_against_group"] for row in trainer.state.log_history if "gtpo/push_against_group" in row]
    assert logged == [pytest.approx(k / (k + 3 * e), rel=1e-6)]
    # TABLE's reward: every shared token has S = 0 (one positive and one negative per opening, all four at the end).
    trainer, _, _ = _train(tiny_model_path, tmp_path, "table", table_reward)
    assert [row.get("gtpo/push_against_group") for row in trainer.state.log_history if "loss" in row] == [0.0]
    # The variant leaves the shared opening to the group (U = S < 0): nothing pushed up against it.
    trainer, _, _ = _train(tiny_model_path, tmp_path, "variant", not_seven, conflict_exclude_common_prefix=True)
    assert [row.get("gtpo/push_against_group") for row in trainer.state.log_history if "loss" in row] == [0.0]
