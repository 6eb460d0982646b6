"""The drop-in claim's record (issue 46): docs/python-api.md's counts for TRL's own GRPO test file run with the
one-line swap are the committed run's (docs/measurements/trl-compat-20261128/summary.json), and every test that
failed with `GTPOTrainer` failed with TRL's own `GRPOTrainer` too (summary_baseline.json, the same tests against
TRL's trainer); every refusal is one the docs give with its reason (`entropy_coef`). An edit of the page's figures,
or a new record with a failure of GTPO's own, fails here instead of the docs going stale."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "measurements" / "trl-compat-20261128"


def _record(name: str) -> dict:
    return json.loads((RECORD / name).read_text())


def _tests(name: str) -> dict[str, dict]:
    return _record(name)["tests"]


def test_the_page_quotes_the_committed_counts():
    record = _record("summary.json")
    tests = record["tests"]
    # Recounted from the per-test outcomes, not read from the file's own counts.
    counts = dict(Counter(result["outcome"] for result in tests.values()))
    assert counts == record["counts"]
    quoted = "`counts: " + json.dumps(counts, sort_keys=True) + "` of " + str(len(tests)) + " tests"
    assert quoted in (ROOT / "docs" / "python-api.md").read_text(), quoted


def test_every_failure_with_the_swap_fails_with_trls_own_trainer_with_the_same_message():
    swapped, baseline = _tests("summary.json"), _tests("summary_baseline.json")
    failed = {node: r for node, r in swapped.items() if r["outcome"] == "failed"}
    assert failed, "the record has no failures: then the page's list of five is stale"
    for node, result in failed.items():
        assert baseline.get(node, {}).get("outcome") == "failed", node
        # The same error once the trainer's class name is set aside.
        assert baseline[node]["message"].replace("GRPOTrainer", "X") == result["message"].replace("GTPOTrainer", "X")


def test_every_refusal_is_the_documented_entropy_coef_one():
    refused = [r["message"] for r in _tests("summary.json").values() if r["outcome"] == "refused"]
    assert refused and all(message.startswith("ValueError: entropy_coef=") for message in refused)
    assert "`entropy_coef != 0`, `use_adaptive_entropy`" in (ROOT / "docs" / "python-api.md").read_text()


def test_both_trainers_per_test_outcomes_are_recorded_and_quoted():
    """summary_baseline.json is the whole file against TRL's own GRPOTrainer: the same 175 tests, each with its
    outcome, and the page's comparison is the two records' cross-tabulation, recomputed here."""
    swapped, baseline = _tests("summary.json"), _tests("summary_baseline.json")
    assert swapped.keys() == baseline.keys() and len(swapped) == 175
    counts = dict(Counter(result["outcome"] for result in baseline.values()))
    assert counts == _record("summary_baseline.json")["counts"]
    page = " ".join((ROOT / "docs" / "python-api.md").read_text().split())
    assert "with TRL's trainer `counts: " + json.dumps(counts, sort_keys=True) + "` of 175 tests" in page
    pairs = Counter((swapped[node]["outcome"], baseline[node]["outcome"]) for node in swapped)
    same = {kind: pairs[(kind, kind)] for kind in ("passed", "failed", "offline", "skipped")}
    assert (
        f"{sum(same.values())} tests have the same outcome with both ({same['passed']} passed, {same['failed']} "
        f"failed, {same['offline']} offline, {same['skipped']} skipped)" in page
    )
    assert pairs[("refused", "passed")] == 7 and pairs[("refused", "failed")] == 1
    assert (
        baseline[next(n for n in swapped if n.endswith("::test_entropy_bonus_flows_gradients"))]["outcome"] == "failed"
    )
    only_gtpo = sorted(
        n.split("::")[-1] for n in swapped if (swapped[n]["outcome"], baseline[n]["outcome"]) == ("passed", "failed")
    )
    assert only_gtpo == [
        "test_init_minimal",
        "test_train_vlm[trl-internal-testing/tiny-Gemma3ForConditionalGeneration]",
        "test_train_vlm_with_pad_to_multiple_of",
    ]
    truncation = [n for n in swapped if "mask_truncated" in n]
    assert len(truncation) == 2 and all(baseline[n]["outcome"] == swapped[n]["outcome"] == "passed" for n in truncation)
