"""studies/tools/analyze_preregistered.py computes studies C and D's primary outcomes exactly as their
pre-registrations say: checked on synthetic run folders against Fisher p-values and t-intervals derived by hand (the
derivation is in each test), against the committed study B (the rule reproduces its documented pattern), and against
the figures the pre-registrations quote."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import pytest

from cli_helpers import load_script  # noqa: E402
from study_pages import page  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
analysis = load_script("analyze_preregistered")


def _run(study: Path, arm: str, seed: int, clipped: list[float], status: str = "finished", eval_pass1=None) -> None:
    run = study / "runs" / arm / f"seed{seed}"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"status": status}))
    rows = [{"step": i + 1, "completions/clipped_ratio": c} for i, c in enumerate(clipped)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if eval_pass1 is not None:
        (run / "eval" / "synthetic").mkdir(parents=True)
        results = {"pass@k": {"1": eval_pass1, "8": 1.0}}
        (run / "eval" / "synthetic" / "results.json").write_text(json.dumps(results))


def test_fisher_p_values_match_hand_enumeration():
    """Margins 3 gtpo runs, 4 runaways of 9: P(X = x) = C(4,x) C(5,3-x) / C(9,3) = 10, 40, 30, 4 (/84); 0 of 3
    runaways is as likely or less for x = 0 and 3: two-sided 14/84 (study B's documented p), one-sided 10/84.
    12 against 12, 0 against 6 runaways: P(0) = P(6) = C(18,12)/C(24,12) = 18564/2704156, the least likely tables."""
    assert analysis.fisher_exact(0, 3, 4, 2) == pytest.approx(14 / 84, rel=1e-12)
    assert analysis.fisher_exact(0, 3, 4, 2, "less") == pytest.approx(10 / 84, rel=1e-12)
    tail = float(Fraction(math.comb(18, 12), math.comb(24, 12)))
    assert analysis.fisher_exact(0, 12, 6, 6) == pytest.approx(2 * tail, rel=1e-12)
    assert analysis.fisher_exact(0, 12, 6, 6, "less") == pytest.approx(tail, rel=1e-12)
    assert analysis.fisher_exact(3, 3, 3, 3) == pytest.approx(1.0)


def test_fisher_power_is_the_rejected_outcomes_probability():
    """At rates 0 and 1 every run of one arm runs away and none of the other: the one table 0/n vs n/n, p = 1/C(2n,n)
    one-sided (12: rejected, power 1; 3 against 3: 1/20 = 0.05, rejected at <= 0.05; two-sided 0.1, never)."""
    assert analysis.fisher_power(12, 12, 0.0, 1.0, "less") == pytest.approx(1.0)
    assert analysis.fisher_power(3, 3, 0.0, 1.0, "less") == pytest.approx(1.0)
    assert analysis.fisher_power(3, 3, 0.0, 1.0) == 0.0


def test_t_quantile_and_power_match_known_values():
    """t_{0.975,11} = 2.201 (any t table, as gtpo.compare.stats); with no effect the test rejects 5 % of the time."""
    assert analysis.t_quantile(0.975, 11) == pytest.approx(2.201, abs=5e-4)
    assert analysis.t_quantile(0.975, 4) == pytest.approx(2.776, abs=5e-4)
    assert analysis.paired_t_power(0.0, 10.0, 12) == pytest.approx(0.05, abs=1e-4)


def test_runaway_rule_as_registered(tmp_path):
    """>= 0.5 clipped at 6 of the last 10 of 40 steps is a runaway, 5 is not; 0.5 itself counts; a run not finished
    or short of 40 steps does not count; of a step logged twice (a resume) the last record counts."""
    study = tmp_path / "c"
    _run(study, "grpo", 100, [0.0] * 34 + [0.5] * 6)
    _run(study, "grpo", 101, [1.0] * 30 + [0.49] * 5 + [1.0] * 5)
    _run(study, "grpo", 102, [1.0] * 40, status="running")
    _run(study, "gtpo", 100, [1.0] * 39)
    _run(study, "gtpo", 101, [0.0] * 40)
    metrics = study / "runs" / "gtpo" / "seed101" / "metrics.jsonl"
    again = [{"step": s, "completions/clipped_ratio": 1.0} for s in range(31, 41)]
    metrics.write_text(metrics.read_text() + "".join(json.dumps(r) + "\n" for r in again) + '{"step": 4')
    runs = study / "runs"
    assert [analysis.runaway(runs / "grpo" / f"seed{s}") for s in (100, 101, 102)] == [True, False, None]
    assert analysis.runaway(runs / "gtpo" / "seed100") is None and analysis.runaway(runs / "gtpo" / "seed101")
    result = analysis.study_c(study)
    assert result["arms"]["grpo"] == {"runs": 2, "ran_away": 1, "seeds": [100]}
    assert result["arms"]["gtpo"] == {"runs": 1, "ran_away": 1, "seeds": [101]}


def test_the_rule_reproduces_study_bs_pattern():
    """On the committed study B the registered rule finds the runs the study document lists as ending at the length
    limit: no gtpo run, grpo seeds 1 and 2 (entropy-only, not an arm of C, aside)."""
    result = analysis.study_c(ROOT / "studies" / "smollm2-synthetic-lr1e-3")
    assert result["arms"]["gtpo"] == {"runs": 3, "ran_away": 0, "seeds": []}
    assert result["arms"]["grpo"] == {"runs": 3, "ran_away": 2, "seeds": [1, 2]}
    assert result["p_two_sided"] == pytest.approx(0.4)  # [[0,3],[2,1]]: (C(2,0)C(4,3) + C(2,2)C(4,1)) / C(6,3) = 8/20
    # One-sided, as study C registers its test: P(gtpo runaways <= 0) = C(2,0)C(4,3) / C(6,3) = 4/20.
    assert result["p_one_sided_gtpo_less"] == pytest.approx(0.2)
    assert result["reject"] is False


def test_study_c_rejects_on_the_one_sided_p_its_preregistration_registers(tmp_path):
    """Study C's PREREGISTRATION.md registers Fisher's test one-sided (GTPO lower) at alpha 0.05, so a table whose
    one-sided p is below 0.05 rejects H0 even where the two-sided p is not. First gtpo 0 of 5, grpo 4 of 5 runaways:
    one-sided C(4,0)C(6,5) / C(10,5) = 6/252, two-sided 12/252 (x = 0 and x = 4 are the two least likely tables)."""
    text = (ROOT / "studies" / "smollm2-synthetic-lr1e-3-c" / "PREREGISTRATION.md").read_text()
    assert "Fisher's exact test of that table, **one-sided**" in text and "**α = 0.05**" in text
    study = tmp_path / "c"
    for seed in range(5):
        _run(study, "gtpo", seed, [0.0] * 40)
        _run(study, "grpo", seed, [1.0 if seed < 4 else 0.0] * 40)
    result = analysis.study_c(study)
    assert result["p_one_sided_gtpo_less"] == pytest.approx(6 / 252)
    assert result["p_two_sided"] == pytest.approx(12 / 252)
    assert result["reject"] is True
    # A table significant one-sided only: gtpo 1 of 6, grpo 5 of 6. One-sided: (C(6,0)C(6,6) + C(6,1)C(6,5)) /
    # C(12,6) = 37/924 = 0.040; two-sided adds the mirror tables, 74/924 = 0.080: rejected only one-sided.
    study = tmp_path / "c2"
    for seed in range(6):
        _run(study, "gtpo", seed, [1.0 if seed == 0 else 0.0] * 40)
        _run(study, "grpo", seed, [1.0 if seed < 5 else 0.0] * 40)
    result = analysis.study_c(study)
    assert result["p_one_sided_gtpo_less"] == pytest.approx(37 / 924)
    assert result["p_two_sided"] == pytest.approx(74 / 924)
    assert result["reject"] is True


def test_study_d_interval_matches_hand_computation(tmp_path):
    """12 seeds, differences +5 at six and -1 at six: mean 2, s = sqrt(12 * 9 / 11) = 3.1334, half-width
    2.201 * s / sqrt(12) = 1.9909: [0.0091, 3.9909]. A seed whose grpo evaluation is missing is left out."""
    study = tmp_path / "d"
    for seed in range(100, 112):
        _run(study, "gtpo", seed, [0.0] * 40, eval_pass1=0.45 if seed < 106 else 0.39)
        _run(study, "grpo", seed, [0.0] * 40, eval_pass1=0.40)
    _run(study, "gtpo", 112, [0.0] * 40, eval_pass1=0.9)
    _run(study, "grpo", 112, [0.0] * 40)
    result = analysis.study_d(study)
    assert result["seeds"] == list(range(100, 112))
    half = 2.201 * math.sqrt(108 / 11) / math.sqrt(12)
    assert result["mean"] == pytest.approx(2.0)
    assert (result["low"], result["high"]) == (pytest.approx(2 - half), pytest.approx(2 + half))
    assert half == pytest.approx(1.9909, abs=1e-4)


@pytest.mark.parametrize("name", ["smollm2-synthetic-lr1e-3-c", "smollm2-synthetic-lr2e-4-d"])
def test_preregistrations_quote_the_scripts_power(name):
    """The power figures each pre-registration states are the ones the committed script computes."""
    text = (ROOT / "studies" / name / "PREREGISTRATION.md").read_text()
    if name.endswith("-c"):
        expected = [f"{analysis.fisher_power(12, 12, a, b, 'less'):.2f}" for a, b in ((0, 2 / 3), (0.1, 0.5))]
        expected += [f"{analysis.fisher_power(12, 12, a, b):.2f}" for a, b in ((0, 2 / 3), (0.1, 0.5))]
    else:
        expected = [f"{analysis.detectable_effect(sd, 12):.1f}" for sd in (10, 29)]
        expected += [f"{analysis.paired_t_power(10, sd, 12):.2f}" for sd in (10, 29)]
    for figure in expected:
        assert figure in text, f"{figure} is not in {name}/PREREGISTRATION.md"


def test_per_run_table_reproduces_study_b_documented_rows():
    """The secondary per-run table (``runs``) on study B's committed runs gives the figures the study document's
    per-run table states for them (computed when study B ended, before this function existed): reward, format,
    entropy, length, clipped share over the last 10 steps and the most clipped step; and its runaway column is the
    primary rule's (grpo seeds 1, 2 and entropy-only seeds 0, 2)."""
    study_b = ROOT / "studies" / "smollm2-synthetic-lr1e-3"
    doc = page("b")
    documented = {line.split(" | ")[0][2:]: line.split(" | ") for line in doc.splitlines()
                  if line.startswith("| ") and "/seed" in line.split(" | ")[0] and line.count(" | ") == 8}  # fmt: skip
    table = analysis.runs_table(study_b)
    assert len(table) == 2 + 9
    ran_away = []
    for line in table[2:]:
        cells = line.strip("| ").split(" | ")
        doc_cells = documented[cells[0]]
        # run | reward | format % | entropy | length | clipped | ... | most clipped
        assert cells[1:6] == doc_cells[1:6], cells[0]
        assert cells[9] == doc_cells[7], cells[0]
        if cells[7] == "yes":
            ran_away.append(cells[0])
    assert ran_away == ["grpo/seed1", "grpo/seed2", "entropy-only/seed0", "entropy-only/seed2"]


def test_per_run_table_skips_unfinished_runs(tmp_path):
    """A run that is still running (or stopped before step 40) has no row: it cannot be read as an outcome."""
    common = {"reward": 1.0, "rewards/format_reward/mean": 10.0, "entropy": 0.1, "completions/mean_length": 20.0}
    for arm, seed, status, steps in (("gtpo", 1, "finished", 40), ("grpo", 1, "running", 12)):
        run = tmp_path / "runs" / arm / f"seed{seed}"
        run.mkdir(parents=True)
        (run / "run.json").write_text(json.dumps({"status": status}))
        rows = [{"step": i + 1, "completions/clipped_ratio": 0.0, **common} for i in range(steps)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = analysis.runs_table(tmp_path)
    assert [line.split(" | ")[0] for line in table[2:]] == ["| gtpo/seed1"]
    assert table[2].startswith("| gtpo/seed1 | 1.00 | 100.0 | 0.10 | 20.0 | 0 % | 0 | no | – | 0 % |")


def test_heldout_secondary_reproduces_study_a_post_hoc_length_figures():
    """Study D's registered secondary (held-out length and truncation, paired) computed by ``heldout`` on study A's
    committed evaluations gives the figures study A's document states for them (computed by hand, with t = 2.776, when
    study B ended): 32.5 [32.0, 33.0] against 35.5 [32.9, 38.2] tokens, paired −3.03 [−5.57, −0.48]; 0.23 % [0.02,
    0.43] against 3.70 [−0.08, 7.48], paired −3.48 [−7.36, 0.41]."""
    result = analysis.heldout(ROOT / "studies" / "smollm2-synthetic-lr2e-4")

    def text(d: dict, digits: int) -> str:
        return f"{d['mean']:.{digits}f} [{d['low']:.{digits}f}, {d['high']:.{digits}f}]"

    length, cut = result["held-out mean length (tokens)"], result["held-out cut at the limit (%)"]
    assert length["seeds"] == cut["seeds"] == [0, 1, 2, 3, 4]
    assert (text(length["gtpo"], 1), text(length["grpo"], 1)) == ("32.5 [32.0, 33.0]", "35.5 [32.9, 38.2]")
    assert text(length["gtpo - grpo"], 2) == "-3.03 [-5.57, -0.48]"
    assert (text(cut["gtpo"], 2), text(cut["grpo"], 2)) == ("0.23 [0.02, 0.43]", "3.70 [-0.08, 7.48]")
    assert text(cut["gtpo - grpo"], 2) == "-3.48 [-7.36, 0.41]"


def test_heldout_pairs_only_seeds_with_both_evaluations(tmp_path):
    """A seed whose grpo evaluation is missing (still running) is left out of every figure, not paired with nothing."""
    for arm, seed, length in (("gtpo", 1, 30.0), ("grpo", 1, 40.0), ("gtpo", 2, 20.0), ("gtpo", 3, 10.0),
                              ("grpo", 3, 14.0)):  # fmt: skip
        folder = tmp_path / "runs" / arm / f"seed{seed}" / "eval" / "synthetic"
        folder.mkdir(parents=True)
        (folder / "results.json").write_text(json.dumps({"mean_length": length, "truncated_frac": 0.0}))
    length = analysis.heldout(tmp_path)["held-out mean length (tokens)"]
    assert length["seeds"] == [1, 3]
    assert length["gtpo"]["mean"] == 20.0 and length["grpo"]["mean"] == 27.0
    assert length["gtpo - grpo"]["mean"] == -7.0  # (-10 + -4) / 2


# ------------------------------------------------------------------------------------------------------- study E


def _format_run(study: Path, arm: str, seed: int, formats: list[float], status: str = "finished") -> None:
    """A run whose step t logs format mean formats[t - 1] (and a clipped share, as every logged training step)."""
    run = study / "runs" / arm / f"seed{seed}"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"status": status}))
    rows = [
        {"step": t, "completions/clipped_ratio": 0.0, "rewards/format_reward/mean": f, "reward": f,
         "completions/mean_length": 20.0}
        for t, f in enumerate(formats, start=1)
    ]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_mcnemar_p_values_and_power_match_hand_derivations():
    """One-sided exact McNemar p = P(B >= b), B ~ Binomial(b + c, 1/2): 5 against 0 discordant pairs 1/32; 4 against
    1: (C(5,4) + C(5,5)) / 32 = 6/32; none discordant: 1. Power with 5 pairs, stall rates 1 and 0: every pair is
    discordant the same way, b = 5, p = 1/32 < 0.05, power 1; rates 0.5 and 0: rejected only when all 5 pairs are
    discordant, 0.5^5; 2 pairs at rates 1 and 0: p = 1/4 at best, power 0."""
    assert analysis.mcnemar_exact(5, 0) == pytest.approx(1 / 32)
    assert analysis.mcnemar_exact(4, 1) == pytest.approx(6 / 32)
    assert analysis.mcnemar_exact(0, 0) == 1.0 and analysis.mcnemar_exact(0, 3) == 1.0
    assert analysis.mcnemar_power(5, 1.0, 0.0) == pytest.approx(1.0)
    assert analysis.mcnemar_power(5, 0.5, 0.0) == pytest.approx(0.5**5)
    assert analysis.mcnemar_power(2, 1.0, 0.0) == 0.0


def test_study_e_rule_on_study_c_finds_the_documented_stalled_seeds():
    """The registered rule (no step 1-15 with format mean >= 1.25), applied to study C's committed runs with arms gtpo
    and grpo, finds the five GTPO stalls and the six first groups without the full format that the study document's
    post-hoc section states (seed 106's GTPO run found it at step 12), none in GRPO, and identical first groups."""
    result = analysis.study_e(ROOT / "studies" / "smollm2-synthetic-lr1e-3-c", arms=("gtpo", "grpo"))
    assert result["pairs"] == 12
    assert result["stalled"] == {"gtpo": [100, 104, 105, 108, 110], "grpo": []}
    assert result["first_group_without_full_format"] == [100, 104, 105, 106, 108, 110]
    assert result["first_full_format_step"]["gtpo"][106] == 12
    assert result["first_group_differs"] == []
    assert result["p_one_sided"] == pytest.approx(1 / 32)  # 5 discordant pairs, all one way
    doc = page("c")
    assert "seeds 100, 104, 105, 108, 110" in doc


def test_study_e_counts_only_complete_pairs_and_flags_differing_first_groups(tmp_path):
    """Seed 1: gtpo never reaches 1.25 in 15 steps (stalled), nocc at step 3. Seed 2: both at step 1 (concordant).
    Seed 3: gtpo stalled, but its nocc run is still running: no pair. Seed 4: gtpo reaches it at step 16 only, which
    the rule does not see (stalled), nocc at 2; its first groups differ (0.5 against 0.75), which is flagged. So b = 2
    (seeds 1, 4), c = 0: p = 1/4, not rejected; Fisher over the 3 seeds whose gtpo first group lacked the format
    (1, 3 is unpaired, 4): 2 of 2 against 0 of 2."""
    study = tmp_path / "e"
    _format_run(study, "gtpo", 1, [0.5] * 15)
    _format_run(study, "gtpo-nocc", 1, [0.5, 1.0, 1.25] + [10.0] * 12)
    _format_run(study, "gtpo", 2, [2.5] * 15)
    _format_run(study, "gtpo-nocc", 2, [2.5] * 15)
    _format_run(study, "gtpo", 3, [0.5] * 15)
    _format_run(study, "gtpo-nocc", 3, [0.5] * 7, status="running")
    _format_run(study, "gtpo", 4, [0.5] * 15 + [5.0])
    _format_run(study, "gtpo-nocc", 4, [0.75, 5.0] + [5.0] * 13)
    result = analysis.study_e(study)
    assert result["pairs"] == 3
    assert result["stalled"] == {"gtpo": [1, 4], "gtpo-nocc": []}
    assert result["discordant"] == {"gtpo only": [1, 4], "gtpo-nocc only": []}
    assert result["first_full_format_step"]["gtpo-nocc"] == {1: 3, 2: 1, 4: 2}
    assert result["first_group_without_full_format"] == [1, 4]
    assert result["first_group_differs"] == [4]
    assert result["p_one_sided"] == pytest.approx(1 / 4) and result["reject"] is False
    # Fisher, one-sided, nocc fewer stalls: table [[0, 2], [2, 0]], P(X <= 0) = C(2,0) C(2,2) / C(4,2) = 1/6.
    assert result["fisher_one_sided_secondary"] == pytest.approx(1 / 6)


def test_study_e_preregistration_quotes_the_scripts_power_and_runs_as_registered():
    """PREREGISTRATION.md's power table is the script's, and run_study.sh starts study E with the registered arms,
    seeds, steps, learning rate, dtype and pinned recipe, and no evaluation."""
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "compare"))
    from test_study_script import _seeds, _study_arguments, _variants

    name = "smollm2-synthetic-lr1e-3-e"
    text = (ROOT / "studies" / name / "PREREGISTRATION.md").read_text()
    for n in analysis.E_POWER_PAIRS:
        for a, b in analysis.E_POWER_RATES:
            assert f"{analysis.mcnemar_power(n, a, b):.3f}" in text, (n, a, b)
    assert "**one-sided**" in text and "**α = 0.05**" in text and "**200–231, 32 per arm**" in text
    words = _study_arguments(name)
    assert _variants(words) == ["gtpo:", "gtpo-nocc:--conflict_correction false"]
    assert _seeds(words) == list(range(200, 232))
    assert words[words.index("--save-steps") + 1] == "5" and words[words.index("--recipe") + 1] == "$recipe"
    common = words[words.index("--") + 1 :]
    assert common == ["--learning_rate", "1e-3", "--max_steps", "15", "--dtype", "$dtype_cd"]
    assert "--eval" not in words and "--max_steps 15 --dtype float32" in text
    assert analysis.E_ARMS == ("gtpo", "gtpo-nocc") and analysis.E_STEPS == 15


def test_per_seed_table_reproduces_study_a_documented_rows():
    """The secondary per-seed table (``seeds``) on study A's committed runs gives the rows study A's section states
    (written when study A ended, before this function existed), plus each seed's pass@1 difference, gtpo's
    results.json pass@1 minus grpo's, by hand."""
    study_a = ROOT / "studies" / "smollm2-synthetic-lr2e-4"
    doc = page("a")
    table = analysis.seeds_table(study_a)
    assert len(table) == 2 + 5
    for line in table[2:]:
        cells = line.strip("| ").split(" | ")
        assert f"| {' | '.join(cells[:4])} |" in doc, line
        gtpo, grpo = (
            100
            * json.loads((study_a / f"runs/{arm}/seed{cells[0]}/eval/synthetic/results.json").read_text())["pass@k"][
                "1"
            ]
            for arm in ("gtpo", "grpo")
        )
        assert cells[4] == f"{gtpo - grpo:+.1f}"


def test_study_f_primary_is_study_ds_computation_and_its_stall_secondary_counts_each_arm(tmp_path):
    """Study F (issue 38, item 5): arms gtpo-guard and grpo. Differences +3 at two seeds and -1 at two: mean 1,
    s = sqrt(4 * 4 / 3) = 2.3094, half-width t_{0.975,3} 3.182 * s / 2 = 3.6745. Stalls by E's rule (no format mean
    >= 1.25 in steps 1-15): grpo at seed 301 only, one discordant pair: P(B >= 1) = 0.5 for B ~ Bin(1, 1/2) that grpo
    stalls more, P(B >= 0) = 1 that the guard does."""
    study = tmp_path / "f"
    pass_at_1 = ((0.43, 0.40), (0.43, 0.40), (0.39, 0.40), (0.39, 0.40))  # (gtpo-guard, grpo) per seed
    for seed, (guard, grpo) in zip(range(300, 304), pass_at_1, strict=True):
        for arm, p1 in (("gtpo-guard", guard), ("grpo", grpo)):
            stalled = arm == "grpo" and seed == 301
            _format_run(study, arm, seed, [1.0] * 40 if stalled else [1.0] + [10.0] * 39)
            (study / "runs" / arm / f"seed{seed}" / "eval" / "synthetic").mkdir(parents=True)
            results = {"pass@k": {"1": p1, "8": 1.0}}
            run = study / "runs" / arm / f"seed{seed}"
            (run / "eval" / "synthetic" / "results.json").write_text(json.dumps(results))
    result = analysis.study_f(study)
    half = 3.182 * math.sqrt(16 / 3) / 2
    assert result["seeds"] == [300, 301, 302, 303] and result["mean"] == pytest.approx(1.0)
    assert (result["low"], result["high"]) == (pytest.approx(1 - half, abs=1e-3), pytest.approx(1 + half, abs=1e-3))
    stall = result["secondary_stall"]
    assert stall["pairs"] == 4 and stall["stalled"] == {"gtpo-guard": [], "grpo": [301]}
    assert stall["first_group_without_full_format"] == [300, 301, 302, 303]
    assert stall["p_one_sided_grpo_stalls_more"] == pytest.approx(0.5)  # P(B >= 1), B ~ Bin(1, 1/2)
    assert stall["p_one_sided_guard_stalls_more"] == pytest.approx(1.0)
    assert result["secondary_heldout"]["held-out mean length (tokens)"]["seeds"] == []  # no lengths evaluated here
    assert result["secondary_guard_spans"] == dict.fromkeys(range(300, 304))  # finished, but no completion record


def _assert_run_as_registered(name: str, registration: str, variants: list[str], seeds, steps: int) -> None:
    """run_study.sh starts study ``name`` as its registration says: these arms and seeds, checkpoints every 5 steps,
    the pinned recipe, the evaluation flags the registration quotes, ``steps`` steps in float32."""
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "compare"))
    from test_study_script import _seeds, _study_arguments, _variants

    words = _study_arguments(name)
    assert _variants(words) == variants
    assert _seeds(words) == list(seeds)
    assert words[words.index("--save-steps") + 1] == "5" and words[words.index("--recipe") + 1] == "$recipe"
    evaluation = words[words.index("--eval") : words.index("--")]
    assert " ".join(evaluation) in " ".join(registration.split()).replace("`", "")
    assert words[words.index("--") + 1 :] == ["--max_steps", str(steps), "--dtype", "float32"]


def test_study_f_preregistration_quotes_the_scripts_power_and_runs_as_registered():
    """PREREGISTRATION.md's power table is the script's, and run_study.sh starts study F with the registered arms,
    seeds, steps, dtype, evaluation and pinned recipe (the recipe's learning rate)."""
    name = "smollm2-synthetic-lr2e-4-f"
    text = (ROOT / "studies" / name / "PREREGISTRATION.md").read_text()
    for n in (16, analysis.F_PAIRS):
        assert f"{analysis.detectable_effect(analysis.D_SEED_SD, n):.1f} points" in text, n
        assert f"{analysis.paired_t_power(12.07, analysis.D_SEED_SD, n):.3f}" in text, n
        assert f"{analysis.paired_t_power(10, analysis.D_SEED_SD, n):.3f}" in text, n
    assert f"{analysis.t_quantile(0.975, analysis.F_PAIRS - 1):.3f}" in text
    assert "**300–319, 20 pairs**" in text and "**α = 0.05**" in text and analysis.F_PAIRS == 20
    variants = ["gtpo-guard:--conflict_guard true", "grpo:--algorithm grpo"]
    _assert_run_as_registered(name, text, variants, range(300, 320), steps=40)
    assert "--max_steps 40 --dtype float32" in text and analysis.F_ARMS == ("gtpo-guard", "grpo")


def test_study_g_preregistration_quotes_the_scripts_power_and_runs_as_registered():
    """Study G's PREREGISTRATION.md (issue 48) is registered (no draft line), its power table is the script's at the
    larger SD of D and F, and run_study.sh starts G with the registered arms, seeds 400-419, 40 steps, float32, D's
    evaluation and the two-step recipe pinned."""
    name = "smollm2-two-step-g"
    text = (ROOT / "studies" / name / "PREREGISTRATION.md").read_text()
    assert "> DRAFT" not in text
    d_sd = analysis.study_d(ROOT / "studies" / "smollm2-synthetic-lr2e-4-d")["sd"]  # the SDs measured so far
    f_sd = analysis.study_d(ROOT / "studies" / "smollm2-synthetic-lr2e-4-f", analysis.F_ARMS)["sd"]
    assert round(max(d_sd, f_sd), 2) == analysis.G_SEED_SD and analysis.G_PAIRS == 20
    for n in (20, 24, 28):
        row = f"{analysis.detectable_effect(analysis.G_SEED_SD, n):.1f} points"
        row += f"** | **{analysis.paired_t_power(10, analysis.G_SEED_SD, n):.3f}" if n == 20 else ""
        assert row in text, n
        assert f"{analysis.paired_t_power(5, analysis.G_SEED_SD, n):.3f}" in text, n
    half = analysis.t_quantile(0.975, analysis.G_PAIRS - 1) * analysis.G_SEED_SD / (analysis.G_PAIRS**0.5)
    assert f"expected 95 % half-width is {half:.1f} points" in text
    assert "**400–419, 20 pairs**" in text and "**α = 0.05**" in text
    _assert_run_as_registered(name, text, ["gtpo:", "grpo:--algorithm grpo"], range(400, 420), analysis.G_STEPS)
    assert "--max_steps 40 --dtype float32" in " ".join(text.split()).replace("`", "") and analysis.G_STEPS == 40
    script = (ROOT / "studies" / "tools" / "run_study.sh").read_text()
    assert "pinned_from=recipes/smollm2/two-step/gtpo.yaml" in script[script.index("    smollm2-two-step-g)") :]


def test_study_h_preregistration_quotes_the_screens_sd_and_runs_as_registered():
    """Study H's PREREGISTRATION.md (issue 56) is registered (no draft line); the SD and n it quotes are h-screen's on
    the committed screen runs (no-filter at the parts screen's seven low seeds and the follow-up's six, against G's
    grpo at the same seeds: 13 pairs, none missing) and ``h_pairs``' rule; run_study.sh starts H with H_ARMS' arms in
    their order, seeds 500 .. 500 + n - 1, G's evaluation, 40 steps in float32 and the two-step recipe pinned."""
    name = "smollm2-two-step-h"
    text = (ROOT / "studies" / name / "PREREGISTRATION.md").read_text()
    assert "> DRAFT" not in text and "(from the screen)" not in text
    studies = ROOT / "studies"
    parts, others = studies / "smollm2-two-step-h-parts", (studies / "smollm2-two-step-h-parts-others",)
    screen = analysis.h_screen(parts, studies / "smollm2-two-step-g", "no-filter", others)
    assert len(screen["seeds"]) == 13 and screen["missing"] == []
    sd, n = screen["h_pairs"]["screen_sd"], screen["h_pairs"]["n"]
    flat = " ".join(text.split())
    assert f"s = {sd:.2f}" in flat and f"**500–{500 + n - 1}, {n} pairs**" in flat, (sd, n)
    assert f"{analysis.detectable_effect(max(sd, analysis.H_SD_FLOOR), n):.1f} points" in flat
    variants = ["gtpo:", "no-filter:--entropy_filter never", "grpo:--algorithm grpo"]
    assert [v.split(":")[0] for v in variants] == list(analysis.H_ARMS)
    _assert_run_as_registered(name, text, variants, range(500, 500 + n), steps=40)
    script = (ROOT / "studies" / "tools" / "run_study.sh").read_text()
    assert "pinned_from=recipes/smollm2/two-step/gtpo.yaml" in script[script.index("    smollm2-two-step-h)") :]


def test_e_with_arms_applies_the_stall_rule_to_two_other_arms(tmp_path, capsys):
    """`analyze_preregistered.py e STUDY --arms A B` (the exploratory guard screen): E's rule on arms A and B."""
    study = tmp_path / "screen"
    _format_run(study, "gtpo", 100, [1.0] * 15)
    _format_run(study, "gtpo-guard", 100, [1.0, 1.0, 10.0] + [10.0] * 12)
    assert analysis.main(["e", str(study), "--arms", "gtpo", "gtpo-guard"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["stalled"] == {"gtpo": [100], "gtpo-guard": []}
    assert result["first_full_format_step"] == {"gtpo": {"100": None}, "gtpo-guard": {"100": 3}}
    with pytest.raises(SystemExit):
        analysis.main(["d", str(study), "--arms", "gtpo", "gtpo-guard"])


def test_heldout_and_seeds_take_two_other_arms(tmp_path, capsys):
    """Study F's registered length and cut-share pairs use its arms: ``heldout(study, ("gtpo-guard", "grpo"))`` keys
    the figures by those arms and pairs the seeds both evaluated (by hand: guard 30, 10 and grpo 40, 14 tokens at
    seeds 1 and 3: means 20 and 27, paired (-10 - 4) / 2 = -7); ``seeds --arms`` labels its columns with them."""
    for arm, seed, length in (("gtpo-guard", 1, 30.0), ("grpo", 1, 40.0), ("gtpo-guard", 2, 20.0),
                              ("gtpo-guard", 3, 10.0), ("grpo", 3, 14.0)):  # fmt: skip
        folder = tmp_path / "runs" / arm / f"seed{seed}" / "eval" / "synthetic"
        folder.mkdir(parents=True)
        (folder / "results.json").write_text(json.dumps({"mean_length": length, "truncated_frac": 0.0}))
    length = analysis.heldout(tmp_path, analysis.F_ARMS)["held-out mean length (tokens)"]
    assert length["seeds"] == [1, 3]
    assert length["gtpo-guard"]["mean"] == 20.0 and length["grpo"]["mean"] == 27.0
    assert length["gtpo-guard - grpo"]["mean"] == -7.0
    assert analysis.main(["heldout", str(tmp_path), "--arms", "gtpo-guard", "grpo"]) == 0
    assert json.loads(capsys.readouterr().out)["held-out mean length (tokens)"] == length
    assert analysis.main(["seeds", str(tmp_path), "--arms", "gtpo-guard", "grpo"]) == 0
    assert "| pass@1 gtpo-guard - grpo |" in capsys.readouterr().out.splitlines()[0]


def test_span_lambda_shares_count_a_hand_built_record(tmp_path):
    """The guard's λ-0 share is read from the record as the loss applied it. Hand-built step of 3 completions:
    row 0 (A > 0, 5 tokens, forward span 2, backward span 1): λ 0 at 0, 1 at 1 and 4 -> 3 span tokens, 1 zero;
    row 1 (A < 0, 4 tokens, forward 2, backward 3: spans overlap at 1, counted once -> tokens 0-3): λ 0 at 0 and 3
    -> 4 span tokens, 2 zeros; row 2 (A = 0, no span). Totals: 7 span tokens, 3 at λ 0 (42.86 %), none at 2;
    positives 3 tokens, 1 at 0 (33.33 %). A second step with λ 2 on a positive's 2 span tokens adds 2 tokens at 2."""
    from gtpo.runs import completions as records

    metadata = {key: None for key in records.METADATA_FIELDS}
    columns = {
        "completion_ids": [[1, 2, 3, 4, 5], [1, 2, 9, 5], [7]],
        "advantage": [1.0, -1.0, 0.0],
        "forward_span": [2, 2, 0],
        "backward_span": [1, 3, 0],
        "lambda_positions": [[0], [0, 3], []],
        "lambda_values": [[0.0], [0.0, 0.0], []],
    }
    records.write_step(tmp_path, 1, columns, metadata)
    second = {**columns, "forward_span": [2, 0, 0], "backward_span": [0, 0, 0], "lambda_positions": [[0, 1], [], []],
              "lambda_values": [[2.0, 2.0], [], []]}  # fmt: skip
    records.write_step(tmp_path, 2, second, metadata)
    shares = analysis.span_lambda_shares(tmp_path)
    assert shares["steps"] == 2 and shares["span tokens"] == 9 and shares["positive span tokens"] == 5
    assert shares["λ 0 %"] == pytest.approx(100 * 3 / 9) and shares["λ 2 %"] == pytest.approx(100 * 2 / 9)
    assert shares["positive λ 0 %"] == pytest.approx(100 * 1 / 5)
    assert analysis.span_lambda_shares(tmp_path / "no-record") is None


def test_span_lambda_shares_tell_the_guard_from_eq5_on_the_committed_screen():
    """On the exploratory guard screen's committed records (C's seed 100, 15 steps): plain GTPO's span tokens are all
    λ 2 (positives) or λ 0 (negatives), never 0 on a positive (Eq. 5); the guard's are never 2, and some positives'
    are 0 (the withheld promotion)."""
    screen = ROOT / "studies" / "smollm2-synthetic-lr1e-3-guard" / "runs"
    plain = analysis.span_lambda_shares(screen / "gtpo" / "seed100")
    guard = analysis.span_lambda_shares(screen / "gtpo-guard" / "seed100")
    assert plain["steps"] == guard["steps"] == 15
    assert plain["λ 0 %"] + plain["λ 2 %"] == pytest.approx(100.0) and plain["positive λ 0 %"] == 0.0
    assert guard["λ 2 %"] == 0.0 and 0.0 < guard["positive λ 0 %"] < 100.0


def _two_step_run(study: Path, arm: str, seed: int, pass1: float, samples: list[str], negatives: list[bool],
                  formats: list[float], clipped: float = 0.0) -> None:  # fmt: skip
    """A finished study-G run: 40 logged steps (format means ``formats`` then 10, clipped share ``clipped``), a held-out
    eval/two-step/ with ``samples`` answering problem 9+8-3, and a one-step completion record of four negatives, the
    first ``sum(negatives)`` of which have a forward span holding the right first step "9 + 8 = 17"."""
    run = study / "runs" / arm / f"seed{seed}"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"status": "finished"}))
    formats = formats + [10.0] * (40 - len(formats))
    rows = [
        {"step": t, "completions/clipped_ratio": clipped, "rewards/format_reward/mean": f, "reward": f,
         "completions/mean_length": 40.0}
        for t, f in enumerate(formats, start=1)
    ]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    held_out = run / "eval" / "two-step"
    held_out.mkdir(parents=True)
    (held_out / "results.json").write_text(json.dumps({"pass@k": {"1": pass1}}))
    lines = [json.dumps({"problem_id": "two-step/test/9+8-3", "text": text}) for text in samples]
    (held_out / "samples.jsonl").write_text("\n".join(lines) + "\n")
    import pandas as pd

    tokens = ["<reasoning>\n", "9", " +", " 8", " =", " 1", "7", ".", " 17 - 3 = 15."]
    prompt = [{"role": "user", "content": "What is 9 + 8 - 3?"}]
    (run / "completions").mkdir()
    pd.DataFrame(
        {
            "prompt": [prompt] * 4,
            "completion_tokens": [tokens] * 4,
            "forward_span": [7 if held else 2 for held in negatives],
            "advantage": [-1.0] * 4,
        }
    ).to_parquet(run / "completions" / "completions_00001.parquet")


def test_study_g_primary_and_its_registered_secondaries_on_a_hand_built_study(tmp_path):
    """Study G (issue 48): primary as study D's on arms gtpo and grpo, read from eval/two-step/. Hand-derived: pass@1
    differences +4 and -2 points: mean 1, s = sqrt(18), half-width t_{0.975,1} 12.706 * s / sqrt(2) = 38.12.
    Protected first step: gtpo holds it in 3 and 1 of 4 negatives (75 %, 25 %), grpo in 2 and 2 (50 %, 50 %): paired
    +25 and -25, mean 0. Held-out first step: gtpo 1 of 2 samples right at both seeds (50 %), grpo 2 of 2 and 0 of 2.
    Stall (no format mean >= 1.25 in steps 1-15): grpo at seed 401 only; runaway (>= 0.5 clipped at 6 of the last
    10 of 40 steps): gtpo at seed 400 only, McNemar P(B >= 1) = 0.5 for one discordant pair."""
    right, wrong = "<reasoning>\n9 + 8 = 17. 17 - 3 = 14.", "<reasoning>\n9 + 8 = 16. 16 - 3 = 13."
    study = tmp_path / "g"
    _two_step_run(study, "gtpo", 400, 0.44, [right, wrong], [True, True, True, False], [10.0], clipped=0.6)
    _two_step_run(study, "grpo", 400, 0.40, [right, right], [True, True, False, False], [10.0])
    _two_step_run(study, "gtpo", 401, 0.38, [wrong, right], [True, False, False, False], [10.0])
    _two_step_run(study, "grpo", 401, 0.40, [wrong, wrong], [True, True, False, False], [1.0] * 15)
    result = analysis.study_g(study)
    half = 12.706 * math.sqrt(18) / math.sqrt(2)
    assert result["seeds"] == [400, 401] and result["mean"] == pytest.approx(1.0)
    assert (result["low"], result["high"]) == (pytest.approx(1 - half, abs=1e-2), pytest.approx(1 + half, abs=1e-2))
    protected = result["secondary_protected_first_step"]
    assert protected["gtpo"]["mean"] == pytest.approx(50.0) and protected["grpo"]["mean"] == pytest.approx(50.0)
    assert protected["gtpo - grpo"]["mean"] == pytest.approx(0.0)
    first = result["secondary_heldout_first_step"]
    assert first["gtpo"]["mean"] == pytest.approx(50.0) and first["grpo"]["mean"] == pytest.approx(50.0)
    assert first["seeds"] == [400, 401]
    assert result["secondary_stall"]["stalled"] == {"gtpo": [], "grpo": [401]}
    assert result["secondary_stall"]["p_one_sided_grpo_stalls_more"] == pytest.approx(0.5)
    assert result["secondary_runaway"]["ran_away"] == {"gtpo": [400], "grpo": []}
    assert result["secondary_runaway"]["p_one_sided_gtpo_runs_away_more"] == pytest.approx(0.5)
    assert result["secondary_runaway"]["p_one_sided_grpo_runs_away_more"] == pytest.approx(1.0)


def test_a_run_evaluated_on_two_tasks_is_refused(tmp_path):
    """Which task's results are a study's outcome must not be guessed: eval/ with two task folders is an error."""
    run = tmp_path / "run"
    for task in ("synthetic", "two-step"):
        (run / "eval" / task).mkdir(parents=True)
        (run / "eval" / task / "results.json").write_text("{}")
    with pytest.raises(SystemExit, match="several tasks"):
        analysis.pass_at_1(run)


# ------------------------------------------------------------------------------------------------------ study H

SINGLE = ["<reasoning>\n", "9", " +", " 8", " -", " 3", " =", " 14", "."]  # three numbers before the first "="
STEPWISE = ["<reasoning>\n", "9", " +", " 8", " =", " 17", ".", " 17 - 3 = 14."]  # two


def _h_run(study: Path, arm: str, seed: int, pass1: float, single: int, warned_at: int | None,
           maj8: float = 0.5) -> None:  # fmt: skip
    """A finished study-H run: 40 logged steps with ``monitor/no_progress`` on from ``warned_at``, a held-out
    eval/two-step/results.json, and a completion record of 8 completions at each of steps 20-31 of which ``single``
    open with a single equation in steps 21-30 (steps 20 and 31, outside the window, are all single-equation)."""
    from gtpo.runs.completions import METADATA_FIELDS, write_step

    metadata = {**dict.fromkeys(METADATA_FIELDS), "group_size": 8}  # lock-in reads the tokens only

    run = study / "runs" / arm / f"seed{seed}"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"status": "finished"}))
    rows = [
        {"step": t, "completions/clipped_ratio": 0.0, "monitor/no_progress": float(t >= (warned_at or 99))}
        for t in range(1, 41)
    ]  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    held_out = run / "eval" / "two-step"
    held_out.mkdir(parents=True)
    results = {"pass@k": {"1": pass1, "2": pass1, "4": pass1, "8": pass1}, "maj@k": {"2": maj8, "4": maj8, "8": maj8}}
    (held_out / "results.json").write_text(json.dumps(results))
    for step in range(20, 32):
        count = single if 21 <= step <= 30 else 8
        write_step(run, step, {"completion_tokens": [SINGLE] * count + [STEPWISE] * (8 - count)}, metadata)


def test_h_pairs_follows_the_registered_rule():
    """H's n (its PREREGISTRATION.md): the smallest of 20, 24, 30 pairs at which the paired t-test detects 15 points
    with 80 % power at SD max(screen SD, 20); 30 where none does. Detectable effects by the script's noncentral t
    (checked against the registration's quoted 13.2 / 11.9 at SD 20 and 15.9 at 30 pairs, SD 30.03): SD 20 or less
    -> 20 pairs (13.2); SD 22 -> 20 (14.5); SD 24 -> 24 (20 pairs 15.9, 24 pairs 14.3); SD 27 -> 30 (24 pairs 16.1,
    30 pairs 14.3); SD 30 or more -> 30 (none reach 15)."""
    assert round(analysis.detectable_effect(20, 20), 1) == 13.2 and round(analysis.detectable_effect(20, 24), 1) == 11.9
    assert round(analysis.detectable_effect(30.03, 30), 1) == 15.9
    assert [analysis.h_pairs(sd) for sd in (5, 20, 22, 24, 27, 30, 45)] == [20, 20, 20, 24, 30, 30, 30]


def test_study_h_primary_and_its_registered_secondaries_on_a_hand_built_study(tmp_path):
    """Study H: the primary is D's computation on variant - grpo (the variant: H_ARMS' middle arm); by hand, pass@1
    (points) variant 40 and 30, grpo 35 and 40: differences +5 and -10, mean -2.5, s = sqrt(112.5), half-width
    12.706 * s / sqrt(2) = 95.3. Lock-in (>= 0.8 of steps 21-30's completions single-equation; steps 20 and 31 do
    not count): gtpo 7/8 and 8/8 -> both locked, the variant 6/8 and 1/8 -> neither, grpo 0/8 -> neither; McNemar
    two-sided on 2 discordant pairs (both gtpo only): 2 x P(B >= 2) = 0.5. The warning as logged against pass@1 <
    11: gtpo at seed 1 (5 points, warned at 17) a hit, at seed 2 (8 points, never warned) a miss; grpo at seed 1
    (35, warned at 20) a false alarm."""
    variant = analysis.H_ARMS[1]
    study = tmp_path / "h"
    _h_run(study, "gtpo", 1, 0.05, 7, 17)
    _h_run(study, "gtpo", 2, 0.08, 8, None)
    _h_run(study, variant, 1, 0.40, 6, None, maj8=0.6)
    _h_run(study, variant, 2, 0.30, 1, None, maj8=0.4)
    _h_run(study, "grpo", 1, 0.35, 0, 20, maj8=0.3)
    _h_run(study, "grpo", 2, 0.40, 0, None, maj8=0.3)
    result = analysis.study_h(study)
    primary = result["primary"]
    assert primary["seeds"] == [1, 2] and primary["differences"] == pytest.approx([5.0, -10.0])
    half = 12.706 * math.sqrt(112.5) / math.sqrt(2)
    assert primary["mean"] == pytest.approx(-2.5)
    assert (primary["low"], primary["high"]) == (
        pytest.approx(-2.5 - half, abs=1e-2),
        pytest.approx(-2.5 + half, abs=1e-2),
    )
    assert result["secondary gtpo - grpo"]["differences"] == pytest.approx([-30.0, -32.0])
    assert result[f"secondary gtpo - {variant}"]["differences"] == pytest.approx([-35.0, -22.0])
    lockin = result["secondary_lockin"]
    assert lockin["locked_in"] == {"gtpo": [1, 2], variant: [], "grpo": []}
    assert lockin[f"discordant gtpo only, {variant} only"] == [2, 0]
    assert lockin["p_two_sided_mcnemar"] == pytest.approx(0.5)
    warning = result["secondary_no_progress_warning"]
    assert warning["gtpo"]["hits"] == [1] and warning["gtpo"]["misses"] == [2] and warning["gtpo"]["false_alarms"] == []
    assert warning["gtpo"]["first_steps"] == {1: 17}
    assert warning["grpo"]["false_alarms"] == [1] and warning[variant]["failed"] == []
    assert all(warning[arm]["not_logged"] == [] for arm in analysis.H_ARMS)
    maj8 = result["secondary_heldout_k"]["maj@8"]
    assert maj8[variant]["mean"] == pytest.approx(50.0) and maj8[f"{variant} - grpo"]["mean"] == pytest.approx(20.0)
    assert analysis.lockin_share(study / "runs" / "gtpo" / "seed1") == pytest.approx(7 / 8)


def test_h_seeds_table_gives_each_seeds_three_arms_by_hand(tmp_path, capsys):
    """H's per-seed table (`h-seeds`), by hand from the hand-built runs: pass@1 in %, the lock-in share of steps
    21-30 (7/8 = 0.88 and 8/8 locked in, "*"; 6/8, 2/8, 0/8 not), the warning's first step ("–" never), and the
    seed's differences variant - grpo (40 - 35, 30 - 40) and gtpo - grpo (5 - 35, 8 - 40). Seed 3, without a
    variant run, is left out: a seed counts once all three arms are evaluated."""
    variant = analysis.H_ARMS[1]
    study = tmp_path / "h"
    for arm, seed, pass1, single, warned in (("gtpo", 1, 0.05, 7, 17), ("gtpo", 2, 0.08, 8, None),
                                             (variant, 1, 0.40, 6, None), (variant, 2, 0.30, 2, None),
                                             ("grpo", 1, 0.35, 0, 20), ("grpo", 2, 0.40, 0, None),
                                             ("gtpo", 3, 0.50, 0, None), ("grpo", 3, 0.50, 0, None)):  # fmt: skip
        _h_run(study, arm, seed, pass1, single, warned)
    names = f"gtpo / {variant} / grpo"
    expected = [
        f"| seed | pass@1 %, {names} | lock-in share, steps 21-30, {names} | no-progress warning from step, {names} "
        f"| pass@1 {variant} - grpo | pass@1 gtpo - grpo |",
        "|---|---|---|---|---|---|",
        "| 1 | 5.0 / 40.0 / 35.0 | 0.88* / 0.75 / 0.00 | 17 / – / 20 | +5.0 | -30.0 |",
        "| 2 | 8.0 / 30.0 / 40.0 | 1.00* / 0.25 / 0.00 | – / – / – | -10.0 | -32.0 |",
    ]
    assert analysis.h_seeds_table(study) == expected
    assert analysis.main(["h-seeds", str(study)]) == 0
    assert capsys.readouterr().out.splitlines() == expected


def test_a_registered_study_is_analysed_only_after_its_last_run(tmp_path, capsys):
    """No interim look through the analysis: `analyze_preregistered.py h STUDY` on a registered study (compare.json
    of H's three arms at seeds 1 and 2, PREREGISTRATION.md) with seed 2 not run refuses in one line and prints no
    estimate; --partial (a stop the registration allows) computes it on the complete seed; once seed 2's three runs
    have finished it runs without the flag."""
    from gtpo.compare.study import Arm, Spec

    study = tmp_path / "h"
    for arm in analysis.H_ARMS:
        _h_run(study, arm, 1, 0.40, 0, None)
    (study / "compare.json").write_text(json.dumps(Spec([Arm(a, "r.yaml") for a in analysis.H_ARMS], [1, 2]).to_json()))
    (study / "PREREGISTRATION.md").write_text("# registered\n")
    with pytest.raises(SystemExit, match="is pre-registered and not all its runs have finished"):
        analysis.main(["h", str(study)])
    with pytest.raises(SystemExit, match="is pre-registered"):
        analysis.main(["h-screen", str(tmp_path / "screen"), str(study)])  # as any folder of a command
    assert capsys.readouterr().out == ""
    assert analysis.main(["h", str(study), "--partial"]) == 0
    assert json.loads(capsys.readouterr().out)["primary"]["seeds"] == [1]
    for arm in analysis.H_ARMS:
        _h_run(study, arm, 2, 0.30, 0, None)
    assert analysis.main(["h", str(study)]) == 0
    assert json.loads(capsys.readouterr().out)["primary"]["seeds"] == [1, 2]


@pytest.mark.slow
def test_study_h_reads_real_runs_laid_out_as_hs_folder(tmp_path):
    """H's analysis on committed runs in H's layout (links, no H run read): at the screens' 13 seeds, G's gtpo and
    grpo and no-filter from the parts screen (seven low seeds) and its follow-up (six others). The primary is then
    h-screen's no-filter - grpo, computed by another function from the same files; lock-in as the pages' tables
    show it (gtpo at 404, 405, 407, 410, 417, 418; no-filter at 410 and 418; grpo none): 4 discordant pairs, all
    gtpo only, McNemar two-sided 2 x (1/2)^4 = 0.125. Those runs' code predates the no-progress warning: no row logs
    the flag, so no run is judged (all listed as not logged) rather than seven failed GTPO runs counted as misses.
    The per-seed table (`h-seeds`) agrees with both: its seeds and differences are the primary's and gtpo - grpo's
    (to its one decimal), and its locked-in marks are the lock-in secondary's."""
    studies = ROOT / "studies"
    g, parts, others = (studies / f"smollm2-two-step-{n}" for n in ("g", "h-parts", "h-parts-others"))
    no_filter = {s: parts if s in analysis.H_LOW_SEEDS else others for s in analysis.H_SCREEN_SEEDS}
    sources = {"gtpo": dict.fromkeys(analysis.H_SCREEN_SEEDS, g), "grpo": dict.fromkeys(analysis.H_SCREEN_SEEDS, g),
               "no-filter": no_filter}  # fmt: skip
    for arm, seeds in sources.items():
        (tmp_path / "runs" / arm).mkdir(parents=True)
        for seed, root in seeds.items():
            (tmp_path / "runs" / arm / f"seed{seed}").symlink_to(root / "runs" / arm / f"seed{seed}")
    result = analysis.study_h(tmp_path)
    screen = analysis.h_screen(parts, g, "no-filter", (others,))["no-filter - grpo"]
    primary = result["primary"]
    assert primary["seeds"] == sorted(analysis.H_SCREEN_SEEDS)
    assert (primary["mean"], primary["low"], primary["high"]) == pytest.approx((screen["mean"], screen["low"],
                                                                                screen["high"]))  # fmt: skip
    lockin = result["secondary_lockin"]
    assert lockin["locked_in"] == {"gtpo": [404, 405, 407, 410, 417, 418], "no-filter": [410, 418], "grpo": []}
    assert lockin["discordant gtpo only, no-filter only"] == [4, 0] and lockin["p_two_sided_mcnemar"] == 0.125
    for arm in analysis.H_ARMS:
        warning = result["secondary_no_progress_warning"][arm]
        assert warning["not_logged"] == sorted(analysis.H_SCREEN_SEEDS) and warning["runs"] == 0, arm
        assert warning["misses"] == [] and warning["hits"] == [], arm
    rows = [line.split(" | ") for line in analysis.h_seeds_table(tmp_path)[2:]]  # the per-seed table: one decimal
    assert [int(row[0].removeprefix("| ")) for row in rows] == primary["seeds"]
    assert [float(row[4]) for row in rows] == pytest.approx(primary["differences"], abs=0.051)
    assert [float(row[5].removesuffix(" |")) for row in rows] == pytest.approx(
        result["secondary gtpo - grpo"]["differences"], abs=0.051
    )
    assert all(row[3] == "not logged / not logged / not logged" for row in rows)
    marked = {arm: [int(row[0].removeprefix("| ")) for row in rows if row[2].split(" / ")[i].endswith("*")]
              for i, arm in enumerate(analysis.H_ARMS)}  # fmt: skip
    assert marked == lockin["locked_in"]


def test_h_screen_pairs_the_variant_with_study_gs_runs_and_gives_hs_n(tmp_path):
    """The screen's comparison: the variant at each screen seed against G's gtpo and grpo at the same seed; seeds
    with a missing evaluation are listed, not used; n from h_pairs of the SD of variant - grpo. By hand, at seeds
    404 and 401: variant 30, 20; grpo 10, 40; gtpo 5, 45 points: differences +20, -20, SD sqrt(800) = 28.3 -> 30."""
    screen, g = tmp_path / "screen", tmp_path / "g"
    for seed, variant, grpo, gtpo in ((404, 0.30, 0.10, 0.05), (401, 0.20, 0.40, 0.45)):
        _run(screen, "common-prefix", seed, [0.0], eval_pass1=variant)
        _run(g, "grpo", seed, [0.0], eval_pass1=grpo)
        _run(g, "gtpo", seed, [0.0], eval_pass1=gtpo)
    _run(g, "grpo", 417, [0.0], eval_pass1=0.5)  # the variant has no run at 417 yet
    result = analysis.h_screen(screen, g)
    assert result["seeds"] == [404, 401] and 417 in result["missing"]
    assert result["common-prefix - grpo"]["differences"] == pytest.approx([20.0, -20.0])
    assert result["h_pairs"]["screen_sd"] == pytest.approx(math.sqrt(800)) and result["h_pairs"]["n"] == 30
    assert result["gtpo below 11"] == [404] and result["common-prefix below 11"] == []


def test_h_parts_counts_failures_and_lockins_per_arm_at_gs_low_seeds(tmp_path):
    """The parts screen's table at G's low seeds: per arm the seeds below 11 % and those locked in (>= 0.8 of steps
    21-30's completions single-equation), seeds not yet run listed as missing, and each arm's paired difference from
    G's gtpo. By hand, at seeds 404 and 417: no-filter 40 and 30 points (share 2/8 and 1/8: not locked), gtpo 5 and 8
    (8/8 and 7/8: locked): differences +35 and +22, mean 28.5; no-correction 9 at 404 only (7/8: locked, below 11)."""
    parts, screen, g = tmp_path / "parts", tmp_path / "screen", tmp_path / "g"
    _h_run(parts, "no-filter", 404, 0.40, 2, None)
    _h_run(parts, "no-filter", 417, 0.30, 1, None)
    _h_run(parts, "no-correction", 404, 0.09, 7, 17)
    _h_run(g, "gtpo", 404, 0.05, 8, 17)
    _h_run(g, "gtpo", 417, 0.08, 7, 18)
    result = analysis.h_parts(parts, screen, g)
    arms = result["arms"]
    assert arms["no-filter"]["below 11"] == [] and arms["no-filter"]["locked_in"] == []
    assert arms["no-filter"]["- gtpo"]["differences"] == pytest.approx([35.0, 22.0])
    assert arms["no-filter"]["- gtpo"]["mean"] == pytest.approx(28.5)
    assert arms["no-correction"]["below 11"] == [404] and arms["no-correction"]["locked_in"] == [404]
    assert arms["no-correction"]["missing"] == [417, 407, 410, 418, 400, 405]
    assert arms["gtpo"]["locked_in"] == [404, 417] and arms["no-entropy-term"]["per_seed"] == {}
    assert arms["grpo"]["missing"] == list(analysis.H_LOW_SEEDS)


def test_h_screen_and_h_parts_take_their_folders_on_the_command_line(tmp_path, capsys):
    """`h-screen SCREEN G` and `h-parts PARTS SCREEN G` print their JSON; a missing folder is a one-line usage error."""
    _run(tmp_path / "screen", "common-prefix", 404, [0.0], eval_pass1=0.3)
    _run(tmp_path / "g", "grpo", 404, [0.0], eval_pass1=0.1)
    assert analysis.main(["h-screen", str(tmp_path / "screen"), str(tmp_path / "g")]) == 0
    assert json.loads(capsys.readouterr().out)["missing"] == [s for s in analysis.H_SCREEN_SEEDS]  # gtpo not run
    assert analysis.main(["h-parts", str(tmp_path / "parts"), str(tmp_path / "screen"), str(tmp_path / "g")]) == 0
    parts = json.loads(capsys.readouterr().out)
    assert parts["arms"]["common-prefix"]["per_seed"]["404"]["pass@1"] == pytest.approx(30.0)
    for argv in (["h-screen", str(tmp_path / "screen")], ["h-parts", str(tmp_path / "parts"), str(tmp_path / "g")]):
        with pytest.raises(SystemExit):
            analysis.main(argv)
    assert "needs" in capsys.readouterr().err


def _parts_result(per_arm: dict[str, dict[int, tuple[float, float]]]) -> dict:
    """h_parts' shape from {arm: {seed: (pass@1 points, lock-in share)}}; seeds not given are missing."""
    arms = {}
    for arm in analysis.H_PARTS_ARMS:
        rows = {s: {"pass@1": p, "lockin_share": share} for s, (p, share) in per_arm.get(arm, {}).items()}
        arms[arm] = {"per_seed": rows, "missing": [s for s in analysis.H_LOW_SEEDS if s not in rows]}
    return {"seeds": list(analysis.H_LOW_SEEDS), "arms": arms}


def test_h_parts_choice_follows_the_rule_written_before_the_screens_outcomes():
    """H's variant from the parts screen (its README's rule): a seed is rescued at >= 11 points and a lock-in share
    below 0.8; an arm qualifies with >= 5 rescues of 7; the most rescues win, then the higher mean. By hand:
    no-filter rescues 5 (two seeds at 5 points), mean (5*40 + 2*5)/7 = 30; no-correction rescues 6 but one of its
    seven is 50 points locked in (share 0.9: not a rescue), mean (6*20 + 50)/7; no-entropy-term rescues 4 (11.0 counts,
    10.99 does not; a share of None counts as not locked). Chosen: no-correction (6 > 5 despite the lower mean)."""
    seeds = analysis.H_LOW_SEEDS
    table = {
        "no-filter": {s: ((40.0, 0.1) if i < 5 else (5.0, 0.95)) for i, s in enumerate(seeds)},
        "no-correction": {s: ((20.0, 0.5) if i < 6 else (50.0, 0.9)) for i, s in enumerate(seeds)},
        "no-entropy-term": {s: ((11.0, None) if i < 4 else (10.99, 0.0)) for i, s in enumerate(seeds)},
    }
    choice = analysis.h_parts_choice(_parts_result(table))
    assert choice["complete"] and choice["qualifying"] == ["no-filter", "no-correction"]
    assert choice["rescued"]["no-filter"] == list(seeds[:5]) and len(choice["rescued"]["no-entropy-term"]) == 4
    assert choice["mean_pass@1"]["no-filter"] == pytest.approx(30.0)
    assert choice["mean_pass@1"]["no-correction"] == pytest.approx((6 * 20 + 50) / 7)
    assert choice["chosen"] == "no-correction"
    table["no-correction"][seeds[0]] = (5.0, 0.0)  # now 5 rescues each: the higher mean (no-filter's 30) decides
    assert analysis.h_parts_choice(_parts_result(table))["chosen"] == "no-filter"


def test_h_parts_choice_chooses_nothing_while_a_seed_is_missing_or_when_no_arm_rescues_five():
    """No choice from an unfinished screen (a part arm with a seed missing), and none when every arm rescues at most
    four of the seven: then no single part carries the failure."""
    seeds = analysis.H_LOW_SEEDS
    rescues_all = {s: (40.0, 0.0) for s in seeds}
    partial = _parts_result({"no-filter": rescues_all, "no-correction": dict(list(rescues_all.items())[:6])})
    choice = analysis.h_parts_choice(partial)
    assert not choice["complete"] and choice["qualifying"] == ["no-filter", "no-correction"]
    assert choice["chosen"] is None
    four = {s: ((40.0, 0.0) if i < 4 else (3.0, 1.0)) for i, s in enumerate(seeds)}
    none = analysis.h_parts_choice(_parts_result({arm: four for arm in analysis.H_PARTS_ARMS}))
    assert none["complete"] and none["qualifying"] == [] and none["chosen"] is None


def test_h_screen_joins_a_part_arm_from_the_parts_screen_and_its_follow_up(tmp_path, capsys):
    """A part arm chosen at G's low seeds and then run at the six others: h-screen pairs its runs from both folders
    with G's. By hand: no-filter 40 at 404 (parts folder) and 20 at 401 (follow-up); grpo 10 and 40: differences +30,
    -20, SD sqrt(1250) = 35.4 -> 30 pairs. A seed in both folders is refused; --arm/--with on the command line."""
    parts, follow, g = tmp_path / "parts", tmp_path / "follow", tmp_path / "g"
    _run(parts, "no-filter", 404, [0.0], eval_pass1=0.40)
    _run(follow, "no-filter", 401, [0.0], eval_pass1=0.20)
    for seed, grpo, gtpo in ((404, 0.10, 0.05), (401, 0.40, 0.45)):
        _run(g, "grpo", seed, [0.0], eval_pass1=grpo)
        _run(g, "gtpo", seed, [0.0], eval_pass1=gtpo)
    result = analysis.h_screen(parts, g, "no-filter", (follow,))
    assert result["seeds"] == [404, 401]
    assert result["no-filter - grpo"]["differences"] == pytest.approx([30.0, -20.0])
    assert result["h_pairs"]["screen_sd"] == pytest.approx(math.sqrt(1250)) and result["h_pairs"]["n"] == 30
    argv = ["h-screen", str(parts), str(g), "--arm", "no-filter", "--with", str(follow)]
    assert analysis.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["seeds"] == [404, 401]
    _run(follow, "no-filter", 404, [0.0], eval_pass1=0.50)
    with pytest.raises(SystemExit, match="no-filter/seed404 is in more than one folder"):
        analysis.h_screen(parts, g, "no-filter", (follow,))
    with pytest.raises(SystemExit):
        analysis.main(["h-parts", str(parts), str(g), str(g), "--arm", "no-filter"])
    assert "--arm and --with go with h-screen" in capsys.readouterr().err
