#!/usr/bin/env bash
# Run, or continue, one of the studies committed under studies/, from a pinned copy of the code, and commit each
# run (run.json, metrics.jsonl, eval/) and the refreshed summary as soon as it finishes.
#
#   studies/tools/run_study.sh smollm2-synthetic-lr2e-4     # study A: GTPO vs GRPO (+ gtpo-filter), lr 2e-4, 5 seeds, held-out eval
#   studies/tools/run_study.sh smollm2-synthetic-lr1e-3     # study B: the lr 1e-3 stress setting, 3 arms x 3 seeds
#   studies/tools/run_study.sh smollm2-synthetic-lr1e-3-c   # study C (pre-registered): runaways at lr 1e-3, 2 arms x 12 seeds
#   studies/tools/run_study.sh smollm2-synthetic-lr2e-4-d   # study D (pre-registered): held-out pass@1, 2 arms x 12 seeds
#   studies/tools/run_study.sh smollm2-synthetic-lr1e-3-e   # study E (pre-registered): the stall, 2 arms x 32 seeds x 15 steps
#   studies/tools/run_study.sh smollm2-synthetic-lr1e-3-ablations   # exploratory: the correction's parts, 7 arms x 5 seeds
#   studies/tools/run_study.sh smollm2-synthetic-lr1e-3-guard       # exploratory: the stall guard on C's stalled seeds
#   studies/tools/run_study.sh smollm2-synthetic-lr2e-4-d-rerun     # exploratory: D's two failed GTPO seeds, recorded
#   studies/tools/run_study.sh smollm2-synthetic-lr2e-4-f           # study F (pre-registered): GTPO + guard vs GRPO
#   studies/tools/run_study.sh smollm2-synthetic-lr2e-4-guard-gamma # exploratory: F's two runaway seeds with γ = 0
#   studies/tools/run_study.sh smollm2-two-step-pilot               # exploratory: the two-step task's pilot (issue 48)
#   studies/tools/run_study.sh smollm2-two-step-g                   # study G (pre-registered): the two-step task
#   studies/tools/run_study.sh smollm2-two-step-g-repro             # exploratory: does G's gtpo/seed417 repeat on this CPU?
#   studies/tools/run_study.sh smollm2-two-step-h-screen-control    # exploratory: G's gtpo/seed417 at the screen's code
#   studies/tools/run_study.sh smollm2-two-step-h-screen            # exploratory: the common-prefix variant at 13 of G's seeds
#   studies/tools/run_study.sh smollm2-two-step-h-parts             # exploratory: the filter, Eq. 5 or γ off, at G's low seeds
#   studies/tools/run_study.sh smollm2-two-step-h-parts-others      # exploratory: the chosen part arm at 6 other seeds
#   studies/tools/run_study.sh smollm2-two-step-h                   # study H (pre-registered): GTPO, a variant, GRPO
#
# From the repository root, with nothing heavy beside it (2 cores: a float32 run takes ~25-30 min with its
# evaluation, longer beside other work). The first call pins the code: it writes the commit to studies/NAME/code-commit and makes a git
# worktree of that commit in .study/code-<commit> with its own .venv (scripts/setup.sh), so edits to the
# checkout cannot change a running study. Every later call, on any machine, runs the same commit; finished runs
# are skipped, an interrupted one resumes from its newest checkpoint (every 5 steps). Run it in the background:
#   mkdir -p .study; nohup setsid studies/tools/run_study.sh NAME >> .study/NAME.log 2>&1 &
# Set GTPO_STUDY_NO_COMMIT=1 to run without committing.
set -euo pipefail
cd "$(dirname "$0")/../.."
known="smollm2-synthetic-lr2e-4, smollm2-synthetic-lr1e-3, smollm2-synthetic-lr1e-3-c, smollm2-synthetic-lr2e-4-d, smollm2-synthetic-lr1e-3-e, smollm2-synthetic-lr1e-3-ablations, smollm2-synthetic-lr1e-3-guard, smollm2-synthetic-lr2e-4-d-rerun, smollm2-synthetic-lr2e-4-f, smollm2-synthetic-lr2e-4-guard-gamma, smollm2-two-step-pilot, smollm2-two-step-g, smollm2-two-step-g-repro, smollm2-two-step-h-screen-control, smollm2-two-step-h-screen, smollm2-two-step-h-parts, smollm2-two-step-h-parts-others, smollm2-two-step-h"
name=${1:?usage: studies/tools/run_study.sh NAME (one of: $known)}
study=studies/$name
# Study A reads the recipe from the checkout (its compare.json was written so; the recipe's only change since
# its code commit, dtype bfloat16 -> auto, is overridden by --dtype float32). Later studies pin a copy of the
# recipe of their code commit in the study folder (studies/NAME/recipe.yaml), so no edit can change them.
recipe=recipes/smollm2/synthetic/gtpo.yaml
pinned_recipe=$study/recipe.yaml
pinned_from=recipes/smollm2/synthetic/gtpo.yaml  # the recipe of the code commit that a study pins a copy of
# >>> The dtype of studies C and D: the lead sets it before their first run (float32 on this project's CPU, which
# >>> emulates bf16; a GPU may take bfloat16), in the same commit as the PREREGISTRATION.md that states it.
dtype_cd=float32

case $name in
    smollm2-synthetic-lr2e-4)
        # The recipe as shipped (lr 2e-4, 40 steps) but in float32; held-out pass@k / maj@k, k = 1..8, on 100
        # test problems. float32 because this project's 2-core CPU (AMD EPYC, AVX2, no AVX512-BF16 or AMX)
        # computes bf16 in software: a bf16 step took 350 s, a float32 step 26-55 s (measured 2026-11-25).
        # The third arm, gtpo-filter (the paper's Figure 10c filter, on whatever the seed's initial entropy), was
        # added after the first two were complete: compare.json lists it (written by `gtpo compare` of a later
        # commit, which adds arms; the pinned code accepts the arms compare.json lists), and its runs use the
        # same pinned code as the others.
        args=(--recipe "$recipe" --variant 'gtpo:' --variant 'grpo:--algorithm grpo'
              --variant 'gtpo-filter:--entropy_filter always' --seeds 0 1 2 3 4
              --save-steps 5 --eval --eval-n 8 --eval-limit 100 --eval-batch-size 100 --eval-dtype float32
              -- --max_steps 40 --dtype float32) ;;
    smollm2-synthetic-lr1e-3)
        # The stress setting of the first, partial study: lr 1e-3, three arms, no held-out evaluation; float32
        # for the reason above (the partial study ran in bf16 on a CPU with bf16 units).
        recipe=$pinned_recipe
        args=(--recipe "$recipe" --variant 'gtpo:' --variant 'grpo:--algorithm grpo'
              --variant 'entropy-only:--conflict_correction false' --seeds 0 1 2
              --save-steps 5 -- --learning_rate 1e-3 --max_steps 40 --dtype float32) ;;
    smollm2-synthetic-lr1e-3-c)
        # Study C, pre-registered in studies/smollm2-synthetic-lr1e-3-c/PREREGISTRATION.md (committed before its
        # first run): does GTPO prevent the runaway of study B? gtpo against grpo, 12 fresh seeds, training only.
        # `gtpo compare` runs seeds in the outer loop (gtpo/seed100, grpo/seed100, gtpo/seed101, ...), so a stopped
        # study has whole pairs.
        recipe=$pinned_recipe
        args=(--recipe "$recipe" --variant 'gtpo:' --variant 'grpo:--algorithm grpo'
              --seeds 100 101 102 103 104 105 106 107 108 109 110 111
              --save-steps 5 -- --learning_rate 1e-3 --max_steps 40 --dtype "$dtype_cd") ;;
    smollm2-synthetic-lr2e-4-d)
        # Study D, pre-registered in studies/smollm2-synthetic-lr2e-4-d/PREREGISTRATION.md: the recipe as shipped
        # (lr 2e-4), gtpo against grpo, 12 fresh paired seeds, study A's held-out evaluation (100 problems x 8
        # samples, 96 tokens, temperature 1). Eval batch: 200 completions per generate call (25 problems x 8).
        recipe=$pinned_recipe
        args=(--recipe "$recipe" --variant 'gtpo:' --variant 'grpo:--algorithm grpo'
              --seeds 100 101 102 103 104 105 106 107 108 109 110 111
              --save-steps 5 --eval --eval-n 8 --eval-limit 100 --eval-batch-size 200 --eval-dtype float32
              -- --max_steps 40 --dtype "$dtype_cd") ;;
    smollm2-synthetic-lr1e-3-e)
        # Study E, pre-registered in studies/smollm2-synthetic-lr1e-3-e/PREREGISTRATION.md: does the conflict
        # correction make GTPO stall on the partial format credit at lr 1e-3 (study C's post-hoc finding)? gtpo
        # against gtpo without it, 32 fresh paired seeds, 15 steps, training only.
        recipe=$pinned_recipe
        args=(--recipe "$recipe" --variant 'gtpo:' --variant 'gtpo-nocc:--conflict_correction false'
              --seeds 200 201 202 203 204 205 206 207 208 209 210 211 212 213 214 215
                      216 217 218 219 220 221 222 223 224 225 226 227 228 229 230 231
              --save-steps 5 -- --learning_rate 1e-3 --max_steps 15 --dtype "$dtype_cd") ;;
    smollm2-synthetic-lr1e-3-ablations)
        # Exploratory (issue 38, item 3; no registration): which part of the conflict correction makes GTPO stall on
        # the partial format credit? Study C's five stalled seeds at its settings (lr 1e-3, 15 steps), GTPO as shipped
        # (the control: its first steps must match C's) against one flag each: the leading span only, the trailing
        # span only, no doubling, doubling without protecting negatives, protection without promotion (λ 0 for both
        # signs inside the spans), and the authors' released arithmetic (authors_code).
        recipe=$pinned_recipe
        args=(--recipe "$recipe" --variant 'gtpo:'
              --variant 'forward-only:--conflict_span_sides forward'
              --variant 'backward-only:--conflict_span_sides backward'
              --variant 'no-doubling:--conflict_positive_weight 1'
              --variant 'no-protection:--conflict_negative_weight 1'
              --variant 'protect-only:--conflict_positive_weight 0'
              --variant 'authors-code:--authors_code true'
              --seeds 100 104 105 108 110
              --save-steps 5 -- --learning_rate 1e-3 --max_steps 15 --dtype float32) ;;
    smollm2-synthetic-lr1e-3-guard)
        # Exploratory (issue 38, item 4; no registration): does the stall guard (--conflict_guard: λ 0 on span tokens
        # the group's advantages push down, 1 on the others) keep study C's stalled seeds from stalling? GTPO as
        # shipped (the control: it must stall here too) and GTPO with the guard, at C's settings for 15 steps (E's
        # stall rule). GTPO without the correction at these seeds: C's post-hoc runs, and E's gtpo-nocc arm.
        recipe=$pinned_recipe
        args=(--recipe "$recipe" --variant 'gtpo:' --variant 'gtpo-guard:--conflict_guard true'
              --seeds 100 104 105 108 110
              --save-steps 5 -- --learning_rate 1e-3 --max_steps 15 --dtype float32) ;;
    smollm2-synthetic-lr2e-4-d-rerun)
        # Exploratory (issue 38, item 3; no registration): study D's two failed GTPO seeds at D's settings (the recipe's
        # lr 2e-4, 40 steps, float32), now with their completions on record: 105 (the partial-format stall) and 110
        # (format learned, accuracy lost); GTPO as shipped (its first steps must match D's) and with the guard.
        recipe=$pinned_recipe
        args=(--recipe "$recipe" --variant 'gtpo:' --variant 'gtpo-guard:--conflict_guard true'
              --seeds 105 110 --save-steps 5 -- --max_steps 40 --dtype float32) ;;
    smollm2-synthetic-lr2e-4-f)
        # Study F, pre-registered in studies/smollm2-synthetic-lr2e-4-f/PREREGISTRATION.md: GTPO with the stall guard
        # against GRPO at the recipe's learning rate, 20 fresh paired seeds, study D's held-out evaluation.
        recipe=$pinned_recipe
        args=(--recipe "$recipe" --variant 'gtpo-guard:--conflict_guard true' --variant 'grpo:--algorithm grpo'
              --seeds 300 301 302 303 304 305 306 307 308 309 310 311 312 313 314 315 316 317 318 319
              --save-steps 5 --eval --eval-n 8 --eval-limit 100 --eval-batch-size 200 --eval-dtype float32
              -- --max_steps 40 --dtype float32) ;;
    smollm2-synthetic-lr2e-4-guard-gamma)
        # Exploratory (after study F's analysis; no registration): two gtpo-guard runs of F ran to the length limit
        # (seeds 309, 314). Candidate: where all eight rewards are equal, A = 0 and Eq. 7's shift gives every
        # completion A' = -γ⟨H⟩ < 0, a push down on every sampled token, the end of sequence included (docs/core.md),
        # which Eq. 5's doubled push on a shared ending no longer offsets under the guard. Test: the same two seeds with
        # γ = 0, and the guard as in F (the control: it must repeat F's runs). F's code commit (code-commit written
        # before the first start), F's settings, no held-out evaluation.
        recipe=$pinned_recipe
        args=(--recipe "$recipe" --variant 'guard-nogamma:--conflict_guard true --entropy_gamma 0'
              --variant 'gtpo-guard:--conflict_guard true'
              --seeds 309 314 --save-steps 5 -- --max_steps 40 --dtype float32) ;;
    smollm2-two-step-pilot)
        # Exploratory (issue 48, item 3; no registration): the two-step task ("What is 7 + 5 - 3?"), GTPO as its recipe
        # ships and GRPO, two pilot seeds outside every study's range, 60 steps (checkpoints every 20, so step 40 can
        # be evaluated too), float32, study D's held-out evaluation (100 test problems x 8 samples). Chooses G's step
        # count and learning rate: both arms must learn clearly above their start.
        recipe=$pinned_recipe
        pinned_from=recipes/smollm2/two-step/gtpo.yaml
        args=(--recipe "$recipe" --variant 'gtpo:' --variant 'grpo:--algorithm grpo'
              --seeds 390 391
              --save-steps 20 --eval --eval-n 8 --eval-limit 100 --eval-batch-size 200 --eval-dtype float32
              -- --max_steps 60 --dtype float32) ;;
    smollm2-two-step-g)
        # Study G, pre-registered in studies/smollm2-two-step-g/PREREGISTRATION.md (issue 48): GTPO as the two-step
        # recipe ships against GRPO, 20 fresh paired seeds, study D's held-out evaluation on the two-step task. The
        # step count and learning rate are the registration's (40 steps at the recipe's 2e-4, chosen on the pilot).
        # It refuses to start from a draft.
        registered=G
        recipe=$pinned_recipe
        pinned_from=recipes/smollm2/two-step/gtpo.yaml
        args=(--recipe "$recipe" --variant 'gtpo:' --variant 'grpo:--algorithm grpo'
              --seeds 400 401 402 403 404 405 406 407 408 409 410 411 412 413 414 415 416 417 418 419
              --save-steps 5 --eval --eval-n 8 --eval-limit 100 --eval-batch-size 200 --eval-dtype float32
              -- --max_steps 40 --dtype float32) ;;
    smollm2-two-step-g-repro|smollm2-two-step-h-screen-control)
        # Exploratory (no registration): G's gtpo/seed417 again, with G's recipe and settings and G's held-out
        # evaluation, so that the screen below may use G's committed runs as its comparison. g-repro at G's code commit
        # (code-commit written before its first start): do G's runs repeat on the CPU at hand? h-screen-control at the
        # screen's code commit: is the screen's difference from G's runs the variant's and not the code's? Each run's
        # metrics.jsonl and eval/ are compared with G's gtpo/seed417 (docs/studies/lockin.md).
        recipe=$pinned_recipe
        pinned_from=recipes/smollm2/two-step/gtpo.yaml
        args=(--recipe "$recipe" --variant 'gtpo:'
              --seeds 417
              --save-steps 5 --eval --eval-n 8 --eval-limit 100 --eval-batch-size 200 --eval-dtype float32
              -- --max_steps 40 --dtype float32) ;;
    smollm2-two-step-h-screen)
        # Exploratory screen before study H (no registration): GTPO with conflict_exclude_common_prefix (GRPO's
        # update on the leading tokens whose whole prefix a positive and a negative completion share, Eq. 5
        # elsewhere), chosen from studies/tools/lockin_tokens.py on G's and E's records (docs/studies/lockin.md), at G's
        # seven low seeds (GTPO held-out pass@1 below 11 percent: 400 404 405 407 410 417 418) and six of the
        # thirteen others chosen without looking at their outcomes (the six lowest-numbered: 401 402 403 406 408
        # 409), low and other alternating so that a stopped screen has both. G's settings and held-out evaluation;
        # G's gtpo and grpo runs at these seeds are the comparison (see the control above).
        recipe=$pinned_recipe
        pinned_from=recipes/smollm2/two-step/gtpo.yaml
        args=(--recipe "$recipe" --variant 'common-prefix:--conflict_exclude_common_prefix true'
              --seeds 404 401 417 402 407 403 410 406 418 408 400 409 405
              --save-steps 5 --eval --eval-n 8 --eval-limit 100 --eval-batch-size 200 --eval-dtype float32
              -- --max_steps 40 --dtype float32) ;;
    smollm2-two-step-h-parts)
        # Exploratory (no registration), after the screen above found the common-prefix variant failing at six of G's
        # seven low seeds (held-out pass@1 below 11 percent; docs/studies/lockin.md): which of GTPO's three differences
        # from GRPO at these seeds carries the failure? The entropy filter (Eq. 6; on at all seven, whose initial
        # entropy is below ln 2), the conflict correction (Eq. 5) and the entropy term (gamma): each arm turns one off.
        # G's seven low seeds in the screen's order, the filter's arm first at each; G's settings and held-out
        # evaluation; the screen's code (code-commit written before the first run), so that G's gtpo and grpo runs and
        # the screen's at these seeds are the comparison.
        recipe=$pinned_recipe
        pinned_from=recipes/smollm2/two-step/gtpo.yaml
        args=(--recipe "$recipe" --variant 'no-filter:--entropy_filter never'
              --variant 'no-correction:--conflict_correction false' --variant 'no-entropy-term:--entropy_gamma 0'
              --seeds 404 417 407 410 418 400 405
              --save-steps 5 --eval --eval-n 8 --eval-limit 100 --eval-batch-size 200 --eval-dtype float32
              -- --max_steps 40 --dtype float32) ;;
    smollm2-two-step-h-parts-others)
        # Exploratory (no registration), after the parts screen above: the arm its rule chose (no-filter,
        # --entropy_filter never) at the common-prefix screen's six other seeds (401 402 403 406 408 409, where G's GTPO
        # did not fail), as issue 56 asks of a screened candidate: what turning the part off costs where GTPO did not
        # fail, and the 13-seed SD of variant - grpo from which h_pairs gives H's number of seeds. G's settings and
        # held-out evaluation; the screens' code (code-commit written before the first run), so G's runs at these seeds
        # are the comparison.
        recipe=$pinned_recipe
        pinned_from=recipes/smollm2/two-step/gtpo.yaml
        args=(--recipe "$recipe" --variant 'no-filter:--entropy_filter never'
              --seeds 401 402 403 406 408 409
              --save-steps 5 --eval --eval-n 8 --eval-limit 100 --eval-batch-size 200 --eval-dtype float32
              -- --max_steps 40 --dtype float32) ;;
    smollm2-two-step-h)
        # Study H, pre-registered in studies/smollm2-two-step-h/PREREGISTRATION.md (issue 56): the paper's GTPO, the
        # variant chosen from the screens before it (docs/studies/lockin.md) and GRPO, in this order at each seed, fresh
        # seeds from 500, G's settings and held-out evaluation, the two-step recipe pinned. The variant arm and the
        # number of seeds are the registration's (analyze_preregistered.py's H_ARMS, h_pairs). It refuses to start
        # from a draft.
        registered=H
        recipe=$pinned_recipe
        pinned_from=recipes/smollm2/two-step/gtpo.yaml
        args=(--recipe "$recipe" --variant 'gtpo:' --variant 'no-filter:--entropy_filter never'
              --variant 'grpo:--algorithm grpo'
              --seeds 500 501 502 503 504 505 506 507 508 509 510 511 512 513 514 515 516 517 518 519
              --save-steps 5 --eval --eval-n 8 --eval-limit 100 --eval-batch-size 200 --eval-dtype float32
              -- --max_steps 40 --dtype float32) ;;
    *) echo "run_study.sh: unknown study '$name'; known: $known" >&2
       exit 2 ;;
esac

# A pre-registered study (its case sets registered=LETTER) never starts its first run from a draft (a PREREGISTRATION.md
# beginning "> DRAFT") or without one, so no run can precede the registration's commit.
if [ -n "${registered:-}" ]; then
    if grep -q '^> DRAFT' "$study/PREREGISTRATION.md" 2>/dev/null || [ ! -f "$study/PREREGISTRATION.md" ]; then
        echo "run_study.sh: $study/PREREGISTRATION.md is a draft or missing: register study $registered before its first run" >&2
        exit 2
    fi
fi
mkdir -p "$study"
[ -f "$study/code-commit" ] || git rev-parse HEAD > "$study/code-commit"
commit=$(cat "$study/code-commit")
code=.study/code-${commit:0:12}
if [ ! -d "$code" ]; then
    git worktree add --detach "$code" "$commit"
fi
bash "$code/scripts/setup.sh"
if [ "$recipe" = "$pinned_recipe" ] && [ ! -f "$pinned_recipe" ]; then
    cp "$code/$pinned_from" "$pinned_recipe"
fi
python=$PWD/$code/.venv/bin/python   # its editable gtpo is the pinned worktree's src/

# After each finished (and evaluated) run: refresh the summary and commit the run's small files with it.
after_run="studies/tools/commit_study_run.sh $(printf %q "$study") $(printf %q "$python")"  # a shell command line
echo "run_study.sh: $name at $(date -u +%FT%TZ), code $commit"
"$python" -m gtpo.cli compare --output-dir "$study" --after-run "$after_run" "${args[@]}"
