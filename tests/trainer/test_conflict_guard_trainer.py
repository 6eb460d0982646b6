"""`GTPOConfig.conflict_guard` in the trainer (issue 38): the λ it applies and records, and that off changes nothing.

The groups are TABLE's (fixed completions that share openings and the ending ". <eos>" across signs): which tokens are
contested follows by hand from the rewards, so the recorded λ is checked against that derivation, not against
`contested_tokens` itself (tests/core/test_conflict_guard.py checks that one against a brute-force scan).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from test_trainer import SGD, FixedGTPO, settings  # noqa: E402

from gtpo import GTPOConfig  # noqa: E402
from gtpo.runs import completions as record_files  # noqa: E402
from gtpo.trainer import trainer as trainer_module  # noqa: E402
from trainer_helpers import make_dataset, max_abs_diff, table_reward, trainable_state  # noqa: E402

COMMON = dict(entropy_filter="never", entropy_gamma=0.0, log_completions_max_groups=None, **SGD)


def not_seven(completions, **kwargs):
    """1 except for "Let us think. It is seven.": three positives and one negative per group."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [0.0 if "seven" in text else 1.0 for text in texts]


def _train(model, tmp_path, name, reward, **overrides):
    args = GTPOConfig(**settings(tmp_path / name, **COMMON, **overrides))
    trainer = FixedGTPO(model=model, reward_funcs=reward, args=args, train_dataset=make_dataset())
    batches = []
    original = trainer._generate_and_score_completions

    def spy(inputs):
        output = original(inputs)
        batches.append(output)
        return output

    trainer._generate_and_score_completions = spy
    trainer.train()
    return trainer, batches, record_files.read_step(args.output_dir, 1)


def test_guard_on_tables_groups_acts_exactly_where_the_hand_derivation_says(tmp_path, tiny_model_path):
    # TABLE's own reward: each opening and the shared ending are held by as many positives as negatives, with
    # advantages ±a, so every span token has S = 0: nothing is contested, and the guard's update is the update
    # without the correction, bit for bit, while the paper's correction changes it.
    guard, batches, record = _train(tiny_model_path, tmp_path, "guard", table_reward, conflict_guard=True)
    plain, _, _ = _train(tiny_model_path, tmp_path, "plain", table_reward, conflict_correction=False)
    paper, paper_batches, _ = _train(tiny_model_path, tmp_path, "paper", table_reward)
    assert max_abs_diff(trainable_state(guard.model), trainable_state(plain.model)) == 0
    assert max_abs_diff(trainable_state(guard.model), trainable_state(paper.model)) > 0
    c = record["columns"]
    assert min(c["forward_span"]) > 0 and min(c["backward_span"]) > 0  # the control: the spans are there
    assert c["lambda_positions"] == [[]] * 8 and record["metadata"]["conflict_guard"] is True
    assert trainer_module.CONTESTED_SPAN in batches[0]
    # Guard off: the batch carries no contested tokens, so the loss runs Eq. 5 as before the guard existed.
    assert trainer_module.CONTESTED_SPAN not in paper_batches[0]

    # Three positives, one negative ("Let us think. It is seven."): A+ = a/3, A- = -a. The opening "Let us think."
    # is shared by one positive and the negative: S = a/3 - a < 0, contested, λ 0 for both rows. The ending
    # ". <eos>" is shared by all four: S = 0, kept. "We add. The answer is" is held by positives only: no span.
    _, _, record = _train(tiny_model_path, tmp_path, "contested", not_seven, conflict_guard=True)
    c = record["columns"]
    for i in range(8):
        text = c["completion"][i][0]["content"]
        n_fw = c["forward_span"][i]
        if text.startswith("Let us think."):
            assert n_fw > 0 and c["lambda_positions"][i] == list(range(n_fw)), text
            assert c["lambda_values"][i] == [0.0] * n_fw
        else:
            assert n_fw == 0 and c["lambda_positions"][i] == [], text
        assert c["backward_span"][i] > 0  # the shared ending, uncontested
