#!/usr/bin/env bash
# Run TRL's own GRPOTrainer tests (tests/test_grpo_trainer.py) against GTPOTrainer/GTPOConfig, offline:
# the evidence that the one-line swap holds. TRL's files are copied into a temporary folder, never into
# this repository; tests/trl_compat/trl_conftest.py does the swap and serves the hub ids from local builds.
#
#   scripts/run_trl_grpo_tests.sh [--repo TRL_GIT_DIR] [--ref REF] [pytest args...]
#
# TRL_GIT_DIR: a clone or bare mirror of huggingface/trl (default: $TRL_GIT_DIR, else --repo DIR);
# REF: the tag or commit whose tests to run (default v1.16.0, the pinned TRL).
# Prints the counts passed / refused / offline / failed / skipped and writes trl_compat_summary.json here.
# GTPO_TRL_COMPAT_BASELINE=1 runs the same tests, offline set-up included, against TRL's own GRPOTrainer
# (writes trl_compat_summary_baseline.json): a test that fails there fails for reasons of its own
# (a test file of another TRL version, a model not built here), not because of GTPO.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
repo="${TRL_GIT_DIR:-}"
ref="v1.16.0"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --repo) repo="$2"; shift 2 ;;
    --ref) ref="$2"; shift 2 ;;
    *) break ;;
  esac
done
if ! git -C "$repo" cat-file -e "$ref:tests/test_grpo_trainer.py" 2>/dev/null; then
  echo "error: $repo has no tests/test_grpo_trainer.py at ref '$ref'; pass --repo DIR and --ref TAG_OR_COMMIT" >&2
  exit 2
fi
work="$(mktemp -d -t trl-grpo-tests-XXXXXX)"
mkdir -p "$work/tests"
for f in __init__.py testing_utils.py testing_constants.py test_grpo_trainer.py; do
  git -C "$repo" show "$ref:tests/$f" > "$work/tests/$f" 2>/dev/null || true
done
cp "$here/tests/trl_compat/trl_conftest.py" "$work/tests/conftest.py"
echo "TRL tests from $repo at $ref ($(git -C "$repo" rev-parse --short "$ref")); installed trl $("$here/.venv/bin/python" -c 'import trl; print(trl.__version__)'); work dir $work"
cd "$work"
set +e
GTPO_REPO="$here" OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" "$here/.venv/bin/python" -m pytest -q -p no:cacheprovider --rootdir "$work" \
  -o addopts="" tests/test_grpo_trainer.py "$@" > "$work/pytest.log" 2>&1
status=$?
set -e
tail -n 3 "$work/pytest.log"
summary="$here/trl_compat_summary.json"
if [[ "${GTPO_TRL_COMPAT_BASELINE:-0}" == 1 ]]; then summary="$here/trl_compat_summary_baseline.json"; fi
cp "$work/trl_compat_summary.json" "$summary"
"$here/.venv/bin/python" - "$summary" "$here/trl_compat_summary_baseline.json" <<'PY'
import json, os, sys
summary = json.load(open(sys.argv[1]))
baseline = json.load(open(sys.argv[2]))["tests"] if os.path.isfile(sys.argv[2]) and sys.argv[1] != sys.argv[2] else {}
if baseline:
    same = sum(1 for node, r in summary["tests"].items() if r["outcome"] == "failed"
               and baseline.get(node, {}).get("outcome") in ("failed", "offline"))
    print(f"of the failures, {same} also fail with TRL's own GRPOTrainer (baseline)")
print("counts:", json.dumps(summary["counts"], sort_keys=True))
for kind in ("failed", "refused", "offline"):
    for node, result in summary["tests"].items():
        if result["outcome"] == kind:
            also = " [fails with GRPOTrainer too]" if baseline.get(node, {}).get("outcome") in ("failed", "offline") else ""
            print(f"{kind:8s} {node.split('::', 1)[-1]}: {result['message'][:160]}{also}")
PY
exit 0
