#!/usr/bin/env bash
# The --after_run hook of scripts/run_study.sh: refresh a study's summary and figures, then commit the run that
# just finished (gtpo compare sets GTPO_RUN_DIR to its folder) with them: run.json, metrics.jsonl, its eval/ where
# the study evaluates, and the study's compare.json, code-commit, pinned recipe.yaml (if any), summary and figures.
# Never checkpoints, weights or logs (.gitignore keeps them out too).
#
#   GTPO_RUN_DIR=studies/NAME/runs/ARM/seedS scripts/commit_study_run.sh studies/NAME PYTHON
#
# PYTHON: the interpreter whose gtpo aggregates (the pinned worktree's). GTPO_STUDY_NO_COMMIT=1 only aggregates.
set -euo pipefail
study=${1:?usage: scripts/commit_study_run.sh STUDY_DIR PYTHON}
python=${2:?usage: scripts/commit_study_run.sh STUDY_DIR PYTHON}
run=${GTPO_RUN_DIR:?GTPO_RUN_DIR must name the run folder that finished}
"$python" -m gtpo.cli compare --output-dir "$study" --aggregate-only > /dev/null
[ -n "${GTPO_STUDY_NO_COMMIT:-}" ] && exit 0
paths=("$run/run.json" "$run/metrics.jsonl" "$study/compare.json" "$study/code-commit" "$study/summary.md"
       "$study/summary.json" "$study/figures")
[ -d "$run/eval" ] && paths+=("$run/eval")
[ -f "$study/recipe.yaml" ] && paths+=("$study/recipe.yaml")
for _ in 1 2 3 4 5 6 7 8 9 10; do
    if git add -- "${paths[@]}" && git commit -q -m "study $(basename "$study"): ${run#"$study"/runs/} finished" -- "$study"; then
        exit 0
    fi
    sleep 10  # another git command holds the index: try again
done
exit 1
