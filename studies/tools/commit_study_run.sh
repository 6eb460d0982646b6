#!/usr/bin/env bash
# The --after_run hook of studies/tools/run_study.sh: refresh a study's summary and figures, then commit the run that
# just finished (gtpo compare sets GTPO_RUN_DIR to its folder) with them: run.json, metrics.jsonl, its eval/ where
# the study evaluates, its completions/ (the per-step record of its completions, small parquet files) where training
# wrote one, its launch log as train-log.txt (absolute paths made relative), and the study's compare.json,
# code-commit, pinned recipe.yaml (if any), summary and figures. Never checkpoints, weights or the raw logs
# (.gitignore keeps them out too). A pre-registered study (PREREGISTRATION.md in
# its folder) is committed run by run too, but until its last run the aggregation withholds every estimate (the
# summary says only how many runs have finished, and draws no figures): no interim look. That needs a pinned code
# commit whose gtpo.compare.report does so (issue 38, item 6).
#
#   GTPO_RUN_DIR=studies/NAME/runs/ARM/seedS studies/tools/commit_study_run.sh studies/NAME PYTHON
#
# PYTHON: the interpreter whose gtpo aggregates (the pinned worktree's). GTPO_STUDY_NO_COMMIT=1 only aggregates.
set -euo pipefail
study=${1:?usage: studies/tools/commit_study_run.sh STUDY_DIR PYTHON}
python=${2:?usage: studies/tools/commit_study_run.sh STUDY_DIR PYTHON}
run=${GTPO_RUN_DIR:?GTPO_RUN_DIR must name the run folder that finished}
"$python" -m gtpo.cli compare --output-dir "$study" --aggregate-only > /dev/null
[ -n "${GTPO_STUDY_NO_COMMIT:-}" ] && exit 0
paths=("$run/run.json" "$run/metrics.jsonl" "$study/compare.json" "$study/code-commit" "$study/summary.md"
       "$study/summary.json")
[ -d "$study/figures" ] && paths+=("$study/figures")  # none while a pre-registered study is incomplete
[ -d "$run/eval" ] && paths+=("$run/eval")
[ -d "$run/completions" ] && paths+=("$run/completions")
[ -f "$study/recipe.yaml" ] && paths+=("$study/recipe.yaml")
# The run's launch log, which backs "one launch and no resume": committed as train-log.txt with the checkout's
# absolute path replaced by "." and the home folder by "~" (train.log itself names this machine's paths and stays ignored).
if [ -f "$run/train.log" ]; then
    relative="s|$(pwd -P)|.|g; s|$PWD|.|g"
    case ${HOME:-/} in /) ;; *) relative+="; s|$HOME|~|g" ;; esac  # never a bare "/": it would rewrite every path
    sed "$relative" "$run/train.log" > "$run/train-log.txt"
    paths+=("$run/train-log.txt")
fi
for _ in 1 2 3 4 5 6 7 8 9 10; do
    if git add -- "${paths[@]}" && git commit -q -m "study $(basename "$study"): ${run#"$study"/runs/} finished" -- "$study"; then
        exit 0
    fi
    sleep 10  # another git command holds the index: try again
done
exit 1
