"""docs/studies/lockin.md's figures, recomputed from the committed runs by the scripts the page names.

The tables of `studies/tools/lockin_tokens.py` (G's and E's completion records), `gtpo/push_against_group`'s ranges
and the no-progress warning's table (`studies/tools/lockin_warning_table.py`, every committed run's metrics.jsonl), and
the check that G's gtpo/seed417 repeated on another CPU (`studies/smollm2-two-step-g-repro` against G's run). Slow:
they read every record (about 30 s).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "studies" / "tools"))
PAGE = (ROOT / "docs" / "studies" / "lockin.md").read_text()
G, E = ROOT / "studies" / "smollm2-two-step-g", ROOT / "studies" / "smollm2-synthetic-lr1e-3-e"
LOW = ("seed400", "seed404", "seed405", "seed407", "seed410", "seed417", "seed418")

pytestmark = pytest.mark.slow


def _row(*cells) -> str:
    return "| " + " | ".join(cells) + " |"


def _signed(x: float) -> str:
    return f"{x:+.2f}"


def _mechanism(task: str, study: Path) -> dict:
    import lockin_tokens

    return {label: group["windows"] for label, group in _tables(lockin_tokens, task, study).items()}


def _tables(module, task, study):
    import statistics

    out = {}
    for label, runs in module._run_groups(task, study).items():
        per_run = {p.name: module.windows(module.run_terms(p)) for p in runs}
        first = next(iter(per_run.values()))
        out[label] = {
            "runs": len(runs),
            "windows": {w: {k: statistics.fmean(r[w][k] for r in per_run.values()) for k in first[w]} for w in first},
        }
    return out


def test_the_opening_table_is_g_s_records():
    tables = _mechanism("two-step", G)
    names = {"gtpo, low seeds": "gtpo, the 7 low seeds", "gtpo, other seeds": "gtpo, the 13 others"}
    for label, name in names.items():
        for window, d in tables[label].items():
            if name.endswith("others") and window == "31-40":
                continue
            row = _row(name, window, f"{d['single-equation share']:.2f}", f"{d['opening: tokens']:.0f}",
                       f"{d['opening in common prefix']:.0f}", _signed(d["opening: push"]),
                       _signed(d["opening: plain"]), _signed(d["opening: entropy part"]),
                       f"{d['opening flipped']:.1f}")  # fmt: skip
            assert row in PAGE, row
    for window in ("1-10", "11-20"):
        d = tables["grpo, low seeds"][window]
        assert _row("grpo, the 7 low seeds", window, f"{d['single-equation share']:.2f}", f"{d['opening: tokens']:.0f}",
                    f"{d['opening in common prefix']:.0f}", f"({_signed(d['opening: push'])})",
                    _signed(d["opening: plain"]), "0", f"({d['opening flipped']:.1f})") in PAGE  # fmt: skip


def test_the_span_table_is_g_s_and_e_s_records():
    rows = {
        "G gtpo, the 7 low seeds": ("two-step", "gtpo, low seeds"),
        "E gtpo, the 10 stalled": ("one-step", "gtpo, stalled"),
        "E gtpo, the 22 others": ("one-step", "gtpo, other"),
    }
    tables = {"two-step": _mechanism("two-step", G), "one-step": _mechanism("one-step", E)}
    for name, (task, label) in rows.items():
        d = tables[task][label]["1-10"]
        row = _row(name, "1-10", f"{d['common prefix: tokens']:.0f}", f"{d['position only: tokens']:.0f}",
                   _signed(d["common prefix: push"]), _signed(d["common prefix: plain"]), _signed(d["backward: push"]),
                   _signed(d["backward: plain"]))  # fmt: skip
        assert row in PAGE, row
    # "93–100 % of forward-span tokens lie in a common prefix", over every row of both studies (steps 1-10; 100: the one
    # stalled gtpo-nocc run of E).
    shares = [
        w["1-10"]["common prefix: tokens"] / (w["1-10"]["common prefix: tokens"] + w["1-10"]["position only: tokens"])
        for table in tables.values()
        for w in table.values()
        if w["1-10"]["common prefix: tokens"]
    ]
    assert round(100 * min(shares)) == 93 and round(100 * max(shares)) == 100 and "93–100 %" in PAGE


def test_the_warning_table_and_the_push_ranges_are_the_committed_runs():
    import lockin_warning_table as table

    judged = {}
    for study in sorted((ROOT / "studies").iterdir()):
        runs = sorted(p for p in study.glob("runs/*/seed*") if (p / "metrics.jsonl").is_file())
        if runs and not table.folder_withholds_estimates(study):
            arms = table.study_table(runs)
            judged[study.name] = [sum(a["runs"] - len(a["too short"]) for a in arms.values()),
                                  *(sum(a[k] if k == "failed" else len(a[k]) for a in arms.values())
                                    for k in ("failed", "hits", "misses", "false alarms", "signal loss"))]  # fmt: skip
    page_rows = {
        "B (lr 10⁻³, 3 arms × 3)": ["smollm2-synthetic-lr1e-3"],
        "C (lr 10⁻³, 2 × 12)": ["smollm2-synthetic-lr1e-3-c"],
        "A (lr 2·10⁻⁴, 3 × 5)": ["smollm2-synthetic-lr2e-4"],
        "D (2 × 12)": ["smollm2-synthetic-lr2e-4-d"],
        "D re-run (2 × 2)": ["smollm2-synthetic-lr2e-4-d-rerun"],
        "F (2 × 20)": ["smollm2-synthetic-lr2e-4-f"],
        "F's γ screen (2 × 2)": ["smollm2-synthetic-lr2e-4-guard-gamma"],
        "the pilot's gtpo run, G's re-run": ["smollm2-two-step-pilot", "smollm2-two-step-g-repro"],
    }
    screens = {
        "the common-prefix screen and its control (two-step, 13 + 1)": [
            "smollm2-two-step-h-screen", "smollm2-two-step-h-screen-control"],
        "the parts screen and its follow-up (two-step, 21 + 6)": [
            "smollm2-two-step-h-parts", "smollm2-two-step-h-parts-others"],
    }  # fmt: skip
    for name, studies in {**page_rows, **screens}.items():
        counts = [sum(judged[s][k] for s in studies) for k in range(6)]
        assert _row(name, *map(str, counts)) in PAGE, (name, counts)
    later = [judged[s] for studies in screens.values() for s in studies]
    hits, failed, alarms = sum(r[2] for r in later), sum(r[1] for r in later), sum(r[4] for r in later)
    flat = " ".join(PAGE.split())
    assert f"caught {hits} of {failed} failed runs (not no-correction/seed404) and raised {alarms} false alarms" in flat
    assert f"among {sum(r[0] - r[1] for r in later)} that did not fail. Before them, outside G" in flat
    g = judged["smollm2-two-step-g"]
    assert g[:5] == [40, 7, 7, 0, 3]  # the rule's own runs (tests/trainer/test_progress_monitor.py)
    others = [judged[s] for studies in page_rows.values() for s in studies]  # the studies before the screens
    hits, failed = sum(r[2] for r in others), sum(r[1] for r in others)
    alarms, fine = sum(r[4] for r in others), sum(r[0] - r[1] for r in others)
    assert f"caught {hits} of {failed} failed runs and raised {alarms} false alarms among {fine} runs" in PAGE
    signal, total = sum(r[5] for r in others), sum(r[0] for r in others)
    screened = f"{sum(r[5] for r in later)} of the screens' {sum(r[0] for r in later)}"
    assert (
        f"turned on at {signal} of the {total} judged runs outside G before the screens (and at {g[5]} of G's "
        f"{g[0]}, {screened}):" in flat
    )
    push = {run.name: table.push_against_group(run) for run in sorted((G / "runs" / "gtpo").glob("seed*"))}

    def span(names, lo, hi):
        means = [sum(v[s] for s in v if lo <= s <= hi) / len([s for s in v if lo <= s <= hi]) for n, v in push.items()
                 if n in names]  # fmt: skip
        return f"{min(means):.2f}–{max(means):.2f}"

    others_names = set(push) - set(LOW)
    assert f"{span(LOW, 1, 5)} at the seven low seeds, {span(others_names, 1, 5)} at the thirteen others" in PAGE
    assert f"over steps 6–10,\n{span(LOW, 6, 10)} and {span(others_names, 6, 10)}" in PAGE


@pytest.mark.parametrize("again", ["smollm2-two-step-g-repro", "smollm2-two-step-h-screen-control"])
def test_g_s_run_repeated_on_another_cpu_and_at_the_screen_s_code(again):
    def steps(run):
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
        return {r["step"]: r for r in rows if "loss" in r}

    ours = G / "runs" / "gtpo" / "seed417"
    again = ROOT / "studies" / again / "runs" / "gtpo" / "seed417"
    a, b = steps(ours), steps(again)
    assert sorted(a) == sorted(b) == list(range(1, 41))
    for key in ("reward", "completions/mean_length"):
        assert [a[s][key] for s in a] == [b[s][key] for s in a]
    assert max(abs(a[s]["loss"] - b[s]["loss"]) for s in a) < 2.5e-7
    results = [json.loads((run / "eval" / "two-step" / "results.json").read_text()) for run in (ours, again)]
    assert results[0]["pass@k"] == results[1]["pass@k"] and results[0]["maj@k"] == results[1]["maj@k"]
    assert json.loads((again / "run.json").read_text())["machine"]["cpu"] == "AMD EPYC"
    assert "loss within 2.4·10⁻⁷" in PAGE and "commit (1e048b5," in PAGE
    assert (ROOT / "studies" / "smollm2-two-step-h-screen-control" / "code-commit").read_text().startswith("1e048b5")


def test_the_fresh_make_train_replayed():
    from gtpo.trainer.callbacks import ProgressMonitor

    run = ROOT / "docs" / "measurements" / "make-train-20261128-epyc"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = {r["step"]: r for r in rows if "loss" in r}
    monitor = ProgressMonitor()
    for step in sorted(rows):
        monitor.update(rows[step], step)
    assert monitor.fired_step == {"no_progress": None, "signal_loss": 39}
    assert sum(rows[s]["frac_reward_zero_std"] for s in range(31, 41)) == 9
    assert "no no-progress warning; the signal-loss line at step 39,\nwith 9 of its last 10 groups all-equal" in PAGE


def test_the_screens_table_is_the_analysis_of_its_committed_runs():
    """The screen's table (docs/studies/lockin.md, "What the screen found") recomputed from the committed runs: the
    seeds below 11 % held-out pass@1 per arm, the seeds locked in (single-equation share >= 0.8 over steps 21-30 of
    the completion record: the registered H rule, `analyze_preregistered.lockin_share`), and the paired intervals of
    `analyze_preregistered.h_screen`."""
    import analyze_preregistered as analysis

    screen = ROOT / "studies" / "smollm2-two-step-h-screen"
    result = analysis.h_screen(screen, G)
    assert result["seeds"] == list(analysis.H_SCREEN_SEEDS) and result["missing"] == []
    roots = {"common-prefix": screen, "gtpo": G, "grpo": G}
    page = " ".join(PAGE.split())
    for arm, root in roots.items():
        below = sorted(result[f"{arm} below 11"])
        locked = sorted(
            s for s in result["seeds"] if (analysis.lockin_share(root / "runs" / arm / f"seed{s}") or 0) >= 0.8
        )
        if below:
            assert f"{len(below)} of 13: {', '.join(map(str, below))}" in page, arm
        if locked:
            assert f"| {len(locked)}: {', '.join(map(str, locked))} |" in page, arm
        else:
            assert arm == "grpo" and "| grpo (G) | none | none |" in page
    for key in ("common-prefix - grpo", "gtpo - grpo", "common-prefix - gtpo"):
        r = result[key]
        assert f"{r['mean']:.2f} [{r['low']:.2f}, {r['high']:.2f}]".replace("-", "−") in page, key
    assert f"SD {result['common-prefix - grpo']['sd']:.2f}" in page


def test_the_filter_table_is_g_s_records():
    """The filter's table ("What the parts screen found"): per window, the filtered completions of the recorded groups,
    their negatives and single-equation negatives, and the push on the rest of single-equation completions outside both
    spans with the filter's part of it (lockin_tokens' "after the opening" set), the same groups with δ = 1 beside."""
    tables = _mechanism("two-step", G)
    names = {"gtpo, low seeds": "gtpo, the 7 low seeds", "gtpo, other seeds": "gtpo, the 13 others"}
    for label, name in names.items():
        for window in ("1-10", "11-20", "21-30"):
            d = tables[label][window]
            push, part = d["after the opening: push"], d["after the opening: filter part"]
            row = _row(name, window, f"{d['filtered']:.1f}", f"{d['filtered negatives']:.1f}",
                       f"{d['filtered single-equation negatives']:.1f}", f"{d['single-equation negatives']:.1f}",
                       _signed(push), _signed(part), _signed(push - part))  # fmt: skip
            assert row in PAGE, row


def test_the_parts_screens_table_and_choice_are_the_analysis_of_its_committed_runs():
    """The parts screen's table ("What it found") recomputed by `analyze_preregistered.h_parts` from the committed runs:
    per arm and seed held-out pass@1 with the lock-in share, the seeds below 11 % and locked in, each arm's interval
    against G's gtpo; and the choice the README's rule makes from them (`h_parts_choice`), as the page states it."""
    import analyze_preregistered as analysis

    names = {"no-filter": "no-filter (Eq. 6's filter)", "no-correction": "no-correction (Eq. 5)",
             "no-entropy-term": "no-entropy-term (γ)", "common-prefix": "common-prefix (the first screen)",
             "gtpo": "gtpo (G)", "grpo": "grpo (G)"}  # fmt: skip
    studies = ROOT / "studies"
    result = analysis.h_parts(studies / "smollm2-two-step-h-parts", studies / "smollm2-two-step-h-screen", G)

    def listed(seeds):
        return f"{len(seeds)}: {', '.join(map(str, seeds))}" if seeds else "none"

    for arm, name in names.items():
        a = result["arms"][arm]
        assert a["missing"] == [], arm
        cells = [f"{a['per_seed'][s]['pass@1']:.1f} ({a['per_seed'][s]['lockin_share'] or 0:.2f})"
                 for s in analysis.H_LOW_SEEDS]  # fmt: skip
        diff = a.get("- gtpo", {})
        interval = f"{diff['mean']:+.2f} [{diff['low']:.2f}, {diff['high']:.2f}]".replace("-", "−") if diff else ""
        row = _row(name, *cells, listed(a["below 11"]), listed(a["locked_in"]), interval)
        assert row.replace("|  |", "| |") in PAGE or row in PAGE, row
    choice = result["choice"]
    assert choice["chosen"] == "no-filter" and choice["qualifying"] == ["no-filter", "no-correction"]
    means = choice["mean_pass@1"]
    assert f"(mean over the seven {means['no-filter']:.1f} points" in " ".join(PAGE.split())
    assert f"the higher mean ({means['no-filter']:.1f} against {means['no-correction']:.1f})" in " ".join(PAGE.split())
    assert "**no-filter: GTPO with `entropy_filter: never`**" in PAGE
    from gtpo.trainer.callbacks import ProgressMonitor
    from gtpo.trainer.config import GTPOConfig

    rescued = len(choice["rescued"]["no-filter"])
    help_text = GTPOConfig.__dataclass_fields__["entropy_filter"].metadata["help"]
    assert f"'never' took {rescued} of the 7 seeds" in help_text
    monitor = ProgressMonitor(accuracy=0.2)
    assert f"entropy_filter never (Eq. 6 off), which took {rescued} of the 7 out of it" in monitor.message(
        "no_progress", 17
    )


def test_the_follow_ups_table_and_h_s_pairs_are_the_analysis_of_its_committed_runs():
    """The follow-up's table ("The follow-up"): no-filter's held-out pass@1 (lock-in share) at G's six other screen
    seeds beside G's gtpo and grpo, its interval against G's gtpo over the six (`mean_interval`), and the 13-seed
    figures `analyze_preregistered.h_screen` prints (no-filter - grpo with its SD, no-filter - gtpo) with the n
    `h_pairs` gives H from that SD, as the page states them."""
    import analyze_preregistered as analysis

    studies = ROOT / "studies"
    others = studies / "smollm2-two-step-h-parts-others"
    seeds = sorted(set(analysis.H_SCREEN_SEEDS) - set(analysis.H_LOW_SEEDS))  # the screens' six others
    arms = (
        ("no-filter", others, "no-filter"),
        ("gtpo (G)", G, "gtpo"),
        ("grpo (G)", G, "grpo"),
    )  # page row, folder, arm
    runs = {name: {s: root / "runs" / arm / f"seed{s}" for s in seeds} for name, root, arm in arms}
    scores = {name: {s: analysis.pass_at_1(run) for s, run in by_seed.items()} for name, by_seed in runs.items()}
    diff = analysis.mean_interval([scores["no-filter"][s] - scores["gtpo (G)"][s] for s in seeds]).as_dict()
    for name, by_seed in runs.items():
        shown = name != "grpo (G)"  # the page gives the lock-in share for no-filter and G's gtpo
        cells = [f"{scores[name][s]:.1f}" + (f" ({analysis.lockin_share(by_seed[s]) or 0:.2f})" if shown else "")
                 for s in seeds]  # fmt: skip
        assert not any(analysis._failed(scores[name][s]) for s in seeds), name
        interval = f"{diff['mean']:+.2f} [{diff['low']:.2f}, {diff['high']:.2f}]" if name == "no-filter" else ""
        row = _row(name, *cells, "none", interval.replace("-", "−"))
        assert row.replace("|  |", "| |") in PAGE, row
    screen = analysis.h_screen(studies / "smollm2-two-step-h-parts", G, "no-filter", (others,))
    page = " ".join(PAGE.split())
    for key in ("no-filter - grpo", "no-filter - gtpo"):
        r = screen[key]
        figures = f"{r['mean']:+.2f} [{r['low']:.2f}, {r['high']:.2f}]".replace("-", "−")
        assert f"{key.replace(' - ', ' − ')} {figures}" in page, key
    sd, n = screen["h_pairs"]["screen_sd"], screen["h_pairs"]["n"]
    assert f"SD {sd:.2f};" in page and f"**{n} pairs** (at SD {sd:.2f} they detect" in page
    assert f"they detect {screen['h_pairs']['detectable'][n]:.1f} points" in page
