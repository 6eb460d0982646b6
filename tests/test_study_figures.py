"""The studies' answers, as README.md's table and the study document quote them (docs/study-gtpo-vs-grpo.md, the
index with the same table, and its pages under docs/studies/), are the committed summaries': every per-arm interval
and paired difference the documents state is recomputed here from
studies/<name>/summary.json, and study A's summary is checked against the committed held-out results it
aggregates, study B's run counts against its committed metrics. An edit of the numbers, or a rerun that changes
the files, fails here instead of going stale."""

from __future__ import annotations

import functools
import json
import statistics
from pathlib import Path

import pytest

from cli_helpers import flat, load_script  # noqa: E402
from study_pages import INDEX, all_text, page, table_row  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STUDY = ROOT / "studies" / "smollm2-synthetic-lr2e-4"
SUMMARY = json.loads((STUDY / "summary.json").read_text())
PAIRS = {pair["metric"]: pair["diff"] for pair in SUMMARY["pairs"] if (pair["a"], pair["b"]) == ("gtpo", "grpo")}
# The metrics study A's per-arm rows are checked on (training, then held-out).
HELD_OUT_ROW = ("reward", "format %", "accuracy %", "entropy", "pass@1 %", "pass@8 %", "maj@8 %")


def _num(x: float, digits: int, sign: bool = False) -> str:
    """The documents' number style: a real minus sign, '+' on differences; a nonzero value that rounds to 0
    keeps one significant digit (−0.002, not −0.00); an exact 0 has no sign."""
    sign = sign and x != 0
    text = f"{x:{'+' if sign else ''}.{digits}f}"
    if float(text) == 0 and x != 0:
        text = f"{x:{'+' if sign else ''}.{digits + 1}f}"
    return text.replace("-", "−")


def _interval(d: dict, digits: int, sign: bool = False) -> str:
    return f"{_num(d['mean'], digits, sign)} [{_num(d['low'], digits)}, {_num(d['high'], digits)}]"


def _flat(path: Path) -> str:
    return flat(path.read_text())


# F's two post-hoc subsections, each checked up to the next heading (the second one ends the page)
RUNAWAY_HEADING = "## After the analysis: the guard's runaway"
COLLAPSE_HEADING = "## After the analysis: the collapse onto one"


def _section(name: str, start: str | None = None, end: str | None = None) -> list[str]:
    """The lines of the study page docs/studies/<name>.md, from heading ``start`` up to heading ``end`` when given."""
    text = page(name)
    return text[text.index(start) if start else 0 : text.index(end) if end else len(text)].splitlines()


def _study_doc() -> str:
    """The whole study document, index and pages, whitespace flattened."""
    return flat(all_text())


def _rows(study: str) -> tuple[str, str]:
    """The studies' table row of ``study`` in the README and in the study document's index (the same table)."""
    return table_row((ROOT / "README.md").read_text(), study), table_row(INDEX.read_text(), study)


def _assert_arm_row(row: str, metrics: dict, names: tuple[str, ...]) -> None:
    """A per-arm table row states each named metric's mean and interval, 2 decimals, as the summary has it."""
    for metric in names:
        assert f"| {_interval(metrics[metric], 2)} |" in row, metric


def _assert_pair_rows(rows: list[str], pairs: list[dict]) -> None:
    """Each summary pair has its document row `| a − b | metric | difference [interval] | reading |`."""
    for pair in pairs:
        row = next(line for line in rows if line.startswith(f"| {pair['a']} − {pair['b']} | {pair['metric']} |"))
        assert f"| {_interval(pair['diff'], 2, sign=True)} | {pair['verdict']} |" in row, row


def test_study_a_is_complete_with_five_paired_seeds():
    """gtpo and grpo have all five seeds; the gtpo-filter arm, added after them, is counted in the totals."""
    arms = [arm["name"] for arm in json.loads((STUDY / "compare.json").read_text())["arms"]]
    assert arms[:2] == ["gtpo", "grpo"] and SUMMARY["total_runs"] == 5 * len(arms)
    finished = sum(len(SUMMARY["arms"][arm]["aggregated_seeds"]) for arm in arms if arm in SUMMARY["arms"])
    assert SUMMARY["finished_runs"] == finished >= 10
    for arm in ("gtpo", "grpo"):
        assert SUMMARY["arms"][arm]["aggregated_seeds"] == [0, 1, 2, 3, 4]
    assert all(d["n"] == 5 for d in PAIRS.values())


def test_summary_pass_at_1_is_the_mean_of_the_committed_results():
    """Independent of the aggregation code: the mean and the paired difference of pass@1 from the five
    results.json files of each arm, by hand."""
    per_arm = {
        arm: [
            100 * json.loads((STUDY / f"runs/{arm}/seed{s}/eval/synthetic/results.json").read_text())["pass@k"]["1"]
            for s in range(5)
        ]
        for arm in ("gtpo", "grpo")
    }
    for arm, values in per_arm.items():
        assert SUMMARY["arms"][arm]["metrics"]["pass@1 %"]["mean"] == pytest.approx(statistics.mean(values))
    diffs = [a - b for a, b in zip(per_arm["gtpo"], per_arm["grpo"], strict=True)]
    half = 2.776445105 * statistics.stdev(diffs) / 5**0.5  # t_{0.975, 4}
    assert PAIRS["pass@1 %"]["mean"] == pytest.approx(statistics.mean(diffs))
    # the summary's t table has 3 decimals (2.776): agreement to 1e-3 relative
    assert PAIRS["pass@1 %"]["high"] - PAIRS["pass@1 %"]["mean"] == pytest.approx(half, rel=1e-3)


def test_readme_states_the_summary_answer():
    """Study A's row of the studies' table (README and the study document's index): its pass@1 difference is the
    summary's, and every held-out verdict is "no detectable difference", as the row says."""
    for row in _rows("A"):
        assert f"| GTPO − GRPO held-out pass@1 {_interval(PAIRS['pass@1 %'], 2, sign=True)} points |" in row
        assert "| 5 (seeds 0–4) | no |" in row and "| no detectable difference;" in row
    # all of study A's paired verdicts on held-out metrics are "no detectable difference", as the row says
    assert all(PAIRS[m]["n"] == 5 and not (PAIRS[m]["low"] > 0 or PAIRS[m]["high"] < 0) for m in PAIRS if "@" in m)
    readme = _flat(ROOT / "README.md")  # the reading under the table: study D's answer
    assert "At this scale GTPO did not beat GRPO: in the powered one-step studies D and F GRPO's held-out" in readme


@pytest.mark.parametrize("metric", sorted(set(PAIRS) - {"maj@1 %"}))
def test_study_document_states_each_paired_difference(metric):
    doc = page("a")
    row = next((line for line in doc.splitlines() if line.startswith(f"| {metric.split(' ')[0]} ")), None)
    assert row is not None, f"docs/studies/a.md has no paired-difference row for {metric}"
    assert _interval(PAIRS[metric], 2, sign=True) in row


@pytest.mark.parametrize("arm", ["gtpo", "grpo"])
def test_study_document_states_each_arm_mean(arm):
    doc = page("a")
    row = next(line for line in doc.splitlines() if line.startswith(f"| {arm} | 13."))
    _assert_arm_row(row, SUMMARY["arms"][arm]["metrics"], HELD_OUT_ROW)


# Study B (issue 18): the document's per-arm and paired tables, and the README's one figure, are its summary's.
STUDY_B = ROOT / "studies" / "smollm2-synthetic-lr1e-3"
SUMMARY_B = json.loads((STUDY_B / "summary.json").read_text())


def _section_b() -> list[str]:
    return _section("b")


def test_study_b_is_complete_with_three_paired_seeds_of_three_arms():
    assert SUMMARY_B["finished_runs"] == SUMMARY_B["total_runs"] == 9
    for arm in ("gtpo", "grpo", "entropy-only"):
        assert SUMMARY_B["arms"][arm]["aggregated_seeds"] == [0, 1, 2]
    assert len(SUMMARY_B["pairs"]) == 12 and all(pair["diff"]["n"] == 3 for pair in SUMMARY_B["pairs"])


@pytest.mark.parametrize("arm", ["gtpo", "grpo", "entropy-only"])
def test_study_b_document_states_each_arm_mean(arm):
    row = next(line for line in _section_b() if line.startswith(f"| {arm} | "))
    _assert_arm_row(row, SUMMARY_B["arms"][arm]["metrics"], ("reward", "format %", "accuracy %", "entropy"))


def test_study_b_document_states_each_paired_difference_and_its_reading():
    _assert_pair_rows(_section_b(), SUMMARY_B["pairs"])


def test_readme_states_study_b_answer():
    reward = next(p["diff"] for p in SUMMARY_B["pairs"] if (p["a"], p["b"], p["metric"]) == ("gtpo", "grpo", "reward"))
    for row in _rows("B"):
        assert f"| reward GTPO − GRPO {_interval(reward, 2, sign=True)} of 20, last 10 steps |" in row
        assert "| no detectable difference;" in row
    assert all(p["verdict"] == "no detectable difference" for p in SUMMARY_B["pairs"])  # what the row says


def test_the_fisher_exact_p_the_documents_quote():
    """0 of 3 gtpo runs against 4 of 6 others: hypergeometric with 9 runs, 4 of them 'ran to the limit', 3 drawn.
    Two-sided: the outcomes no more likely than the observed one (0 and 3 of 3) add to (10 + 4) / 84."""
    from math import comb

    probability = {k: comb(4, k) * comb(5, 3 - k) / comb(9, 3) for k in range(4)}
    p = sum(v for v in probability.values() if v <= probability[0] + 1e-12)
    assert p == pytest.approx(14 / 84) and f"{p:.2f}" == "0.17"
    # and the counts behind it, from the runs' last 10 steps: clipped share >= 89 % in exactly those four runs
    ran_to_limit = []
    for run in sorted(STUDY_B.glob("runs/*/seed*/metrics.jsonl")):
        rows = [r for r in map(json.loads, run.read_text().splitlines()) if "reward" in r][-10:]
        if statistics.mean(r["completions/clipped_ratio"] for r in rows) > 0.5:
            ran_to_limit.append(str(run.parent.relative_to(STUDY_B / "runs")))
    assert ran_to_limit == ["entropy-only/seed0", "entropy-only/seed2", "grpo/seed1", "grpo/seed2"]
    assert "Fisher exact p = 0.17" in _flat(ROOT / "README.md")


def test_study_a_held_out_length_figures_are_the_results_files():
    """The post-hoc held-out length and truncation figures of study A's reading, recomputed from the ten
    results.json files with the t quantile t_{0.975, 4} = 2.776 by hand (not gtpo.compare)."""
    per_arm = {
        arm: [json.loads((STUDY / f"runs/{arm}/seed{s}/eval/synthetic/results.json").read_text()) for s in range(5)]
        for arm in ("gtpo", "grpo")
    }
    doc = _study_doc()

    def interval(values, digits, unit=""):
        m, half = statistics.mean(values), 2.776 * statistics.stdev(values) / 5**0.5
        return f"{_num(m, digits)}{unit} [{_num(m - half, digits)}, {_num(m + half, digits)}]"

    for key, scale, digits, unit in (("mean_length", 1, 1, " tokens"), ("truncated_frac", 100, 2, " %")):
        gtpo, grpo = ([scale * r[key] for r in per_arm[arm]] for arm in ("gtpo", "grpo"))
        assert f"{interval(gtpo, digits, unit)} against {interval(grpo, digits)}" in doc, key
        assert f"paired {interval([a - b for a, b in zip(gtpo, grpo, strict=True)], 2)}" in doc, key
        if key == "truncated_frac":
            assert all(a < b for a, b in zip(gtpo, grpo, strict=True))  # "5 of 5 seeds lower"


def test_study_a_gtpo_filter_arm_is_complete_and_documented():
    """The third arm's per-arm row and its 22 paired rows with their readings are the summary's; its seeds 1 and 4
    are gtpo's seeds 1 and 4 (the auto filter was on there), which the document states from the held-out samples:
    identical files."""
    assert SUMMARY["arms"]["gtpo-filter"]["aggregated_seeds"] == [0, 1, 2, 3, 4]
    rows = _section("a")
    metrics = SUMMARY["arms"]["gtpo-filter"]["metrics"]
    _assert_arm_row(next(line for line in rows if line.startswith("| gtpo-filter | ")), metrics, HELD_OUT_ROW)
    pairs = [p for p in SUMMARY["pairs"] if "gtpo-filter" in (p["a"], p["b"]) and p["metric"] != "maj@1 %"]
    assert len(pairs) == 22
    _assert_pair_rows(rows, pairs)
    for seed in (1, 4):
        same = [
            (STUDY / f"runs/{arm}/seed{seed}/eval/synthetic/samples.jsonl").read_bytes()
            for arm in ("gtpo", "gtpo-filter")
        ]
        assert same[0] == same[1], seed
    assert (STUDY / "runs/gtpo/seed0/eval/synthetic/samples.jsonl").read_bytes() != (
        STUDY / "runs/gtpo-filter/seed0/eval/synthetic/samples.jsonl"
    ).read_bytes()


# ------------------------------------------------------------------------------------------- issue 31's corrections


def _steps(metrics: Path) -> list[dict]:
    return [r for r in map(json.loads, metrics.read_text().splitlines()) if "reward" in r]


def _analysis():
    return load_script("analyze_preregistered")


def test_the_steps_without_reward_signal_the_document_states():
    """The count per run of steps whose group's rewards were all equal (frac_reward_zero_std = 1), as ranges."""

    def zero_std(study: Path, arms: tuple[str, ...]) -> tuple[int, int]:
        counts = [sum(r["frac_reward_zero_std"] == 1 for r in _steps(m)) for arm in arms
                  for m in study.glob(f"runs/{arm}/seed*/metrics.jsonl")]  # fmt: skip
        return min(counts), max(counts)

    doc = _study_doc()
    low, high = zero_std(STUDY, ("gtpo", "grpo"))
    assert f"in {low}–{high} of the 40 steps of every `gtpo` and `grpo` run" in doc
    low, high = zero_std(STUDY, ("gtpo-filter",))
    assert f"({low}–{high} in `gtpo-filter`'s)" in doc
    low, high = zero_std(STUDY_B, ("gtpo", "grpo", "entropy-only"))
    assert f"in {low}–{high} of the 40 steps of each run" in doc


def test_the_two_different_four_of_six_subsets_of_study_b():
    """'4 of 6' counts two subsets: the runs that ended at the length limit and the runs whose raw entropy exceeded
    ln 2 after step 2; study B's page names both, and they differ; the studies' table names the first."""
    import math

    high_entropy = sorted(
        str(m.parent.relative_to(STUDY_B / "runs"))
        for m in STUDY_B.glob("runs/*/seed*/metrics.jsonl")
        if any(r["step"] > 2 and r["entropy"] > math.log(2) for r in _steps(m))
    )
    assert high_entropy == ["entropy-only/seed0", "entropy-only/seed1", "grpo/seed0", "grpo/seed1"]
    doc = _study_doc()
    assert "but not the same four: grpo seeds 0 and 1 and entropy-only seeds 0 and 1" in doc
    assert "grpo seeds 1 and 2, entropy-only seeds 0 and 2" in flat(page("b"))  # the runs that ended at the limit
    for row in _rows("B"):
        assert "4 of the 6 grpo and entropy-only runs did (grpo seeds 1, 2, entropy-only seeds 0, 2)" in row


@functools.cache
def _pass1(arm: str, seed: int, study: Path = STUDY, task: str = "synthetic") -> float:
    """Held-out pass@1 in points of ``study``'s run ``arm/seed<seed>``, from its results.json on ``task`` (read
    once)."""
    results = study / f"runs/{arm}/seed{seed}/eval/{task}/results.json"
    return 100 * json.loads(results.read_text())["pass@k"]["1"]


def test_gtpo_filter_interval_over_the_seeds_where_the_arms_differ():
    """Seeds 1 and 4 run the same computation in gtpo and gtpo-filter (difference 0); over seeds 0, 2, 3 alone the
    pass@1 difference's interval is the one the document states."""
    from gtpo.compare.stats import mean_interval

    assert [_pass1("gtpo", s) - _pass1("gtpo-filter", s) for s in (1, 4)] == [0.0, 0.0]
    interval = mean_interval([_pass1("gtpo", s) - _pass1("gtpo-filter", s) for s in (0, 2, 3)])
    assert _interval(interval.as_dict(), 2, sign=True) in _study_doc()


def test_the_power_lines_are_the_scripts():
    """Study A's SD of the paired pass@1 differences and its 95 % interval (chi-square quantiles with 4 degrees of
    freedom, 0.4844 and 11.143, from any table), and the detectable effects the document quotes for A, B, C, D."""
    import math

    analysis = _analysis()
    sd = statistics.stdev([_pass1("gtpo", s) - _pass1("grpo", s) for s in range(5)])
    doc = _study_doc()
    low, high = sd * math.sqrt(4 / 11.143), sd * math.sqrt(4 / 0.4844)
    assert f"is {sd:.2f} points (95 % interval {low:.1f}–{high:.1f}" in doc
    assert f"difference of {analysis.detectable_effect(sd, 5):.1f} points at SD {sd:.2f}" in doc
    assert f"and {analysis.detectable_effect(29, 5):.1f} at SD 29" in doc
    assert f"only a difference of {analysis.detectable_effect(1, 3):.2f}" in doc
    assert f"smallest two-sided p is {analysis.fisher_exact(0, 3, 3, 0):.3f}" in doc
    assert f"power {analysis.fisher_power(12, 12, 0, 2 / 3, 'less'):.3f} if the true rates are 0 and 0.67" in doc
    assert f"{analysis.fisher_power(12, 12, 0.1, 0.5, 'less'):.2f} if 0.1 and 0.5" in doc
    assert f"at {analysis.detectable_effect(10, 12):.1f} points if the SD" in doc
    assert f"at {analysis.detectable_effect(29, 12):.1f} if it is 29" in doc


# ------------------------------------------------------------------------------------------- study C (issue 31)
STUDY_C = ROOT / "studies" / "smollm2-synthetic-lr1e-3-c"
SUMMARY_C = json.loads((STUDY_C / "summary.json").read_text())
SEEDS_C = list(range(100, 112))


def _section_c() -> list[str]:
    return _section("c")


def _last_steps(metrics: Path) -> dict[int, dict]:
    """Each logged step's last record (a resumed run logs the steps after its checkpoint twice)."""
    return {row["step"]: row for row in _steps(metrics)}


@functools.cache
def _c_run(arm: str, seed: int) -> dict[int, dict]:
    """Study C's run ``arm/seed<seed>``, step -> its last record; read once for all the tests below."""
    return _last_steps(STUDY_C / f"runs/{arm}/seed{seed}/metrics.jsonl")


def _first_full_format(rows: dict[int, dict]) -> int | None:
    """The first step whose group had a full-format completion: format mean >= 1.25, the least one gives (10 / 8;
    eight partial credits give 1.0)."""
    return next((t for t in sorted(rows) if rows[t]["rewards/format_reward/mean"] >= 1.25), None)


def test_study_c_is_complete_with_twelve_paired_seeds():
    assert SUMMARY_C["finished_runs"] == SUMMARY_C["total_runs"] == 24
    for arm in ("gtpo", "grpo"):
        assert SUMMARY_C["arms"][arm]["aggregated_seeds"] == SEEDS_C
    assert [pair["diff"]["n"] for pair in SUMMARY_C["pairs"]] == [12, 12, 12, 12]


def test_study_c_primary_outcome_is_the_registered_rule_and_documented():
    """By hand, independent of the analysis script: a run ran away when at least 6 of steps 31-40 had clipped share
    >= 0.5; one-sided Fisher p = P(X <= gtpo's count) for X hypergeometric (24 runs, 12 gtpo, all runaways drawn),
    from math.comb. The script, the study document and the README state the same counts and p-values."""
    from math import comb

    ran_away = {
        arm: [
            s for s in SEEDS_C if sum(_c_run(arm, s)[t]["completions/clipped_ratio"] >= 0.5 for t in range(31, 41)) >= 6
        ]
        for arm in ("gtpo", "grpo")
    }
    g, r = len(ran_away["gtpo"]), len(ran_away["grpo"])
    k = g + r
    p_less = sum(comb(k, x) * comb(24 - k, 12 - x) for x in range(g + 1)) / comb(24, 12)
    result = _analysis().study_c(STUDY_C)
    assert result["arms"]["gtpo"]["seeds"] == ran_away["gtpo"] and result["arms"]["grpo"]["seeds"] == ran_away["grpo"]
    assert result["p_one_sided_gtpo_less"] == pytest.approx(p_less, rel=1e-12)
    assert result["reject"] is (p_less < 0.05)
    section = " ".join(_section_c())
    seeds = {arm: ", ".join(map(str, ran_away[arm])) for arm in ran_away}
    assert (
        f"gtpo {g} of 12 runs ran away (seeds {seeds['gtpo']}), grpo {r} of 12 (seeds {seeds['grpo']}); "
        f"one-sided Fisher exact p = {p_less:.3f}, so H0 is {'' if p_less < 0.05 else 'not '}rejected at α = 0.05"
    ) in section
    assert f"(two-sided p = {result['p_two_sided']:.3f}, secondary)" in section
    readme = _flat(ROOT / "README.md")
    assert f"gtpo {g} of 12 runs ran away, grpo {r} of 12 (one-sided Fisher exact p = {p_less:.3f}" in readme
    for row in _rows("C"):
        assert f"| gtpo {g} of 12 runs ran away, grpo {r} of 12 (one-sided Fisher exact p = {p_less:.3f}, α" in row


@pytest.mark.parametrize("arm", ["gtpo", "grpo"])
def test_study_c_document_states_each_arm_mean(arm):
    row = next(line for line in _section_c() if line.startswith(f"| {arm} | "))
    _assert_arm_row(row, SUMMARY_C["arms"][arm]["metrics"], ("reward", "format %", "accuracy %", "entropy"))


def test_study_c_document_states_each_paired_difference_and_the_readme_its_reward():
    _assert_pair_rows(_section_c(), SUMMARY_C["pairs"])
    reward = next(p["diff"] for p in SUMMARY_C["pairs"] if p["metric"] == "reward")
    assert f"({_interval(reward, 2, sign=True)} of 20, a secondary outcome)" in _flat(ROOT / "README.md")


def test_study_c_per_run_table_is_the_scripts():
    """The document's per-run table is `analyze_preregistered.py runs` on the committed runs, line for line."""
    table = _analysis().runs_table(STUDY_C)
    assert len(table) == 2 + 24
    section = _section_c()
    for line in table:
        assert line in section, line


def test_study_c_secondary_and_post_hoc_figures():
    """The per-arm secondary figures and the post-hoc pattern, recomputed from the metrics files by hand: mean length
    and clipped share over steps 31-40; steps after step 2 with raw entropy above ln 2; format <= 10 % of 10 over the
    last 10 steps; the seeds whose step-1 group had no full-format completion (format mean below 1.25, the least one
    full-format completion gives: 10 / 8) and the first step each arm had one."""
    import math

    from gtpo.compare.stats import mean

    doc = _study_doc()
    runs = {arm: {s: _c_run(arm, s) for s in SEEDS_C} for arm in ("gtpo", "grpo")}

    def last10(rows: dict, key: str) -> float:
        return mean([rows[t][key] for t in range(31, 41)])

    length = {arm: mean([last10(rows, "completions/mean_length") for rows in runs[arm].values()]) for arm in runs}
    clipped = {
        arm: mean([100 * last10(rows, "completions/clipped_ratio") for rows in runs[arm].values()]) for arm in runs
    }
    assert f"{length['gtpo']:.1f} tokens (gtpo) against {length['grpo']:.1f} (grpo)" in doc
    assert f"clipped share {clipped['gtpo']:.1f} % against {clipped['grpo']:.1f} %" in doc
    high = {arm: sum(r["step"] > 2 and r["entropy"] > math.log(2) for rows in runs[arm].values() for r in rows.values())
            for arm in runs}  # fmt: skip
    assert f"for {high['gtpo']} steps in all in gtpo's and {high['grpo']} in grpo's" in doc
    stalled = {arm: [s for s, rows in runs[arm].items() if 10 * last10(rows, "rewards/format_reward/mean") <= 10]
               for arm in runs}  # fmt: skip
    assert stalled == {"gtpo": [100, 104, 105, 108, 110], "grpo": []}
    assert "**5 of 12 GTPO runs ended with format ≤ 10 % of its maximum** (seeds 100, 104, 105, 108, 110" in doc
    assert "**0 of 12 GRPO runs**" in doc
    p = _analysis().fisher_exact(5, 7, 0, 12)
    assert f"two-sided Fisher p of {p:.3f}" in doc
    no_full_first = [s for s in SEEDS_C if runs["gtpo"][s][1]["rewards/format_reward/mean"] < 1.25]
    # "Step 1 is the same computation in both arms": the same eight completions, so the same rewards and lengths
    for key in ("reward", "rewards/format_reward/mean", "completions/mean_length", "completions/max_length"):
        assert [runs["gtpo"][s][1][key] for s in SEEDS_C] == [runs["grpo"][s][1][key] for s in SEEDS_C], key
    assert no_full_first == [100, 104, 105, 106, 108, 110]
    assert "In 6 seeds (100, 104, 105, 106, 108, 110) none of the 8 first completions had the full format" in doc
    assert max(_first_full_format(runs["grpo"][s]) for s in no_full_first) == 4
    assert {s: _first_full_format(runs["gtpo"][s]) for s in no_full_first} == {
        100: None,
        104: None,
        105: None,
        106: 12,
        108: None,
        110: None,
    }
    assert "GRPO found the full format by step 2–4 in all six; GTPO in one (seed 106, at step 12)" in doc
    # study B's code on seed 100: the partial-format reward only, at steps 4-6
    old = _last_steps(STUDY_C / "post-hoc/study-b-code/seed100/metrics.jsonl")
    assert json.loads((STUDY_C / "post-hoc/study-b-code/seed100/run.json").read_text())["code"][
        "git_commit"
    ].startswith("ef70603")
    assert [old[t]["rewards/format_reward/mean"] for t in (4, 5, 6)] == [1.0, 1.0, 1.0]


def test_study_c_post_hoc_ablations_are_the_committed_runs():
    """The ablation sentence of study C's post-hoc section, from the committed 10-step runs: the first step with a
    full-format completion (format mean >= 1.25) per seed, without the entropy terms and without the conflict
    correction."""
    stalled = [100, 104, 105, 108, 110]

    def first_full(path: Path) -> int | None:
        rows = _last_steps(path / "metrics.jsonl")
        assert sorted(rows) == list(range(1, 11)), path
        return _first_full_format(rows)

    gamma0 = {s: first_full(STUDY_C / f"post-hoc/gamma0/seed{s}") for s in stalled}
    no_cc = {s: first_full(STUDY_C / f"post-hoc/no-conflict-correction/seed{s}") for s in stalled}
    assert gamma0 == dict.fromkeys(stalled)
    assert no_cc == {100: 5, 104: 2, 105: 2, 108: None, 110: 2}
    for variant in ("gamma0", "no-conflict-correction"):
        for s in stalled:
            run = json.loads((STUDY_C / f"post-hoc/{variant}/seed{s}/run.json").read_text())
            assert run["code"]["git_commit"] == (STUDY_C / "code-commit").read_text().strip()
            # step 1 is study C's own step 1 (same code, seed and settings)
            mine = _last_steps(STUDY_C / f"post-hoc/{variant}/seed{s}/metrics.jsonl")[1]
            theirs = _c_run("gtpo", s)[1]
            assert mine["completions/mean_length"] == theirs["completions/mean_length"]
            assert mine["reward"] == theirs["reward"]
    doc = _study_doc()
    assert "0 of 5 found the full format in 10 steps, as GTPO;" in doc
    assert "4 of 5 did (seeds 100, 104, 105, 110, at steps 5, 2, 2, 2; seed 108 not)" in doc
    # The step-10 entropies, pair by pair: test_the_entropy_of_each_stalled_gtpo_run_against_its_grpo_twin_...


def test_inspect_doc_states_where_the_collapse_warning_fired_in_study_c():
    """docs/inspect.md's study C line: the steps at which each run's own `monitor/collapse_warning` first turned 1."""
    fired = {}
    for arm in ("gtpo", "grpo"):
        for s in SEEDS_C:
            rows = _c_run(arm, s)
            step = next((t for t in sorted(rows) if rows[t]["monitor/collapse_warning"] == 1), None)
            if step is not None:
                fired.setdefault(arm, []).append((s, step))
    doc = _flat(ROOT / "docs" / "inspect.md")
    for arm, name in (("gtpo", "GTPO"), ("grpo", "GRPO")):
        seeds = ", ".join(str(s) for s, _ in fired[arm])
        steps = ", ".join(str(t) for _, t in fired[arm])
        assert f"{len(fired[arm])} {name} runs (seeds {seeds} at steps {steps})" in doc, arm


# ------------------------------------------------------------------------------------------- study D (issue 31)
STUDY_D = ROOT / "studies" / "smollm2-synthetic-lr2e-4-d"
SUMMARY_D = json.loads((STUDY_D / "summary.json").read_text())
SEEDS_D = list(range(100, 112))


def _assert_primary_documented(section: str, label: str, diffs: list[float]) -> str:
    """A held-out study's section (whitespace flattened) states its primary outcome from the per-seed differences,
    by hand (mean +- t_{0.975, n-1} s / sqrt(n); the callers also check the interval with t from a table):
    `label held-out pass@1 = figure over n seed pairs`, the registered two-sided reading that the interval gives
    (it excludes 0 below: GRPO higher; above: GTPO higher; or it includes 0: no difference detected), the effects
    excluded at 95 %, the SD and the effect n pairs detect at it. Returns the figure."""
    n, mean, sd = len(diffs), statistics.mean(diffs), statistics.stdev(diffs)
    half = _analysis().t_quantile(0.975, n - 1) * sd / n**0.5
    low, high = mean - half, mean + half
    figure = f"{_num(mean, 2)} points [95 % interval {_num(low, 2)}, {_num(high, 2)}]"
    assert f"{label} held-out pass@1 = {figure} over {n} seed pairs" in section
    if high < 0:
        reading = "The interval excludes 0: a difference is detected, in GRPO's favour"
        excluded = f"every effect above {_num(high, 2)} points), and a GRPO advantage larger than {-low:.1f} points"
    elif low > 0:
        reading = "The interval excludes 0: a difference is detected, in GTPO's favour"
        excluded = f"every effect below {_num(low, 2)} points), and a GTPO advantage larger than {high:.1f} points"
    else:
        reading = "The interval includes 0: no difference is detected"
        excluded = f"a GTPO advantage larger than {high:.1f} points and a GRPO advantage larger than {-low:.1f} points"
    assert reading in section, reading
    assert excluded in section, excluded
    assert f"The SD of the {n} differences is {sd:.2f} points" in section
    assert f"at that SD {n} pairs detect {_analysis().detectable_effect(sd, n):.1f} points with 80 % power" in section
    return figure


def _section_d() -> list[str]:
    return _section("d")


def test_study_d_is_complete_with_twelve_evaluated_pairs():
    assert SUMMARY_D["finished_runs"] == SUMMARY_D["total_runs"] == 24
    for arm in ("gtpo", "grpo"):
        assert SUMMARY_D["arms"][arm]["aggregated_seeds"] == SEEDS_D
    assert {pair["diff"]["n"] for pair in SUMMARY_D["pairs"]} == {12}


def test_study_d_primary_outcome_is_the_registered_computation_and_documented():
    """By hand, independent of the analysis script: d_S = 100 x (gtpo - grpo) pass@1 from the 24 results.json files,
    mean +- 2.201 s / sqrt(12); the script, the summary, the study page, and the studies' table (README and index)
    state it, the page with the effects it excludes."""
    diffs = [_pass1("gtpo", s, STUDY_D) - _pass1("grpo", s, STUDY_D) for s in SEEDS_D]
    mean, sd = statistics.mean(diffs), statistics.stdev(diffs)
    low, high = mean - 2.201 * sd / 12**0.5, mean + 2.201 * sd / 12**0.5
    result = _analysis().study_d(STUDY_D)
    assert result["seeds"] == SEEDS_D
    assert (result["mean"], result["low"], result["high"]) == (
        pytest.approx(mean), pytest.approx(low), pytest.approx(high)
    )  # fmt: skip
    pair = next(p["diff"] for p in SUMMARY_D["pairs"] if p["metric"] == "pass@1 %")
    assert (pair["mean"], pair["low"], pair["high"]) == (pytest.approx(mean), pytest.approx(low), pytest.approx(high))
    section = flat(" ".join(_section_d()))
    figure = _assert_primary_documented(section, "GTPO − GRPO", diffs)
    assert f"any GTPO advantage (every effect above {_num(high, 2)} points)" in section
    assert f"GTPO was lower at {sum(d < 0 for d in diffs)} of 12 seeds" in section
    top = flat(INDEX.read_text())
    assert f"the observed SD, {sd:.2f} points, gives 80 % power at {_analysis().detectable_effect(sd, 12):.1f}" in top
    for row in _rows("D"):
        assert f"| 12 (seeds 100–111) | yes | GTPO − GRPO held-out pass@1 {figure} | GRPO ahead," in row


def test_study_d_held_out_length_and_post_hoc_figures():
    """The registered length secondary from the script, and the post-hoc figures recomputed by hand: the two seeds'
    differences, the mean without them, gtpo/seed105's stall (no step with format mean >= 1.25) and the seeds whose
    first group lacked the full format, as in study C."""
    section = flat(" ".join(_section_d()))
    held = _analysis().heldout(STUDY_D)
    length, cut = held["held-out mean length (tokens)"], held["held-out cut at the limit (%)"]
    assert (
        f"mean length {_num(length['gtpo']['mean'], 2)} tokens [{_num(length['gtpo']['low'], 2)}, "
        f"{_num(length['gtpo']['high'], 2)}] against {_num(length['grpo']['mean'], 2)} "
        f"[{_num(length['grpo']['low'], 2)}, {_num(length['grpo']['high'], 2)}], "
        f"paired {_interval(length['gtpo - grpo'], 2)}"
    ) in section
    assert f"paired {_interval(cut['gtpo - grpo'], 2)}" in section
    diffs = {s: _pass1("gtpo", s, STUDY_D) - _pass1("grpo", s, STUDY_D) for s in SEEDS_D}
    assert (
        f"gtpo/seed105 (d = {_num(diffs[105], 1)})" in section
        and f"gtpo/seed110 (d = {_num(diffs[110], 1)})" in section
    )
    rest = [d for s, d in diffs.items() if s not in (105, 110)]
    half = 2.262 * statistics.stdev(rest) / 10**0.5  # t_{0.975, 9}
    mean = statistics.mean(rest)
    assert f"{_num(mean, 2)} [{_num(mean - half, 2)}, {_num(mean + half, 2)}] (10 pairs)" in section
    runs = {(a, s): _last_steps(STUDY_D / f"runs/{a}/seed{s}/metrics.jsonl") for a in ("gtpo", "grpo") for s in SEEDS_D}
    first = {k: _first_full_format(v) for k, v in runs.items()}
    assert first[("gtpo", 105)] is None and all(first[("grpo", s)] is not None for s in SEEDS_D)
    lacking = [s for s in SEEDS_D if runs[("gtpo", s)][1]["rewards/format_reward/mean"] < 1.25]
    assert lacking == [100, 104, 105, 106, 108, 110] and "(100, 104, 105, 106, 108, 110" in section
    gtpo_steps = sorted(first[("gtpo", s)] for s in lacking if first[("gtpo", s)] is not None)
    grpo_steps = sorted(first[("grpo", s)] for s in lacking)
    assert f"GTPO found the format in five of them (steps {gtpo_steps[0]}–{gtpo_steps[-1]})" in section
    assert f"GRPO in all six (steps {grpo_steps[0]}–{grpo_steps[-1]})" in section


def test_the_entropy_of_each_stalled_gtpo_run_against_its_grpo_twin_is_the_metrics_files():
    """The corrected reading of C's stall: each stalled GTPO run's step-10 completion entropy against its GRPO twin's,
    as the study document states them, recomputed from the committed metrics.jsonl (the last row of step 10)."""
    doc = _study_doc()

    def entropy(study: str, arm: str, seed: int) -> float:
        rows = _steps(ROOT / "studies" / study / "runs" / arm / f"seed{seed}" / "metrics.jsonl")
        return [r for r in rows if r["step"] == 10][-1]["entropy"]

    pairs = {}
    for study, seeds in (
        ("smollm2-synthetic-lr1e-3-c", (100, 104, 105, 108, 110)),
        ("smollm2-synthetic-lr2e-4-d", (105,)),
    ):
        for seed in seeds:
            pairs[(study[-1], seed)] = (entropy(study, "gtpo", seed), entropy(study, "grpo", seed))
    for key in (("c", 100), ("c", 108), ("c", 110), ("c", 105), ("d", 105)):
        gtpo, grpo = pairs[key]
        assert f"{gtpo:.3f} against {grpo:.3f}" in doc, key
    assert f"({pairs[('c', 104)][0]:.3f}, {pairs[('c', 104)][1]:.3f})" in doc
    lower = sorted(s for (study, s), (g, r) in pairs.items() if study == "c" and g < r - 0.05)
    higher = sorted(s for (study, s), (g, r) in pairs.items() if g > r + 0.05)
    assert lower == [100, 108, 110] and higher == [105, 105]


ABLATIONS = ROOT / "studies" / "smollm2-synthetic-lr1e-3-ablations"


def test_the_one_flag_ablation_table_is_the_committed_runs():
    """docs/studies/mechanism.md's "One flag at a time" table, recomputed from the committed 15-step runs with study
    E's stall rule and first-full-format step (studies/tools/analyze_preregistered.py), and its control equal to the
    guard screen's GTPO runs step for step."""
    analysis = _analysis()
    seeds = (100, 104, 105, 108, 110)
    arms = ("gtpo", "forward-only", "backward-only", "no-doubling", "no-protection", "protect-only", "authors-code")
    doc = _study_doc()
    for arm in arms[1:]:
        result = analysis.study_e(ABLATIONS, arms=("gtpo", arm))
        assert result["pairs"] == 5
        for name in ("gtpo", arm) if arm == arms[1] else (arm,):
            cells = []
            for seed in seeds:
                step = result["first_full_format_step"][name][seed]  # int keys (JSON output makes them strings)
                if seed in result["stalled"][name]:
                    cells.append("stall")
                elif name == "authors-code" and step == 1:
                    cells.append("(format in group 1)")
                else:
                    cells.append(f"format at {step}")
            row = " | ".join(cells) + f" | {len(result['stalled'][name])}/5 |"
            assert row in doc, f"{name}: {row}"
    for seed in seeds:
        control = _last_steps(ABLATIONS / f"runs/gtpo/seed{seed}/metrics.jsonl")
        screen = _last_steps(ROOT / f"studies/smollm2-synthetic-lr1e-3-guard/runs/gtpo/seed{seed}/metrics.jsonl")
        assert [(r["reward"], r["loss"]) for r in control.values()] == [
            (r["reward"], r["loss"]) for r in screen.values()
        ]


# ------------------------------------------------------------------------------------------------------- study F

STUDY_F = ROOT / "studies" / "smollm2-synthetic-lr2e-4-f"
SUMMARY_F = json.loads((STUDY_F / "summary.json").read_text())
SEEDS_F = list(range(300, 320))
F_ARMS = ("gtpo-guard", "grpo")


def _section_f() -> list[str]:
    return _section("f")


def _f_flat() -> str:
    return flat(" ".join(_section_f()))


@functools.cache
def _study_f() -> dict:
    """`analyze_preregistered.py f`'s result (it reads the 800 completion files of the guard arm: computed once)."""
    return _analysis().study_f(STUDY_F)


def _t_interval(values: list[float], t: float) -> str:
    """mean [low, high] with a hand-given t quantile, in the documents' style (2 decimals)."""
    mean, half = statistics.mean(values), t * statistics.stdev(values) / len(values) ** 0.5
    return f"{_num(mean, 2)} [{_num(mean - half, 2)}, {_num(mean + half, 2)}]"


def test_study_f_is_complete_with_twenty_evaluated_pairs():
    assert SUMMARY_F["finished_runs"] == SUMMARY_F["total_runs"] == 40
    for arm in F_ARMS:
        assert SUMMARY_F["arms"][arm]["aggregated_seeds"] == SEEDS_F
    assert {pair["diff"]["n"] for pair in SUMMARY_F["pairs"]} == {20}
    assert (STUDY_F / "code-commit").read_text().strip().startswith("19f5ce3")


T_975_19 = 2.093  # t_{0.975, 19}, the registration's (a printed t table)


def _assert_twenty_pair_primary(diffs: list[float], result: dict, summary: dict, seeds: list[int]) -> None:
    """A 20-pair study's primary outcome by hand, mean +- T_975_19 s / sqrt(20) (t_{0.975, 19} = 2.093 from a printed
    table, the registrations'), is the analysis script's ``result`` and the summary's pass@1 pair."""
    mean, sd = statistics.mean(diffs), statistics.stdev(diffs)
    low, high = mean - T_975_19 * sd / 20**0.5, mean + T_975_19 * sd / 20**0.5
    assert result["seeds"] == seeds
    approx = (pytest.approx(mean), pytest.approx(low, abs=1e-3), pytest.approx(high, abs=1e-3))
    assert (result["mean"], result["low"], result["high"]) == approx
    pair = next(p["diff"] for p in summary["pairs"] if p["metric"] == "pass@1 %")
    assert (pair["mean"], pair["low"], pair["high"]) == approx


@pytest.mark.slow
def test_study_f_primary_outcome_is_the_registered_computation_and_documented():
    """By hand, independent of the analysis script: d_S = 100 x (gtpo-guard - grpo) pass@1 from the 40 results.json
    files, mean +- 2.093 s / sqrt(20) (t_{0.975, 19}, the registration's); the script, the summary, the study page,
    the studies' table (README and index) and GTPOConfig.conflict_guard's help state it."""
    diffs = [_pass1("gtpo-guard", s, STUDY_F) - _pass1("grpo", s, STUDY_F) for s in SEEDS_F]
    sd = statistics.stdev(diffs)
    result = _study_f()
    _assert_twenty_pair_primary(diffs, result, SUMMARY_F, SEEDS_F)
    section = _f_flat()
    figure = _assert_primary_documented(section, "GTPO with the guard − GRPO", diffs)
    assert f"guard arm was lower at {sum(d < 0 for d in diffs)} of 20 seeds" in section
    top = flat(INDEX.read_text())
    assert f"its observed SD, {sd:.2f} points, gives 80 % power at {_analysis().detectable_effect(sd, 20):.1f}" in top
    for row in _rows("F"):
        assert f"| 20 (seeds 300–319) | yes | GTPO with the guard − GRPO held-out pass@1 {figure} | GRPO still" in row
    from gtpo.trainer.config import GTPOConfig

    help_text = GTPOConfig.__dataclass_fields__["conflict_guard"].metadata["help"]
    assert f"{-result['mean']:.1f} points below GRPO's [{-result['high']:.1f}, {-result['low']:.1f}] (95 percent" \
        in help_text  # fmt: skip


STUDY_G = ROOT / "studies" / "smollm2-two-step-g"
SUMMARY_G = json.loads((STUDY_G / "summary.json").read_text())
SEEDS_G = list(range(400, 420))
G_ARMS = ("gtpo", "grpo")


def _section_g() -> list[str]:
    return _section("g")


# The three held-out studies (D, F, G): section, summary, folder, arms. Their document sections have the same tables.
HELD_OUT_STUDIES = {
    "d": (_section_d, SUMMARY_D, STUDY_D, ("gtpo", "grpo")),
    "f": (_section_f, SUMMARY_F, STUDY_F, F_ARMS),
    "g": (_section_g, SUMMARY_G, STUDY_G, G_ARMS),
}


@pytest.mark.parametrize("study", HELD_OUT_STUDIES)
def test_held_out_study_document_states_each_arm_mean(study):
    section, summary, _, arms = HELD_OUT_STUDIES[study]
    names = ("reward", "format %", "accuracy %", "entropy", "pass@1 %", "pass@2 %", "pass@4 %", "pass@8 %", "maj@4 %",
             "maj@8 %")  # fmt: skip
    for arm in arms:
        row = next(line for line in section() if line.startswith(f"| {arm} | "))
        _assert_arm_row(row, summary["arms"][arm]["metrics"], names)


@pytest.mark.parametrize("study", HELD_OUT_STUDIES)
def test_held_out_study_document_states_each_paired_difference(study):
    section, summary, _, _ = HELD_OUT_STUDIES[study]
    _assert_pair_rows(section(), [p for p in summary["pairs"] if p["metric"] != "maj@1 %"])


@pytest.mark.parametrize("study", HELD_OUT_STUDIES)
def test_held_out_study_per_seed_and_per_run_tables_are_the_scripts(study):
    section, _, folder, arms = HELD_OUT_STUDIES[study]
    lines = section()
    for line in _analysis().seeds_table(folder, arms) + _analysis().runs_table(folder):
        assert line in lines, line


def test_study_f_registered_secondary_figures_are_the_scripts():
    """The registered secondaries the section states: held-out length and cut share paired, the stall rule per arm
    (recomputed by hand from the metrics files: no step 1-15 with format mean >= 1.25), and the guard's λ-0 share of
    span tokens from the records (median and range over the 20 guard runs)."""
    result = _study_f()
    section = _f_flat()
    for label, lead, unit in (("held-out mean length (tokens)", "mean length", " tokens"),
                              ("held-out cut at the limit (%)", "cut at the 96-token limit", " %")):  # fmt: skip
        figures = result["secondary_heldout"][label]
        guard, grpo = _interval(figures["gtpo-guard"], 2), _interval(figures["grpo"], 2)
        paired = _interval(figures["gtpo-guard - grpo"], 2, sign=True)
        guard = guard.replace(" [", f"{unit} [", 1)
        assert f"{lead} {guard} against {grpo}, paired {paired}" in section, label
    runs = {(a, s): _last_steps(STUDY_F / f"runs/{a}/seed{s}/metrics.jsonl") for a in F_ARMS for s in SEEDS_F}
    stalled = {a: [s for s in SEEDS_F if not any(runs[(a, s)][t]["rewards/format_reward/mean"] >= 1.25
                                                 for t in range(1, 16))] for a in F_ARMS}  # fmt: skip
    assert stalled == result["secondary_stall"]["stalled"] == {"gtpo-guard": [], "grpo": [313]}
    assert "0 of 20 gtpo-guard runs and 1 of 20 grpo runs stalled (grpo/seed313)" in section
    lacking = [s for s in SEEDS_F if runs[("grpo", s)][1]["rewards/format_reward/mean"] < 1.25]
    assert lacking == result["secondary_stall"]["first_group_without_full_format"]
    assert f"at {len(lacking)} of 20 seeds ({', '.join(map(str, lacking))})" in section
    guard_steps = [_first_full_format(runs[("gtpo-guard", s)]) for s in lacking]
    grpo_steps = [t for t in (_first_full_format(runs[("grpo", s)]) for s in lacking) if t <= 15]
    assert f"the guard found the format at steps {min(guard_steps)}–{max(guard_steps)} at all nine" in section
    assert f"GRPO at steps {min(grpo_steps)}–{max(grpo_steps)} at eight" in section
    spans = result["secondary_guard_spans"]
    assert len(spans) == 20 and all(v["λ 2 %"] == 0 for v in spans.values())
    zero, positive = [v["λ 0 %"] for v in spans.values()], [v["positive λ 0 %"] for v in spans.values()]
    assert f"median {statistics.median(zero):.1f} % of span tokens per run (range {min(zero):.1f}–{max(zero):.1f} %)" \
        in section  # fmt: skip
    assert f"median {statistics.median(positive):.1f} %, range {min(positive):.1f}–{max(positive):.1f} %" in section


def test_study_f_post_hoc_figures_are_the_committed_runs():
    """The post-hoc figures of the reading, by hand from the committed files: the difference over the seeds whose
    first group lacked the full format and over the others (t_{0.975, 8} = 2.306, t_{0.975, 10} = 2.228), without
    the four seeds of the two failure modes (t_{0.975, 15} = 2.131); the guard's late stall at seed 313 (full format
    only at steps 3 and 11, all-partial 16-40) against grpo's first full format at step 26; the runaway seeds'
    held-out cut shares."""
    section = _f_flat()
    diffs = {s: _pass1("gtpo-guard", s, STUDY_F) - _pass1("grpo", s, STUDY_F) for s in SEEDS_F}
    lacking = [305, 306, 307, 309, 312, 313, 315, 316, 317]
    assert f"the difference was {_t_interval([diffs[s] for s in lacking], 2.306).replace(' [', ' points [', 1)}; " \
        "at the other 11," in section  # fmt: skip
    assert f"the other 11, {_t_interval([d for s, d in diffs.items() if s not in lacking], 2.228)}." in section
    rest = [d for s, d in diffs.items() if s not in (309, 314, 318, 319)]
    assert f"{_t_interval(rest, 2.131)} (16 pairs)" in section
    worst = sorted(diffs, key=diffs.get)[:5]
    assert sorted(worst) == [301, 309, 314, 318, 319]
    for seed in worst:
        assert f"{seed} ({_num(diffs[seed], 1)})" in section, seed
    guard = _last_steps(STUDY_F / "runs/gtpo-guard/seed313/metrics.jsonl")
    assert [t for t, r in guard.items() if r["rewards/format_reward/mean"] >= 1.25] == [3, 11]
    assert all(guard[t]["rewards/format_reward/mean"] == 1.0 for t in range(16, 41))
    assert _first_full_format(_last_steps(STUDY_F / "runs/grpo/seed313/metrics.jsonl")) == 26
    results = [STUDY_F / f"runs/gtpo-guard/seed{s}/eval/synthetic/results.json" for s in (309, 314)]
    cut = [100 * json.loads(path.read_text())["truncated_frac"] for path in results]
    assert f"{cut[0]:.1f} % and {cut[1]:.1f} % of their held-out completions cut" in section


def test_the_guard_gamma_screen_is_the_committed_runs():
    """docs/studies/f.md's exploratory screen after study F: its control repeats F's two runaway gtpo-guard
    runs step for step (reward and loss), its per-run table is the script's, the γ = 0 runs did not run away, and
    the share of all-equal-reward steps it quotes is F's metrics files'."""
    screen = ROOT / "studies" / "smollm2-synthetic-lr2e-4-guard-gamma"
    for seed in (309, 314):
        control = _last_steps(screen / f"runs/gtpo-guard/seed{seed}/metrics.jsonl")
        f_run = _last_steps(STUDY_F / f"runs/gtpo-guard/seed{seed}/metrics.jsonl")
        assert len(control) == 40 and [(r["reward"], r["loss"]) for r in control.values()] == [
            (r["reward"], r["loss"]) for r in f_run.values()
        ]
    section = _section("f", RUNAWAY_HEADING, COLLAPSE_HEADING)
    rows = _analysis().runs_table(screen)
    for line in rows:
        assert line in section, line
    assert [line.split(" | ")[7] for line in rows[2:]] == ["yes", "yes", "no", "no"]  # the "ran away" column
    equal = {
        arm: [sum(_last_steps(STUDY_F / f"runs/{arm}/seed{s}/metrics.jsonl")[t]["frac_reward_zero_std"]
                  for t in range(31, 41)) for s in SEEDS_F]
        for arm in F_ARMS
    }  # fmt: skip
    every = equal["gtpo-guard"] + equal["grpo"]
    text = flat(" ".join(section))
    assert (
        f"a median of {statistics.median(equal['gtpo-guard']):.0f} in F's gtpo-guard runs and "
        f"{statistics.median(equal['grpo']):.0f} in its grpo runs, range {min(every):.0f}–{max(every):.0f}"
    ) in text


# Study E's registered secondaries and the wording fixes of issue 48, item 1.
STUDY_E = ROOT / "studies" / "smollm2-synthetic-lr1e-3-e"
SEEDS_E = list(range(200, 232))
T_975_31 = 2.0395  # t_{0.975, 31}, from a printed t table (independent of gtpo.compare.stats)


def _section_e() -> str:
    return flat(" ".join(_section("e")))


def test_study_e_registered_secondary_per_arm_values_are_the_metrics_files():
    """E's registration names per-arm values over steps 11-15 of format, entropy, completion length and
    frac_reward_zero_std: recomputed by hand from the 64 metrics files (each run's mean over steps 11-15, then mean
    +- t_{0.975,31} s / sqrt(32)), they are the script's and the document's table row for row, both entropy metrics
    named."""
    keys = (("rewards/format_reward/mean", 10.0), ("gtpo/mean_entropy", 1.0), ("entropy", 1.0),
            ("completions/mean_length", 1.0), ("frac_reward_zero_std", 1.0))  # fmt: skip
    script = _analysis().study_e_registered_secondary(STUDY_E)
    section = _section_e()
    for arm in ("gtpo", "gtpo-nocc"):
        runs = [_last_steps(STUDY_E / f"runs/{arm}/seed{s}/metrics.jsonl") for s in SEEDS_E]
        cells = []
        for (key, scale), name in zip(keys, _analysis().E_SECONDARY_METRICS, strict=True):
            values = [scale * statistics.mean(run[t][key] for t in range(11, 16)) for run in runs]
            cells.append(_t_interval(values, T_975_31))
            assert script[arm][name]["mean"] == pytest.approx(statistics.mean(values)), (arm, name)
        assert f"| {arm} | {' | '.join(cells)} |" in section, arm
    assert "entropy, `gtpo/mean_entropy` | entropy, TRL's `entropy`" in section


def test_study_e_unregistered_entropy_difference_under_each_metric():
    """The not-registered paired entropy difference over steps 6-15 under the summary's `gtpo/mean_entropy` (its
    interval holds 0) and under TRL's `entropy` (it does not), by hand from the metrics files."""
    section = _section_e()
    texts = {}
    for key in ("gtpo/mean_entropy", "entropy"):
        diffs = []
        for s in SEEDS_E:
            a, b = (_last_steps(STUDY_E / f"runs/{arm}/seed{s}/metrics.jsonl") for arm in ("gtpo", "gtpo-nocc"))
            diffs.append(statistics.mean(a[t][key] - b[t][key] for t in range(6, 16)))
        texts[key] = _t_interval(diffs, T_975_31)
    mean_entropy, trl = (texts[k] for k in ("gtpo/mean_entropy", "entropy"))
    assert f"entropy {mean_entropy.replace(' [', ' nats [', 1)} as `gtpo/mean_entropy`" in section
    assert f"the entropy difference is {trl} nats, an interval that excludes 0" in section
    assert float(trl.split(", ")[1].rstrip("]").replace("−", "-")) < 0 <= float(mean_entropy.split(", ")[1][:-1])


def test_study_e_format_lost_step_by_step_against_the_moving_average():
    """The three runs that learned the format and lost it: step by step (the step after the last full-format group,
    by hand) 8, 3 and 4, as the script's format_lost_from and the document say; summary.md's moving-average "first
    format drop" (12, 4, 6) is the other figure, and the document names it as such."""
    section = _section_e()
    summary = (STUDY_E / "summary.md").read_text().splitlines()
    for arm, seed, lost, moving in (("gtpo", 227, 8, 12), ("gtpo-nocc", 202, 3, 4), ("gtpo-nocc", 222, 4, 6)):
        steps = _last_steps(STUDY_E / f"runs/{arm}/seed{seed}/metrics.jsonl")
        full = [t for t in range(1, 16) if steps[t]["rewards/format_reward/mean"] >= 1.25]
        assert full and max(full) + 1 == lost == _analysis().format_lost_from(steps), (arm, seed)
        row = next(line for line in summary if line.startswith(f"| {arm}/seed{seed} |"))
        assert row.split(" | ")[3] == str(moving), row
        assert f"from step {lost} on ({arm}/seed{seed})" in section
    assert 'the "first format drop" (12, 4 and 6)' in section


def _welch_p_by_integration(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """Welch's t, df and two-sided p with the t density integrated numerically (Simpson's rule on [0, |t|]),
    independent of the script's continued fraction."""
    import math

    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    t = (statistics.mean(a) - statistics.mean(b)) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    norm = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
    density = lambda x: norm * (1 + x * x / df) ** (-(df + 1) / 2)  # noqa: E731
    n, h = 2000, abs(t) / 2000
    inner = sum((4 if i % 2 else 2) * density(i * h) for i in range(1, n))
    central = h / 3 * (density(0) + inner + density(abs(t)))  # P(0 < T < |t|)
    return t, df, 1 - 2 * central


def test_study_f_subgroup_pattern_is_worded_with_its_welch_test():
    """The post-hoc subgroup difference (first group without the full format vs the others) is described as a pattern:
    the study page gives Welch's p (recomputed here by numerical integration), which is above 0.05, and the two
    subgroup intervals overlap; the README does not state the pattern as a finding."""
    diffs = {s: _pass1("gtpo-guard", s, STUDY_F) - _pass1("grpo", s, STUDY_F) for s in SEEDS_F}
    lacking = [305, 306, 307, 309, 312, 313, 315, 316, 317]
    a, b = [diffs[s] for s in lacking], [d for s, d in diffs.items() if s not in lacking]
    t, df, p = _welch_p_by_integration(a, b)
    script = _analysis().study_f_first_group_subgroups(STUDY_F)
    assert script["lacking"]["seeds"] == lacking
    assert (script["welch"]["t"], script["welch"]["df"], script["welch"]["p"]) == pytest.approx((t, df, p), rel=1e-6)
    assert p > 0.05 and script["lacking"]["high"] > script["other"]["low"]  # not told apart; intervals overlap
    section = _f_flat()
    difference = statistics.mean(a) - statistics.mean(b)
    assert f"the subgroups' difference, {difference:.2f} points, is not told apart from 0" in section
    assert f"(Welch's t-test, t = {t:.2f} on {df:.1f} degrees of freedom, two-sided p = {p:.2f};" in section
    assert "(a pattern seen after the analysis, post hoc, not a finding)" in section
    assert "The gap is not where the stall was" not in section
    assert "the gap came mostly from" not in _flat(ROOT / "README.md")


def test_study_f_stall_is_stated_as_the_data_show():
    """The reading states the registered stall secondary as descriptive with its two McNemar p's (the script's), the
    guard's late stall at seed 313, and that F has no plain-GTPO arm; the studies' table states the stall rule's
    counts; the train.log claim is stated as not checkable (no run folder of F holds a log)."""
    stall = _study_f()["secondary_stall"]
    section = _f_flat()
    p_guard, p_grpo = stall["p_one_sided_guard_stalls_more"], stall["p_one_sided_grpo_stalls_more"]
    assert f"(McNemar p {p_guard:.1f} and {p_grpo:.1f}, no difference detected either way)" in section
    assert "one guard run (seed 313) stalled after step 15" in section
    assert "F has no plain-GTPO arm" in section
    assert "The guard did what it was built for" not in section
    assert stall["stalled"]["gtpo-guard"] == [] and stall["stalled"]["grpo"] == [313]
    for row in _rows("F"):
        assert "no guard run stalled by study E's rule (GRPO 1 of 20) |" in row
    assert not [p for p in (STUDY_F / "runs").rglob("*") if p.name in ("train.log", "train-log.txt")]
    assert "those logs are gone, so the claim cannot be checked from the repository" in section


def test_the_guard_gamma_runs_part_where_the_document_says():
    """γ = 0 against γ = 0.1 at seeds 309 and 314: the first step whose rewards differ (metrics files) and whose
    sampled completions differ (completion records), as the screen's paragraph states them."""
    from gtpo.runs import completions as records

    screen = ROOT / "studies" / "smollm2-synthetic-lr2e-4-guard-gamma" / "runs"
    parted = {}
    for seed in (309, 314):
        runs = [screen / f"{arm}/seed{seed}" for arm in ("gtpo-guard", "guard-nogamma")]
        a, b = (_last_steps(run / "metrics.jsonl") for run in runs)
        reward = next(t for t in sorted(a) if a[t]["reward"] != b[t]["reward"])
        ids = next(t for t in records.recorded_steps(runs[0])
                   if len({str(records.read_step(r, t)["columns"]["completion_ids"]) for r in runs}) == 2)  # fmt: skip
        parted[seed] = (reward, ids)
    assert all(ids <= reward for reward, ids in parted.values())  # different rewards need different completions
    text = flat(" ".join(_section("f", RUNAWAY_HEADING, COLLAPSE_HEADING)))
    assert (
        f"the runs' rewards part from step {parted[309][0]} (seed 309) and step {parted[314][0]} (seed 314) on, their "
        f"sampled completions from step {parted[309][1]} and step {parted[314][1]})"
    ) in text


# The collapse onto one wrong answer (issue 48, item 2; exploratory): the section's figures from the records.
D_RERUN = ROOT / "studies" / "smollm2-synthetic-lr2e-4-d-rerun"
COLLAPSE_RUNS = [
    *(STUDY_F / f"runs/{arm}/seed{seed}" for seed in (319, 318) for arm in F_ARMS),
    D_RERUN / "runs/gtpo/seed110",
]


def _words(n: int) -> str:
    return {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven"}[n]


def _collapse_lines() -> list[str]:
    return _section("f", COLLAPSE_HEADING)


def _collapse_section() -> str:
    return flat(" ".join(_collapse_lines()))


@functools.cache
def _collapse_rows(run: Path) -> list[dict]:
    return load_script("collapse_one_answer").run_rows(run)


def _samples_by_problem(run: Path) -> dict[str, list[dict]]:
    by_problem: dict[str, list[dict]] = {}
    for line in (run / "eval/synthetic/samples.jsonl").read_text().splitlines():
        row = json.loads(line)
        by_problem.setdefault(row["problem_id"], []).append(row)
    return by_problem


def test_the_collapse_held_out_table_is_the_samples_files():
    """By hand from each run's samples.jsonl (8 samples per problem): pass@1, the problems whose 8 samples were one
    wrong answer, distinct answers and the most common answer's share per problem; seed 110's "1" count; and seed
    319's 32 problems are the most of F's 40 runs (grpo/seed311 next, 20)."""
    section = _collapse_section()

    def agreement(run: Path) -> tuple[float, int, float, float]:
        problems = _samples_by_problem(run)
        one = distinct = share = correct = 0
        for rows in problems.values():
            answers = [(r["answer"] or "").strip().rstrip(".").strip() for r in rows]
            top = max(answers.count(a) for a in answers)
            one += top == len(answers) and not any(r["correct"] for r in rows)
            distinct, share = distinct + len(set(answers)), share + top / len(answers)
            correct += sum(r["correct"] for r in rows)
        n = len(problems)
        return 100 * correct / (8 * n), one, distinct / n, share / n

    runs = [(("F", STUDY_F / f"runs/{arm}/seed{s}")) for s in (319, 318) for arm in F_ARMS] + [
        ("D", STUDY_D / f"runs/{arm}/seed110") for arm in ("gtpo", "grpo")
    ]
    lines = _collapse_lines()
    for study, run in runs:
        accuracy, one, distinct, share = agreement(run)
        row = f"| {study}: {run.parent.name}/{run.name} | {accuracy:.1f} | {one} | {distinct:.2f} | {share:.2f} |"
        assert row in lines, row
    ones = {f"{p.parent.name}/{p.name}": agreement(p)[1] for p in sorted((STUDY_F / "runs").glob("*/seed*"))}
    ranked = sorted(ones, key=ones.get, reverse=True)
    assert ranked[:2] == ["gtpo-guard/seed319", "grpo/seed311"] and ones[ranked[0]] > ones[ranked[1]]
    assert f"(its GRPO twin {ones['grpo/seed319']}; the most of F's 40 runs, the next grpo/seed311 with " \
        f"{ones['grpo/seed311']})" in section  # fmt: skip
    answers = [r["answer"] for rows in _samples_by_problem(STUDY_D / "runs/gtpo/seed110").values() for r in rows]
    assert f'"1" was the answer of {answers.count("1")} of {len(answers)}' in section


def test_the_collapse_training_table_and_figures_are_the_records():
    """The per-run table is the script's over steps 21-40; the figures around it by hand from the record columns:
    the shift per completion at steps without signal (Σ (A - A') / completions) against |A| at steps with signal,
    ⟨H⟩_ini against ln 2 and the filtered completions (δ), the step the arms' sampled completions part, and seed
    110's answers (the modal answer per step, no right answer after step 23, the protected right sums)."""
    import math

    from gtpo.runs import completions as records

    script = load_script("collapse_one_answer")
    section = _collapse_section()
    lines = _collapse_lines()
    for line in script.table([str(run) for run in COLLAPSE_RUNS]):
        assert line in lines, line
    shift, signal = {}, {}
    for run in (COLLAPSE_RUNS[0], COLLAPSE_RUNS[2], COLLAPSE_RUNS[4]):
        flat_push, flat_n, adv, adv_n = 0.0, 0, 0.0, 0
        for t in range(21, 41):
            c = records.read_step(run, t)["columns"]
            if max(c["reward"]) == min(c["reward"]):
                flat_push += sum(
                    a - u for a, u in zip(c["advantage"], c["advantage_used"], strict=True) if u is not None
                )
                flat_n += len(c["reward"])
            else:
                adv, adv_n = adv + sum(abs(a) for a in c["advantage"]), adv_n + len(c["reward"])
        shift[run.name], signal[run.name] = flat_push / flat_n, adv / adv_n
    assert f"was {shift['seed319']:.4f} (seed 319), {shift['seed318']:.4f} (318) and {shift['seed110']:.4f} (110)" \
        in section  # fmt: skip
    assert f"a mean |A| of {min(signal.values()):.2f} to {max(signal.values()):.2f} per completion" in section
    shares = [100 * shift[k] / signal[k] for k in shift]
    assert f"signal: {min(shares):.1f} % to {max(shares):.1f} % of it." in section
    assert f"the shift {min(shares):.1f}–{max(shares):.1f} % of a signal step's push" in section
    ini = {
        s: records.read_step(STUDY_F / f"runs/gtpo-guard/seed{s}", 1)["metadata"]["initial_entropy"] for s in (318, 319)
    }
    ini_110 = records.read_step(COLLAPSE_RUNS[4], 1)["metadata"]["initial_entropy"]
    assert min(ini.values()) > math.log(2) > ini_110
    assert f"⟨H⟩_ini = {ini[318]:.2f} and {ini[319]:.2f} nats (seeds 318, 319)" in section
    assert f"(⟨H⟩_ini = {ini_110:.2f}) it dropped" in section
    guard_runs = (STUDY_F / "runs/gtpo-guard/seed318", STUDY_F / "runs/gtpo-guard/seed319")
    assert not any(f for run in guard_runs for r in _collapse_rows(run) for f in [r["filtered"]])
    assert "(no completion filtered in 40 steps)" in section
    rows_110 = _collapse_rows(COLLAPSE_RUNS[4])
    assert f"it dropped {sum(r['filtered'] for r in rows_110)} completions in 40 steps, " \
        f"{sum(r['filtered'] for r in rows_110 if r['step'] > 20)} of them after step 20" in section  # fmt: skip
    for seed in (318, 319):
        arms = [STUDY_F / f"runs/{arm}/seed{seed}" for arm in F_ARMS]
        part = next(
            t
            for t in range(1, 41)
            if len({str(records.read_step(a, t)["columns"]["completion_ids"]) for a in arms}) == 2
        )
        assert part == 2, seed  # the text: "part at step 2 (from the first update on)"
    assert "part at step 2 (from the first update on)" in section
    by_step = {r["step"]: r for r in rows_110}
    assert (by_step[21]["modal_answer"], by_step[21]["correct"]) == ("10", 5)
    assert (by_step[23]["modal_answer"], by_step[23]["correct"], by_step[23]["signal"]) == ("10", 8, 0)
    late = [t for t in range(22, 41) if by_step[t]["modal_answer"] in ("1", "10")]
    assert f'"1" or "10" at {len(late)} of 19 steps' in section
    assert not any(by_step[t]["correct"] for t in range(24, 41))
    early = statistics.mean(by_step[t]["copies"] for t in range(1, 21))
    assert f"a mean of {early:.2f} of 8" in section
    wrong = sum(r["right_reasoning_wrong_answer"] for r in rows_110)
    protected = {r["step"]: r["protected_reasoning"] for r in rows_110 if r["protected_reasoning"]}
    assert f"acted on {sum(protected.values())} of the {wrong} completions" in section
    assert sorted(protected) == [13, 21] and "(steps 13 and 21)" in section
    summary = {f"{run.parent.name}/{run.name}": script.summarize(_collapse_rows(run)) for run in COLLAPSE_RUNS}
    g319, r319, g318, r318 = (
        summary[k] for k in ("gtpo-guard/seed319", "grpo/seed319", "gtpo-guard/seed318", "grpo/seed318")
    )
    early_f = [
        statistics.mean(r["copies"] for r in _collapse_rows(run) if r["step"] <= 20) for run in COLLAPSE_RUNS[:4]
    ]
    for text in (
        f"(F's four runs: {min(early_f):.2f} to {max(early_f):.2f})",
        f"repeat the reasoning's sum ({g319['copies']:.2f} of 8 in training steps 21–40)",
        f"({g319['distinct']:.2f} and {r319['distinct']:.2f} distinct answers per group over steps 21–40",
        f"eight at steps {' and '.join(map(str, g319['one_wrong_answer_steps']))} against the twin's "
        f"{', '.join(map(str, r319['one_wrong_answer_steps']))})",
        f"Its answers scattered: {g318['distinct']:.2f} distinct answers per group over steps 21–40 (twin "
        f"{r318['distinct']:.2f})",
        f"({g318['correct']:.2f} of 8 per group over steps 21–40, twin {r318['correct']:.2f})",
        f"({g318['steps_without_signal']} of 20, twin {r318['steps_without_signal']})",
        f"{g319['sum_in_span']} of {g319['sum_tokens']} sum tokens at gtpo-guard/seed319 were in a span",
        f"at seed 318, {g318['sum_lambda_0']} of {g318['sum_tokens']:,} at λ 0",
    ):
        assert text in section, text
    assert g319["sum_lambda_0"] == g319["sum_lambda_2"] == g318["sum_lambda_2"] == 0  # "none at a λ other than 1"
    step_33 = {
        arm: next(r for r in _collapse_rows(STUDY_F / f"runs/{arm}/seed319") if r["step"] == 33) for arm in F_ARMS
    }
    guard_33, grpo_33 = step_33["gtpo-guard"], step_33["grpo"]
    assert guard_33["one_wrong_answer"] and guard_33["modal_answer"] == "14" and guard_33["signal"] == 0
    assert guard_33["shift"] == pytest.approx(0.1 * 8 * guard_33["entropy"])  # γ Σ⟨H⟩_i, γ = 0.1
    assert grpo_33["correct"] == 0 and grpo_33["signal"] == 0 and grpo_33["shift"] == 0
    assert (
        f"only the shift, {guard_33['shift']:.3f} in all (mean ⟨H⟩_i {guard_33['entropy']:.3f} nats); GRPO's group for "
        f'the same prompt had {grpo_33["distinct"]} different wrong answers ("14" {_words(grpo_33["modal"])} times)'
    ) in section
    late_319 = [statistics.mean(r["correct"] for r in _collapse_rows(STUDY_F / f"runs/{arm}/seed319") if r["step"] > 30)
                for arm in F_ARMS]  # fmt: skip
    assert f"({late_319[0]:.2f} of 8 per group over steps 31–40, against the twin's {late_319[1]:.2f})" in section


@pytest.mark.parametrize(
    ("study", "arm", "seeds", "named"),
    [
        ("d", "gtpo", SEEDS_D, "entropy: TRL's token-mean `entropy`"),
        ("f", "gtpo-guard", SEEDS_F, "entropy: TRL's token-mean `entropy`"),
        ("e", "gtpo", SEEDS_E, "as `gtpo/mean_entropy`"),
    ],
)
def test_each_summary_entropy_is_the_metric_the_document_names(study, arm, seeds, named):
    """`gtpo compare` reads `gtpo/mean_entropy` when every run logs it (E: both arms are GTPO) and TRL's `entropy`
    otherwise (D, F: GRPO logs no other). By hand from the metrics files, the summary's per-arm entropy is the mean
    of the named metric over the last 10 steps, not of the other, and the document names it beside the table."""
    study, section = {"d": (STUDY_D, _section_d), "f": (STUDY_F, _section_f), "e": (STUDY_E, None)}[study]
    text = _section_e() if section is None else flat(" ".join(section()))
    key = "gtpo/mean_entropy" if "mean_entropy" in named else "entropy"
    other = "entropy" if key == "gtpo/mean_entropy" else "gtpo/mean_entropy"
    summary = json.loads((study / "summary.json").read_text())["arms"][arm]["metrics"]["entropy"]["mean"]

    def mean_of(name: str) -> float:
        runs = [_last_steps(study / f"runs/{arm}/seed{s}/metrics.jsonl") for s in seeds]
        return statistics.mean(statistics.mean(r[t][name] for t in sorted(r)[-10:]) for r in runs)

    assert summary == pytest.approx(mean_of(key)) and summary != pytest.approx(mean_of(other), abs=1e-3)
    assert named in text


# ------------------------------------------------------------------------- the two-step task's pilot (issue 48)

PILOT = ROOT / "studies" / "smollm2-two-step-pilot"


def _pilot_heldout(folder: Path) -> dict:
    """A held-out evaluation of the pilot, recomputed from its samples: pass@1 (the share correct, as the estimator is
    for k = 1), right first steps, and right first steps with a wrong answer, in %; pass@8 / maj@8 from results.json."""
    import re

    from gtpo.tasks.two_step import first_step_correct

    samples = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]
    steps = []
    for sample in samples:
        a, op1, b, op2, c = re.fullmatch(r".*/(\d+)([+-])(\d+)([+-])(\d+)", sample["problem_id"]).groups()
        steps.append(first_step_correct(sample["text"], f"What is {a} {op1} {b} {op2} {c}?"))
    results = json.loads((folder / "results.json").read_text())
    n = len(samples)
    return {
        "samples": n,
        "pass@1": 100 * sum(s["correct"] for s in samples) / n,
        "pass@8": 100 * results["pass@k"]["8"],
        "maj@8": 100 * results["maj@k"]["8"],
        "first step": 100 * sum(steps) / n,
        "first step, wrong answer": 100
        * sum(st and not s["correct"] for st, s in zip(steps, samples, strict=True))
        / n,
        "results pass@1": 100 * results["pass@k"]["1"],
    }


def test_the_pilot_section_quotes_the_committed_pilot_runs():
    """docs/studies/two-step-pilot.md, "The two-step task and its pilot": the base model's and gtpo/seed390's held-out
    figures, gtpo/seed390's training figures and its protected-span counts, each recomputed from the committed files
    (samples.jsonl, results.json, metrics.jsonl, the completion record)."""
    doc = _study_doc()
    base = _pilot_heldout(PILOT / "base-model" / "eval" / "two-step")
    assert base["samples"] == 800 and base["pass@1"] == pytest.approx(base["results pass@1"])
    assert (
        f"held-out pass@1 {base['pass@1']:.1f} %** (pass@8 {base['pass@8']:.1f} %), {base['first step']:.1f} % of "
        f"samples with a right first step, {base['first step, wrong answer']:.1f} % a right first step and a wrong "
        "answer"
    ) in doc
    run = PILOT / "runs" / "gtpo" / "seed390"
    held = _pilot_heldout(run / "eval" / "two-step")
    assert held["pass@1"] == pytest.approx(held["results pass@1"])
    assert (
        f"Held-out pass@1 {held['pass@1']:.1f} % at step 60** (pass@8 {held['pass@8']:.1f} %, "
        f"maj@8 {held['maj@8']:.1f} %), {held['first step']:.1f} % of samples with a right first step"
    ) in doc
    step40 = _pilot_heldout(PILOT / "step40" / "gtpo" / "seed390" / "eval" / "two-step")
    assert f"held-out pass@1 was already {step40['pass@1']:.1f} % (pass@8 {step40['pass@8']:.1f} %)" in doc
    steps = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "rewards/accuracy_reward/mean" in row:
            steps[row["step"]] = row

    def mean(key: str, first: int, last: int) -> float:
        return statistics.fmean(steps[s][key] for s in range(first, last + 1))

    accuracy = [mean("rewards/accuracy_reward/mean", a, b) for a, b in ((1, 1), (1, 10), (31, 40), (51, 60))]
    assert (
        f"training accuracy {accuracy[0]:.2f} of 10 at step 1, {accuracy[1]:.2f} over steps 1–10, {accuracy[2]:.2f} "
        f"over 31–40, {accuracy[3]:.2f} over 51–60"
    ) in doc
    assert f"{steps[1]['entropy']:.2f} nats at step 1, {mean('entropy', 31, 40):.3f} over steps 31–40" in doc
    counts = load_script("two_step_spans").run_counts(run)
    assert (
        f"of its {counts['completions']} recorded completions, {counts['negative']} had a negative advantage; "
        f"{counts['negative, correct first step']} of those had a right first step, and in all "
        f"{counts['negative, span holds the correct first step']} the forward conflict span held the whole step "
        f"({counts['share of negatives, %']:.1f} % of the negatives)"
    ) in doc
    assert counts["negative, correct first step"] == counts["negative, span holds the correct first step"]
    grpo40 = _pilot_heldout(PILOT / "step40" / "grpo" / "seed390" / "eval" / "two-step")
    assert f"**held-out pass@1 {grpo40['pass@1']:.1f} %** (pass@8 {grpo40['pass@8']:.1f} %)" in doc
    # the studies' table (README and index): both arms at the same step, beside the base model
    for row in _rows("pilot"):
        assert (
            f"| held-out pass@1 at step 40: GTPO {step40['pass@1']:.1f} %, GRPO {grpo40['pass@1']:.1f} % "
            f"(the base model {base['pass@1']:.1f} %) |"
        ) in row


# Study G (issue 48, item 5): GTPO against GRPO on the two-step task, studies/smollm2-two-step-g/PREREGISTRATION.md.


def _g_flat() -> str:
    return flat(" ".join(_section_g()))


@functools.cache
def _study_g() -> dict:
    """`analyze_preregistered.py g`'s result (it reads 40 completion records and 40 sample files: computed once)."""
    return _analysis().study_g(STUDY_G)


def _g_run(arm: str, seed: int) -> Path:
    return STUDY_G / "runs" / arm / f"seed{seed}"


def _p3(p: float) -> str:
    """A p-value as the section writes it (3 decimals)."""
    return f"{p:.3f}"


def test_study_g_is_complete_with_twenty_evaluated_pairs_each_launched_once():
    """40 of 40 runs, 20 pairs, one code commit; each run's committed launch log (train-log.txt: train.log, which
    every launch appends to, its paths made relative) holds one command line and no resume, and its metrics.jsonl
    steps 1-40, each logged once: the document's "one launch each" is the files'."""
    assert SUMMARY_G["finished_runs"] == SUMMARY_G["total_runs"] == 40
    for arm in G_ARMS:
        assert SUMMARY_G["arms"][arm]["aggregated_seeds"] == SEEDS_G
    assert {pair["diff"]["n"] for pair in SUMMARY_G["pairs"]} == {20}
    assert (STUDY_G / "code-commit").read_text().strip().startswith("ae1f40e")
    for arm in G_ARMS:
        for seed in SEEDS_G:
            log = (_g_run(arm, seed) / "train-log.txt").read_text()
            assert sum(line.startswith("$ ") for line in log.splitlines()) == 1, (arm, seed)
            assert "--resume_from_checkpoint" not in log, (arm, seed)
            steps = [row["step"] for row in _steps(_g_run(arm, seed) / "metrics.jsonl")]
            assert steps == list(range(1, 41)), (arm, seed)


@pytest.mark.slow
def test_study_g_primary_outcome_is_the_registered_computation_and_documented():
    """By hand, independent of the analysis script: d_S = 100 x (gtpo - grpo) pass@1 from the 40
    eval/two-step/results.json files, mean +- 2.093 s / sqrt(20) (t_{0.975, 19}, the registration's); the script, the
    summary and the study page state it with the registered two-sided reading, the studies' table (README and index)
    with its SD."""
    diffs = [_pass1("gtpo", s, STUDY_G, "two-step") - _pass1("grpo", s, STUDY_G, "two-step") for s in SEEDS_G]
    sd = statistics.stdev(diffs)
    _assert_twenty_pair_primary(diffs, _study_g(), SUMMARY_G, SEEDS_G)
    section = _g_flat()
    figure = _assert_primary_documented(section, "GTPO − GRPO", diffs)
    assert f"GTPO was lower at {sum(d < 0 for d in diffs)} of 20 seeds" in section
    detectable = _analysis().detectable_effect(sd, 20)
    for row in _rows("G"):
        assert f"| 20 (seeds 400–419) | yes | GTPO − GRPO held-out pass@1 {figure} | no difference detected;" in row
        assert f"at the SD of the differences, {sd:.2f} points, 20 pairs detect only {detectable:.1f} points" in row


def _arms_and_paired(values: dict[str, dict[int, float]], unit: str) -> str:
    """`gtpo M unit [l, h], grpo M [l, h], paired ±D [l, h]` over seeds 400-419, by hand with t_{0.975, 19}."""
    gtpo, grpo = ([values[arm][s] for s in SEEDS_G] for arm in G_ARMS)
    differences = [a - b for a, b in zip(gtpo, grpo, strict=True)]
    paired = _t_interval(differences, T_975_19)
    sign = "+" if statistics.mean(differences) > 0 else ""  # the documents' '+' on a positive difference
    return (
        f"gtpo {_t_interval(gtpo, T_975_19).replace(' [', f'{unit} [', 1)}, grpo {_t_interval(grpo, T_975_19)}, "
        f"paired {sign}{paired}"
    )


@pytest.mark.slow
def test_study_g_registered_secondaries_are_the_committed_runs():
    """The registered secondaries the section states, each recomputed here from the committed files and checked
    against the script's: the share of negatives whose forward span holds a right first step (per run from its
    completion record), E's stall rule and C's runaway rule by hand from metrics.jsonl (no step 1-15 with format mean
    >= 1.25; clipped ratio >= 0.5 at 6 or more of steps 31-40) with McNemar's p both ways, held-out length and cut
    share, and the held-out share of right first steps (per run from samples.jsonl)."""
    result = _study_g()
    section = _g_flat()
    spans = load_script("two_step_spans")
    shares = {arm: {s: spans.run_counts(_g_run(arm, s))["share of negatives, %"] for s in SEEDS_G} for arm in G_ARMS}
    script = result["secondary_protected_first_step"]
    assert script["seeds"] == SEEDS_G
    assert script["gtpo - grpo"]["mean"] == pytest.approx(statistics.mean(
        shares["gtpo"][s] - shares["grpo"][s] for s in SEEDS_G))  # fmt: skip
    assert f"right first step inside its forward span: {_arms_and_paired(shares, ' % of negatives')}" in section
    runs = {(a, s): _last_steps(_g_run(a, s) / "metrics.jsonl") for a in G_ARMS for s in SEEDS_G}
    stalled = {a: [s for s in SEEDS_G if not any(runs[(a, s)][t]["rewards/format_reward/mean"] >= 1.25
                                                 for t in range(1, 16))] for a in G_ARMS}  # fmt: skip
    assert stalled == result["secondary_stall"]["stalled"]
    stall = result["secondary_stall"]
    assert (
        f"{len(stalled['gtpo'])} of 20 gtpo runs and {len(stalled['grpo'])} of 20 grpo runs stalled (McNemar's exact "
        f"p, one-sided, {_p3(stall['p_one_sided_gtpo_stalls_more'])} for GTPO stalling more, "
        f"{_p3(stall['p_one_sided_grpo_stalls_more'])} for GRPO)"
    ) in section
    away = {a: [s for s in SEEDS_G if sum(runs[(a, s)][t]["completions/clipped_ratio"] >= 0.5
                                          for t in range(31, 41)) >= 6] for a in G_ARMS}  # fmt: skip
    runaway = result["secondary_runaway"]
    assert away == runaway["ran_away"] and runaway["pairs"] == 20
    assert (
        f"{len(away['gtpo'])} of 20 gtpo runs and {len(away['grpo'])} of 20 grpo runs ran away (McNemar's exact p, "
        f"one-sided, {_p3(runaway['p_one_sided_gtpo_runs_away_more'])} for GTPO running away more, "
        f"{_p3(runaway['p_one_sided_grpo_runs_away_more'])} for GRPO)"
    ) in section
    for label, lead, unit in (("held-out mean length (tokens)", "mean length", " tokens"),
                              ("held-out cut at the limit (%)", "cut at the 96-token limit", " %")):  # fmt: skip
        figures = result["secondary_heldout"][label]
        gtpo, grpo = _interval(figures["gtpo"], 2), _interval(figures["grpo"], 2)
        paired = _interval(figures["gtpo - grpo"], 2, sign=True)
        assert f"{lead}: gtpo {gtpo.replace(' [', f'{unit} [', 1)}, grpo {grpo}, paired {paired}" in section, label
    first = {arm: {s: _pilot_heldout(_g_run(arm, s) / "eval" / "two-step")["first step"] for s in SEEDS_G}
             for arm in G_ARMS}  # fmt: skip
    script = result["secondary_heldout_first_step"]
    assert script["gtpo"]["mean"] == pytest.approx(statistics.mean(first["gtpo"].values()))
    assert f"held-out samples whose first step is right: {_arms_and_paired(first, ' %')}" in section


def test_study_g_post_hoc_pattern_is_the_committed_results():
    """The pattern the reading states as seen after the analysis: the seeds where GTPO's held-out
    pass@1 stayed below 11 % (all above GRPO's lowest), and how many of the other seeds GTPO was higher at, from the
    40 results.json files."""
    low = [s for s in SEEDS_G if _pass1("gtpo", s, STUDY_G, "two-step") < 11]
    grpo_lowest = min(_pass1("grpo", s, STUDY_G, "two-step") for s in SEEDS_G)
    higher = sum(_pass1("gtpo", s, STUDY_G, "two-step") > _pass1("grpo", s, STUDY_G, "two-step")
                 for s in SEEDS_G if s not in low)  # fmt: skip
    section = _g_flat()
    assert f"At {len(low)} of 20 seeds ({', '.join(map(str, low))}) GTPO's held-out pass@1 was below 11 %" in section
    rest = f"{higher} of the other {20 - len(low)}"
    assert f"(GRPO's lowest at any seed: {grpo_lowest:.1f} %), while at {rest}" in section


def test_the_studies_table_is_one_table_and_its_figures_are_the_pages():
    """The README's studies table is the index's (links one folder apart), and every number the README's study section
    (table and reading) states is on the study document's pages: the README quotes, it computes nothing of its own."""
    import re

    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## What the studies found") : readme.index("## Documentation")]
    rows = [line for line in section.splitlines() if re.match(r"\| \[\w+\]\(", line)]
    index_rows = [line for line in INDEX.read_text().splitlines() if re.match(r"\| \[\w+\]\(", line)]
    assert [row.replace("](docs/studies/", "](studies/") for row in rows] == index_rows
    assert [re.match(r"\| \[(\w+)\]", row)[1] for row in rows] == ["A", "B", "C", "D", "E", "F", "pilot", "G"]
    pages = flat(all_text())
    for link in re.findall(r"\]\((docs/studies/[\w-]+\.md)\)", section):
        assert (ROOT / link).is_file(), link
    prose = re.sub(r"\]\([^)]*\)", "]", section)  # the numbers, not the links' file names
    for number in re.findall(r"[−+]?\d+(?:\.\d+)?", prose):
        assert number.lstrip("+") in pages, number


def test_the_study_pages_links_resolve():
    """The text moved one folder down: every relative link of the index and of each page still names a file."""
    import re

    from study_pages import ORDER, PAGES

    for path in (INDEX, *(PAGES / f"{name}.md" for name in ORDER)):
        for link in re.findall(r"\]\(([^)#\s:]+)(?:#[^)]*)?\)", path.read_text()):
            assert (path.parent / link).exists(), (path.name, link)
    assert sorted(p.stem for p in PAGES.glob("*.md")) == sorted(ORDER)
