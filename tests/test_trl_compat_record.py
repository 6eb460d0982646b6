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
