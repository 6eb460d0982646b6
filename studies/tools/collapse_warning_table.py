#!/usr/bin/env python
"""The collapse early warning, replayed on every committed run: did it warn, when, and did the run fail?

For each committed run of studies A-F and the exploratory folders under studies/ (the synthetic task), it replays
the run's logged metrics (``metrics.jsonl``) through ``gtpo.trainer.callbacks.CollapseMonitor`` with the shipped
rule (or one changed by the flags) and sets the warning beside what the run did, by the study documents' rules
(docs/study-gtpo-vs-grpo.md):

- **ran away** (study C's registered rule): ``completions/clipped_ratio`` >= 0.5 at 6 or more of steps 31-40;
  judged on 40-step runs only (the rule's window). In time: a warning before step 31.
- **stalled** (study E's registered rule): no group in steps 1-15 had a full-format completion (format mean
  >= 1.25); judged on runs of at least 15 steps. In time: a warning by step 15.
- **lost the format** (F's gtpo-guard/seed313: "every completion partial-format from step 16 to 40"): a 40-step run
  that did not stall but had no full-format group in steps 31-40; from the first step of that final stretch. In
  time: a warning before step 31.
- **one answer** (the collapse onto one wrong answer): from the completion record (``completions/``), a step where
  every completion gave the same answer (``gtpo.grading.is_equivalent`` of the extracted answers) and it was wrong;
  the run collapsed when some 10 consecutive recorded steps hold 5 or more such steps; judged on 40-step runs with
  a record. In time: a warning by the fifth such step of that window.

A failed run is a *hit* when the rule warned in time for one of its failures, *late* when it warned only after,
*missed* when it never warned; a run that did not fail (by the rules it could be judged by) is a *false alarm*
when the rule warned and *quiet* otherwise. Runs shorter than 15 steps (study C's 10-step post-hoc ablations) are
listed but not judged. The offline default run's committed twins (``docs/measurements/make-train-*`` and study A's
gtpo/seed0) are replayed beside the table.

    .venv/bin/python studies/tools/collapse_warning_table.py            # the table of docs/inspect.md
    .venv/bin/python studies/tools/collapse_warning_table.py --runs     # and one line per run
    .venv/bin/python studies/tools/collapse_warning_table.py --signals length stall filtered format entropy

A study folder that is missing ends in one line naming it (exit status 2).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from gtpo.trainer.callbacks import SIGNALS, CollapseMonitor, CollapseRule  # noqa: E402


def _load_analysis():
    """studies/tools/analyze_preregistered.py: the studies' registered rules (runaway, stall, format lost)."""
    path = ROOT / "studies" / "tools" / "analyze_preregistered.py"
    spec = importlib.util.spec_from_file_location("analyze_preregistered", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ANALYSIS = _load_analysis()

# The committed runs, study by study (label, folder of arms, each arm a folder of seed<S> runs). The two-step pilot
# (another task) is left out.
STUDIES = (
    ("A", "studies/smollm2-synthetic-lr2e-4/runs"),
    ("B", "studies/smollm2-synthetic-lr1e-3/runs"),
    ("C", "studies/smollm2-synthetic-lr1e-3-c/runs"),
    ("C post hoc", "studies/smollm2-synthetic-lr1e-3-c/post-hoc"),
    ("D", "studies/smollm2-synthetic-lr2e-4-d/runs"),
    ("D re-run", "studies/smollm2-synthetic-lr2e-4-d-rerun/runs"),
    ("E", "studies/smollm2-synthetic-lr1e-3-e/runs"),
    ("ablations", "studies/smollm2-synthetic-lr1e-3-ablations/runs"),
    ("guard screen", "studies/smollm2-synthetic-lr1e-3-guard/runs"),
    ("F", "studies/smollm2-synthetic-lr2e-4-f/runs"),
    ("guard-gamma", "studies/smollm2-synthetic-lr2e-4-guard-gamma/runs"),
)
# The offline default run (`make train`) as committed: bf16 on two CPUs, float32, its GRPO twin, and study A's
# float32 twin at the same seed.
DEFAULT_RUNS = (
    "docs/measurements/make-train-20261125-2325",
    "docs/measurements/make-train-20261126-amx",
    "docs/measurements/make-train-float32-20261126",
    "docs/measurements/make-train-grpo-twin-20261126-amx",
    "studies/smollm2-synthetic-lr2e-4/runs/gtpo/seed0",
)

FULL_RUN = 40  # steps of a full study run: the runaway and format-lost rules need steps 31-40
RUNAWAY_FROM = FULL_RUN - ANALYSIS.RUNAWAY_WINDOW + 1  # 31: the runaway rule's window starts here
STALL_STEPS = ANALYSIS.E_STEPS  # 15
ONE_ANSWER_WINDOW = 10  # recorded steps
ONE_ANSWER_STEPS = 5  # one-wrong-answer steps within the window
KINDS = ("ran away", "stalled", "lost the format", "one answer")


@dataclass
class Failure:
    """One way a run failed: its kind, the step it is first seen, and the last step a warning counts as in time."""

    kind: str
    first_step: int
    deadline: int


@dataclass
class RunResult:
    study: str
    run: str
    steps: int
    episodes: list[list[int | None]]
    signals: list[str]
    failures: list[Failure] = field(default_factory=list)
    judged: bool = True
    scored: list[list[int | None]] = field(default_factory=list)  # the episodes the verdict counts

    @property
    def warned(self) -> int | None:
        return self.episodes[0][0] if self.episodes else None

    @property
    def unjudged_warning(self) -> bool:
        """A run too short for a runaway (under 40 steps) that warned only by a signal other than the stall's."""
        return self.judged and bool(self.episodes) and not self.scored

    @property
    def verdict(self) -> str:
        if not self.judged:
            return "not judged"
        if not self.failures:
            return "false alarm" if self.scored else "warned, not judged" if self.episodes else "quiet"
        if not self.scored:
            return "missed"
        in_time = any(start <= f.deadline for f in self.failures for start, _ in self.scored)
        return "hit" if in_time else "late"


def step_rows(metrics: Path) -> list[dict]:
    """One row per training step (its last record), in step order; rows without the step's metrics dropped.

    Returns:
        list of the logged dicts, step 1 first."""
    return [row for _, row in sorted(ANALYSIS._steps(metrics).items())]


def ran_away(rows: list[dict]) -> Failure | None:
    """Study C's rule on a 40-step run; first seen at its first step with half the group cut at the limit."""
    if len(rows) < FULL_RUN or not ANALYSIS._ran_away(rows[:FULL_RUN]):
        return None
    first = next(r["step"] for r in rows if r["completions/clipped_ratio"] >= ANALYSIS.RUNAWAY_CLIPPED)
    return Failure("ran away", first, RUNAWAY_FROM - 1)


def stalled(rows: list[dict]) -> Failure | None:
    """Study E's rule: no full-format group in steps 1-15 (first seen at step 1)."""
    steps = {r["step"]: r for r in rows if r["step"] <= STALL_STEPS}
    if len(steps) < STALL_STEPS or ANALYSIS.first_full_format(steps) is not None:
        return None
    return Failure("stalled", 1, STALL_STEPS)


def lost_format(rows: list[dict]) -> Failure | None:
    """A 40-step run that had the full format, then none in steps 31-40: from the first step of that last stretch."""
    if len(rows) < FULL_RUN:
        return None
    lost = ANALYSIS.format_lost_from({r["step"]: r for r in rows})
    if lost is None or lost > RUNAWAY_FROM:
        return None
    return Failure("lost the format", lost, RUNAWAY_FROM - 1)


def _one_wrong_answer(completions: list, accuracy: list[float]) -> bool:
    """Whether every completion of a recorded group gave the same answer, graded wrong."""
    from gtpo.grading import extract_answer, is_equivalent
    from gtpo.tasks.rewards import completion_text

    answers = [extract_answer(completion_text(c)) for c in completions]
    same = answers[0] is not None and all(is_equivalent(a, answers[0]) for a in answers)
    return same and all(score == 0 for score in accuracy)


def _record_columns(run: Path, step: int) -> tuple[list, list[float]]:
    """A recorded step's completions and accuracy rewards, read alone (the record's other columns are not needed)."""
    import pyarrow.parquet as pq

    from gtpo.runs.completions import METADATA_KEY, record_path

    table = pq.read_table(record_path(run, step), columns=["completion", "accuracy_reward"])
    json_columns = json.loads((table.schema.metadata or {}).get(METADATA_KEY, b"{}")).get("json_columns", ())
    completions = table.column("completion").to_pylist()
    if "completion" in json_columns:
        completions = [json.loads(c) for c in completions]
    return completions, table.column("accuracy_reward").to_pylist()


def one_answer_steps(run: Path, rows: list[dict]) -> list[int] | None:
    """The recorded steps whose group gave one wrong answer; None for a run without a completion record. Only the
    steps whose logged accuracy mean is 0 are read (every answer wrong is necessary)."""
    from gtpo.runs.completions import recorded_steps

    if not (run / "completions").is_dir():
        return None
    wrong = {r["step"] for r in rows if r.get("rewards/accuracy_reward/mean") == 0}
    return [step for step in recorded_steps(run) if step in wrong and _one_wrong_answer(*_record_columns(run, step))]


def one_answer(run: Path, rows: list[dict]) -> Failure | None:
    """The collapse onto one wrong answer (module docstring), from the completion record of a 40-step run."""
    if len(rows) < FULL_RUN:
        return None
    steps = one_answer_steps(run, rows)
    for i, start in enumerate(steps or []):
        window = [s for s in steps[i:] if s < start + ONE_ANSWER_WINDOW]
        if len(window) >= ONE_ANSWER_STEPS:
            return Failure("one answer", start, window[ONE_ANSWER_STEPS - 1])
    return None


def replay(rows: list[dict], rule: CollapseRule) -> CollapseMonitor:
    """The rule's monitor after every row, as the callback saw them in training."""
    monitor = CollapseMonitor(rule=rule)
    for row in rows:
        monitor.update(row, step=row["step"])
    return monitor


def _signals_fired(rows: list[dict], rule: CollapseRule) -> list[str]:
    """Which watched signals turned on at some step (each replayed alone)."""
    fired = []
    for signal in rule.signals:
        alone = CollapseRule(**{**rule.__dict__, "signals": (signal,)})
        if replay(rows, alone).fired:
            fired.append(signal)
    return fired


def scored_episodes(rows: list[dict], rule: CollapseRule, episodes: list[list[int | None]]) -> list[list[int | None]]:
    """The warnings a run's verdict counts: all of them on a 40-step run; on a shorter run, where only the stall can
    be judged, those of the stall signal alone (a length warning there may be a runaway that 15 steps cannot show,
    or the early excursion of lr 1e-3 that recovers)."""
    if len(rows) >= FULL_RUN:
        return episodes
    if "stall" not in rule.signals:
        return []
    return replay(rows, CollapseRule(**{**rule.__dict__, "signals": ("stall",)})).episodes


def measure_run(study: str, run: Path, rule: CollapseRule, one_answer_check: bool = True) -> RunResult:
    """Replay one run and judge what it did."""
    rows = step_rows(run / "metrics.jsonl")
    monitor = replay(rows, rule)
    result = RunResult(study, str(run.relative_to(ROOT)), len(rows), monitor.episodes, _signals_fired(rows, rule))
    result.judged = len(rows) >= STALL_STEPS
    result.scored = scored_episodes(rows, rule, monitor.episodes)
    if result.judged:
        checks = [ran_away(rows), stalled(rows), lost_format(rows)]
        if one_answer_check:
            checks.append(one_answer(run, rows))
        result.failures = [f for f in checks if f is not None]
    return result


def study_runs(folder: Path) -> list[Path]:
    """A study folder's runs (arm/seed<S> with a metrics.jsonl), arms by name, seeds ascending."""
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder.relative_to(ROOT)}: no such study folder (is this a full checkout?)")
    runs = [p.parent for p in folder.glob("*/seed*/metrics.jsonl") if p.parent.name[4:].isdigit()]
    return sorted(runs, key=lambda p: (p.parent.name, int(p.name[4:])))


def measure_all(rule: CollapseRule | None = None) -> list[RunResult]:
    """Every committed run of :data:`STUDIES`, replayed under ``rule`` (default: the shipped one, computed once)."""
    if rule is None:
        return _measure_shipped()
    return [measure_run(label, run, rule) for label, folder in STUDIES for run in study_runs(ROOT / folder)]


@functools.cache
def _measure_shipped() -> list[RunResult]:
    return measure_all(CollapseRule())


def table(results: list[RunResult]) -> list[str]:
    """The per-study markdown table: runs, failures by kind, hits, late, missed, false alarms, quiet, and the runs
    under 40 steps that warned by a signal their length cannot judge."""
    lines = [
        "| study | runs | failed (ran away / stalled / lost format / one answer) | hit | late | missed "
        "| false alarm | quiet | warned, not judged |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    labels = [label for label, _ in STUDIES] + ["all"]
    for label in labels:
        mine = [r for r in results if label in ("all", r.study) and r.judged]
        if not mine:
            continue
        kinds = " / ".join(str(sum(any(f.kind == k for f in r.failures) for r in mine)) for k in KINDS)
        failed = sum(bool(r.failures) for r in mine)
        verdicts = ("hit", "late", "missed", "false alarm", "quiet", "warned, not judged")
        counts = [sum(r.verdict == v for r in mine) for v in verdicts]
        name = "**all**" if label == "all" else label
        lines.append(f"| {name} | {len(mine)} | {failed} ({kinds}) | " + " | ".join(map(str, counts)) + " |")
    return lines


def _episodes_text(episodes: list[list[int | None]]) -> str:
    """``quiet``, or ``warned`` and each stretch the warning was on (``5–9``, ``31–end``)."""
    if not episodes:
        return "quiet"
    spans = [f"{a}" + ("–end" if b is None else f"–{b - 1}" if b - 1 > a else "") for a, b in episodes]
    return "warned " + ", ".join(spans)


def run_line(r: RunResult) -> str:
    failures = ", ".join(f"{f.kind} (from {f.first_step}, in time by {f.deadline})" for f in r.failures) or "–"
    fired = ", ".join(r.signals) or "–"
    return f"{r.run}: {r.steps} steps; {_episodes_text(r.episodes)} [{fired}]; {failures}; {r.verdict}"


def margins(rows: list[dict], rule: CollapseRule) -> str:
    """How close a run came to each default signal: the peak smoothed clipped share, the longest stretch without a
    full-format completion, and the peak smoothed fall of the format reward below its best, against the rule."""
    monitor, clipped, stall, fall = CollapseMonitor(rule=rule), 0.0, 0, 0.0
    for row in rows:
        out = monitor.update(row, step=row["step"])
        clipped = max(clipped, out.get("monitor/clipped_ema", 0.0))
        stall = max(stall, int(out.get("monitor/stall_streak", 0)))
        if monitor.format_best:
            fall = max(fall, out["monitor/format_drop"] / monitor.format_best)
    return (
        f"peaks: clipped {clipped:.2f} of {rule.clipped_threshold:g}, no full format {stall} of "
        f"{rule.stall_patience} logs, format fall {100 * fall:.0f} % of {100 * rule.format_drop:.0f} %"
    )


def default_run_lines(rule: CollapseRule) -> list[str]:
    """The offline default run's committed twins: where the rule would warn on each, and how close it came."""
    lines = []
    for folder in DEFAULT_RUNS:
        rows = step_rows(ROOT / folder / "metrics.jsonl")
        monitor = replay(rows, rule)
        lines.append(f"{folder}: {len(rows)} steps; {_episodes_text(monitor.episodes)} ({margins(rows, rule)})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", action="store_true", help="also print one line per run")
    parser.add_argument("--signals", nargs="+", choices=SIGNALS, help="the watched signals (default: the rule's)")
    parser.add_argument("--stall-patience", type=int, help="logs in a row for the stall signal")
    parser.add_argument("--patience", type=int, help="logs in a row for the other signals")
    parser.add_argument("--warmup", type=int, help="logs at the start that never warn")
    parser.add_argument("--json", help="also write every run's result here")
    args = parser.parse_args(argv)
    changes = {
        k: v
        for k, v in (
            ("signals", tuple(args.signals) if args.signals else None),
            ("stall_patience", args.stall_patience),
            ("patience", args.patience),
            ("warmup", args.warmup),
        )
        if v is not None
    }
    try:
        rule = CollapseRule(**changes)
        results = measure_all(rule if changes else None)
    except (FileNotFoundError, ValueError) as err:
        print(f"collapse_warning_table: error: {err}", file=sys.stderr)
        return 2
    if args.runs:
        for r in results:
            print(run_line(r))
        print()
    print("\n".join(table(results)))
    print()
    print("\n".join(default_run_lines(rule)))
    if args.json:
        Path(args.json).write_text(json.dumps([r.__dict__ | {"verdict": r.verdict} for r in results], default=vars))
    return 0


if __name__ == "__main__":
    sys.exit(main())
