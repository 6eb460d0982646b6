"""studies/tools/collapse_warning_table.py: the failure rules on hand-made runs, the verdicts, and docs/inspect.md's
table held to the script's output on the committed runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gtpo.runs import completions as records

ROOT = Path(__file__).resolve().parents[2]
FMT, ACC, CLIP = "rewards/format_reward/mean", "rewards/accuracy_reward/mean", "completions/clipped_ratio"


@pytest.fixture(scope="module")
def script():
    """The script as a module, registered in sys.modules (its dataclasses look their module up there)."""
    import importlib.util
    import sys

    path = ROOT / "studies" / "tools" / "collapse_warning_table.py"
    spec = importlib.util.spec_from_file_location("collapse_warning_table", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def rows(n=40, fmt=10.0, clip=0.0, acc=5.0):
    """n logged steps; each of format mean, clipped share and accuracy mean a number for every step or a dict
    {step: value} over the defaults (format 10, clipped 0, accuracy 5)."""

    def at(value, default, step):
        return value.get(step, default) if isinstance(value, dict) else value

    return [
        {"step": t, FMT: at(fmt, 10.0, t), CLIP: at(clip, 0.0, t), ACC: at(acc, 5.0, t), "entropy": 0.2}
        for t in range(1, n + 1)
    ]


def test_ran_away_is_study_c_rule_on_steps_31_to_40(script):
    # Six of steps 31-40 at >= 0.5 (35-40): ran away; first seen at the first step >= 0.5 anywhere (step 12).
    six = rows(clip={12: 0.5, **{s: 1.0 for s in range(35, 41)}})
    failure = script.ran_away(six)
    assert failure is not None and (failure.first_step, failure.deadline) == (12, 30)
    five = rows(clip={s: 1.0 for s in range(36, 41)})  # five of the ten: not a runaway
    assert script.ran_away(five) is None
    assert script.ran_away(rows(n=15, clip={s: 1.0 for s in range(1, 16)})) is None  # too short to judge


def test_stalled_is_study_e_rule_and_one_full_format_group_ends_it(script):
    stalled = script.stalled(rows(n=15, fmt=1.0))
    assert stalled is not None and (stalled.first_step, stalled.deadline) == (1, 15)
    # 10 / 8 = 1.25: one full-format completion of eight at step 15 -> not stalled
    assert script.stalled(rows(n=15, fmt={t: 1.25 if t == 15 else 1.0 for t in range(1, 16)})) is None
    assert script.stalled(rows(n=10, fmt=1.0)) is None  # fewer than 15 steps: not judged


def test_lost_the_format_needs_no_full_format_group_in_steps_31_to_40(script):
    lost = script.lost_format(rows(fmt={s: 1.0 for s in range(21, 41)}))
    assert lost is not None and lost.first_step == 21
    assert script.lost_format(rows(fmt={s: 1.0 for s in range(32, 41)})) is None  # step 31 had it
    assert script.lost_format(rows(fmt=1.0)) is None  # never had it: that is a stall, not a loss


METADATA = dict.fromkeys(records.METADATA_FIELDS, None)


def _record(run: Path, step: int, answers: list[str], accuracy: float):
    completions = [[{"role": "assistant", "content": f"<reasoning>x</reasoning>\n<answer>\n{a}\n</answer>"}]
                   for a in answers]  # fmt: skip
    records.write_step(run, step, {"completion": completions, "accuracy_reward": [accuracy] * len(answers)}, METADATA)


def test_one_answer_needs_five_one_wrong_answer_steps_within_ten(script, tmp_path):
    run = tmp_path / "run"
    logged = rows(acc={s: 0.0 for s in range(1, 41)})
    for step in range(1, 41):
        same = step in (12, 14, 15, 18, 21)  # five of steps 12-21: one window of ten
        answers = ["7"] * 4 + ["7."] * 4 if same else [str(step + i) for i in range(8)]
        _record(run, step, answers, 0.0)
    # "7" and "7." are one answer (the grader's equivalence); the sixth step of an all-right group is not counted
    _record(run, 30, ["9"] * 8, 10.0)
    assert script.one_answer_steps(run, logged) == [12, 14, 15, 18, 21]
    failure = script.one_answer(run, logged)
    assert failure is not None and (failure.first_step, failure.deadline) == (12, 21)
    # the same five steps spread over 11 steps: no window of ten holds five
    _record(run, 21, [str(i) for i in range(8)], 0.0)
    _record(run, 22, ["3"] * 8, 0.0)
    assert script.one_answer_steps(run, logged) == [12, 14, 15, 18, 22]
    assert script.one_answer(run, logged) is None
    assert script.one_answer_steps(tmp_path / "no-record", logged) is None


def test_verdicts(script):
    def result(steps, failures, episodes, scored=None):
        r = script.RunResult("X", "run", steps, episodes, [], failures)
        r.scored = episodes if scored is None else scored
        return r

    runaway = [script.Failure("ran away", 22, 30)]
    assert result(40, runaway, [[25, None]]).verdict == "hit"
    assert result(40, runaway, [[31, None]]).verdict == "late"
    assert result(40, runaway, [[3, 5], [31, None]]).verdict == "hit"  # an earlier stretch counts
    assert result(40, runaway, []).verdict == "missed"
    assert result(40, [], [[8, 12]]).verdict == "false alarm"
    assert result(40, [], []).verdict == "quiet"
    # a 15-step run that warned only by the length signal: not judged as a false alarm
    assert result(15, [], [[9, None]], scored=[]).verdict == "warned, not judged"


@pytest.mark.slow
def test_inspect_doc_table_is_the_scripts_output_on_the_committed_runs(script):
    """docs/inspect.md's table and default-run lines are what `collapse_warning_table.py` prints now; the counts
    add up (each judged run has one verdict, a failed run is a hit, late or missed)."""
    results = script.measure_all()
    doc = (ROOT / "docs" / "inspect.md").read_text()
    table = script.table(results)
    assert "\n".join(table) in doc
    for line in script.default_run_lines(script.CollapseRule()):
        assert line in doc
        assert "40 steps; quiet (peaks: " in line  # the default run's twins stay quiet at every step
    total = table[-1]
    runs, failed, *counts = (int(x) for x in re.findall(r"\| (\d+)", total.replace("**all**", "")))
    hit, late, missed, false_alarm, quiet, unjudged = counts
    assert hit + late + missed == failed and failed + false_alarm + quiet + unjudged == runs
    judged = [r for r in results if r.judged]
    assert len(judged) == runs and sum(bool(r.failures) for r in judged) == failed


def test_missing_study_folder_is_a_one_line_error(script, monkeypatch, capsys):
    monkeypatch.setattr(script, "STUDIES", (("Z", "studies/no-such-study/runs"),))
    assert script.main(["--signals", "length"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "studies/no-such-study/runs: no such study folder" in err[0]
