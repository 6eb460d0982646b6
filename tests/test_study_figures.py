"""The studies' answers, as README.md and docs/study-gtpo-vs-grpo.md quote them, are the committed summaries' (issue
18): every per-arm interval and paired difference the two documents state is recomputed here from
studies/<name>/summary.json, and study A's summary is checked against the committed held-out results it
aggregates, study B's run counts against its committed metrics. An edit of the numbers, or a rerun that changes
the files, fails here instead of going stale."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

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
    return re.sub(r"\s+", " ", path.read_text())


def _section(start: str, end: str) -> list[str]:
    """The lines of docs/study-gtpo-vs-grpo.md from heading ``start`` up to heading ``end``."""
    doc = (ROOT / "docs" / "study-gtpo-vs-grpo.md").read_text()
    return doc[doc.index(start) : doc.index(end)].splitlines()


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
    readme = _flat(ROOT / "README.md")
    arms = {arm: SUMMARY["arms"][arm]["metrics"]["pass@1 %"] for arm in ("gtpo", "grpo")}
    gtpo, grpo = (
        f"{_num(d['mean'], 1)} % [{_num(d['low'], 1)}, {_num(d['high'], 1)}]" for d in (arms["gtpo"], arms["grpo"])
    )
    assert f"pass@1 GTPO {gtpo}, GRPO {grpo}" in readme
    diff = PAIRS["pass@1 %"]
    assert (
        f"paired difference {_num(diff['mean'], 1, True)} points [{_num(diff['low'], 1)}, {_num(diff['high'], 1)}]"
        in readme
    )
    assert f"maj@8 {_interval(PAIRS['maj@8 %'], 1, sign=True)}" in readme
    entropy = PAIRS["entropy"]
    assert f"({_num(entropy['mean'], 2)} nats [{_num(entropy['low'], 2)}, {_num(entropy['high'], 2)}])" in readme
    assert "No detectable difference" in readme


@pytest.mark.parametrize("metric", sorted(set(PAIRS) - {"maj@1 %"}))
def test_study_document_states_each_paired_difference(metric):
    doc = (ROOT / "docs" / "study-gtpo-vs-grpo.md").read_text()
    row = next((line for line in doc.splitlines() if line.startswith(f"| {metric.split(' ')[0]} ")), None)
    assert row is not None, f"docs/study-gtpo-vs-grpo.md has no paired-difference row for {metric}"
    assert _interval(PAIRS[metric], 2, sign=True) in row


@pytest.mark.parametrize("arm", ["gtpo", "grpo"])
def test_study_document_states_each_arm_mean(arm):
    doc = (ROOT / "docs" / "study-gtpo-vs-grpo.md").read_text()
    row = next(line for line in doc.splitlines() if line.startswith(f"| {arm} | 13."))
    _assert_arm_row(row, SUMMARY["arms"][arm]["metrics"], HELD_OUT_ROW)


# Study B (issue 18): the document's per-arm and paired tables, and the README's one figure, are its summary's.
STUDY_B = ROOT / "studies" / "smollm2-synthetic-lr1e-3"
SUMMARY_B = json.loads((STUDY_B / "summary.json").read_text())


def _section_b() -> list[str]:
    return _section("## Study B", "## The earlier partial study")


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
    readme = _flat(ROOT / "README.md")
    assert f"reward GTPO − GRPO {_interval(reward, 2, sign=True)} of 20" in readme
    assert all(p["verdict"] == "no detectable difference" for p in SUMMARY_B["pairs"])  # what the README says


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
    doc = _flat(ROOT / "docs" / "study-gtpo-vs-grpo.md")

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
    """The third arm's per-arm row, its 22 paired rows with their readings, and the README's pass@1 figure are the
    summary's; its seeds 1 and 4 are gtpo's seeds 1 and 4 (the auto filter was on there), which the document
    states from the held-out samples: identical files."""
    assert SUMMARY["arms"]["gtpo-filter"]["aggregated_seeds"] == [0, 1, 2, 3, 4]
    rows = _section("## Study A", "## Study B")
    metrics = SUMMARY["arms"]["gtpo-filter"]["metrics"]
    _assert_arm_row(next(line for line in rows if line.startswith("| gtpo-filter | ")), metrics, HELD_OUT_ROW)
    pairs = [p for p in SUMMARY["pairs"] if "gtpo-filter" in (p["a"], p["b"]) and p["metric"] != "maj@1 %"]
    assert len(pairs) == 22
    _assert_pair_rows(rows, pairs)
    assert f"pass@1 {_num(metrics['pass@1 %']['mean'], 1)} % [{_num(metrics['pass@1 %']['low'], 1)}, " in _flat(
        ROOT / "README.md"
    )
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
    import importlib.util

    spec = importlib.util.spec_from_file_location("analyze_preregistered", ROOT / "scripts/analyze_preregistered.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_steps_without_reward_signal_the_document_states():
    """The count per run of steps whose group's rewards were all equal (frac_reward_zero_std = 1), as ranges."""

    def zero_std(study: Path, arms: tuple[str, ...]) -> tuple[int, int]:
        counts = [sum(r["frac_reward_zero_std"] == 1 for r in _steps(m)) for arm in arms
                  for m in study.glob(f"runs/{arm}/seed*/metrics.jsonl")]  # fmt: skip
        return min(counts), max(counts)

    doc = _flat(ROOT / "docs" / "study-gtpo-vs-grpo.md")
    low, high = zero_std(STUDY, ("gtpo", "grpo"))
    assert f"in {low}–{high} of the 40 steps of every `gtpo` and `grpo` run" in doc
    low, high = zero_std(STUDY, ("gtpo-filter",))
    assert f"({low}–{high} in `gtpo-filter`'s)" in doc
    low, high = zero_std(STUDY_B, ("gtpo", "grpo", "entropy-only"))
    assert f"in {low}–{high} of the 40 steps of each run" in doc


def test_the_two_different_four_of_six_subsets_of_study_b():
    """'4 of 6' counts two subsets: the runs that ended at the length limit and the runs whose raw entropy exceeded
    ln 2 after step 2; the document names both, and they differ."""
    import math

    high_entropy = sorted(
        str(m.parent.relative_to(STUDY_B / "runs"))
        for m in STUDY_B.glob("runs/*/seed*/metrics.jsonl")
        if any(r["step"] > 2 and r["entropy"] > math.log(2) for r in _steps(m))
    )
    assert high_entropy == ["entropy-only/seed0", "entropy-only/seed1", "grpo/seed0", "grpo/seed1"]
    doc = _flat(ROOT / "docs" / "study-gtpo-vs-grpo.md")
    assert "but not the same four: grpo seeds 0 and 1 and entropy-only seeds 0 and 1" in doc
    assert "(grpo seeds 1, 2, entropy-only seeds 0, 2)" in doc and "(grpo seeds 0, 1, entropy-only seeds 0, 1)" in doc


def _pass1(arm: str, seed: int) -> float:
    return 100 * json.loads((STUDY / f"runs/{arm}/seed{seed}/eval/synthetic/results.json").read_text())["pass@k"]["1"]


def test_gtpo_filter_interval_over_the_seeds_where_the_arms_differ():
    """Seeds 1 and 4 run the same computation in gtpo and gtpo-filter (difference 0); over seeds 0, 2, 3 alone the
    pass@1 difference's interval is the one the document states."""
    from gtpo.compare.stats import mean_interval

    assert [_pass1("gtpo", s) - _pass1("gtpo-filter", s) for s in (1, 4)] == [0.0, 0.0]
    interval = mean_interval([_pass1("gtpo", s) - _pass1("gtpo-filter", s) for s in (0, 2, 3)])
    assert _interval(interval.as_dict(), 2, sign=True) in _flat(ROOT / "docs" / "study-gtpo-vs-grpo.md")


def test_the_power_lines_are_the_scripts():
    """Study A's SD of the paired pass@1 differences and its 95 % interval (chi-square quantiles with 4 degrees of
    freedom, 0.4844 and 11.143, from any table), and the detectable effects the document quotes for A, B, C, D."""
    import math

    analysis = _analysis()
    sd = statistics.stdev([_pass1("gtpo", s) - _pass1("grpo", s) for s in range(5)])
    doc = _flat(ROOT / "docs" / "study-gtpo-vs-grpo.md")
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
