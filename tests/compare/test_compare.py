"""gtpo compare's aggregation on recorded metrics files, against values worked out by hand.

Two arms x three finished seeds (plus one unfinished run), 4 steps each, window 2. Per run the values of the
last two steps are equal, so each run's last-window mean is that value; the intervals are then the t-intervals
of three numbers (t_{0.975,2} = 4.303), worked out in the comments.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from gtpo.compare import report as compare_report
from gtpo.compare import study as compare
from gtpo.compare.study import Arm, Spec

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
T2 = 4.303

# (format, accuracy, entropy) per step 1..4, in reward units (max 10) and nats.
RECORDED = {
    ("A", 0): ([10, 10, 10, 10], [0, 0, 5, 5], [0.5] * 4),
    ("A", 1): ([10, 10, 8, 8], [0, 0, 4, 4], [0.5] * 4),
    ("A", 2): ([10, 10, 9, 9], [0, 0, 6, 6], [0.5] * 4),
    ("B", 0): ([10, 10, 6, 6], [0, 0, 5, 5], [0.5, 0.5, 1.0, 1.0]),
    ("B", 1): ([10, 10, 6, 6], [0, 0, 3, 3], [0.5, 0.5, 1.0, 1.0]),
    ("B", 2): ([10, 10, 7, 7], [0, 0, 4, 4], [0.5, 0.5, 1.0, 1.0]),
    ("A", 3): ([0, 0, 0, 0], [0, 0, 0, 0], [2.0] * 4),  # unfinished: must not enter the summary
}


def write_run(folder, fmt, acc, ent, finished=True):
    folder.mkdir(parents=True)
    rows = [
        {
            "step": s + 1,
            "reward": f + a,
            "rewards/format_reward/mean": f,
            "rewards/accuracy_reward/mean": a,
            "entropy": e,
        }
        for s, (f, a, e) in enumerate(zip(fmt, acc, ent, strict=False))
    ]
    # A resumed run logged step 3 twice: the later row is the one that counts.
    rows.insert(2, {**rows[2], "rewards/format_reward/mean": 0.0, "reward": 0.0})
    rows.append({"step": len(fmt), "train_runtime": 1.0})  # the trainer's final summary row, no reward
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    record = {"args": {"GTPOConfig": {"max_steps": len(fmt)}}, "status": "finished" if finished else "running"}
    (folder / "run.json").write_text(json.dumps(record))
    if finished:
        (folder / "model").mkdir()


@pytest.fixture
def study(tmp_path):
    spec = Spec([Arm("A", "a.yaml"), Arm("B", "b.yaml")], seeds=[0, 1, 2, 3])
    for (arm, seed), values in RECORDED.items():
        write_run(compare.run_dir(tmp_path, arm, seed), *values, finished=seed != 3)
    return spec, tmp_path


def test_summary_means_and_intervals_match_hand_computed_values(study):
    spec, out = study
    summary = compare_report.aggregate(spec, out, window=2, format_drop=20.0, figures=False)
    assert (summary["finished_runs"], summary["total_runs"]) == (6, 8)
    a = summary["arms"]["A"]
    assert a["finished_seeds"] == [0, 1, 2] and a["aggregated_seeds"] == [0, 1, 2]
    # A's format %: 100, 80, 90 -> mean 90, s = 10, half-width 4.303 * 10 / sqrt(3) = 24.8434
    fmt = a["metrics"]["format %"]
    assert fmt["mean"] == pytest.approx(90.0) and fmt["n"] == 3
    assert fmt["high"] - fmt["mean"] == pytest.approx(T2 * 10 / math.sqrt(3))
    # reward = format + accuracy: A 10+5, 8+4, 9+6 -> 15, 12, 15: mean 14, s = sqrt(3)
    assert a["metrics"]["reward"]["mean"] == pytest.approx(14.0)
    assert a["metrics"]["reward"]["high"] == pytest.approx(14.0 + T2 * math.sqrt(3) / math.sqrt(3))
    assert summary["arms"]["B"]["metrics"]["accuracy %"]["mean"] == pytest.approx(40.0)  # 50, 30, 40


def test_paired_differences_and_their_reading(study):
    spec, out = study
    pairs = {p["metric"]: p for p in compare_report.aggregate(spec, out, window=2, figures=False)["pairs"]}
    # format A - B per seed: 40, 20, 20 -> mean 26.667, s = 11.547, half = 4.303 * 11.547 / sqrt(3) = 28.687
    fmt = pairs["format %"]
    assert (fmt["a"], fmt["b"], fmt["diff"]["n"]) == ("A", "B", 3)
    assert fmt["diff"]["mean"] == pytest.approx(80 / 3)
    assert fmt["diff"]["low"] == pytest.approx(80 / 3 - T2 * math.sqrt(400 / 3) / math.sqrt(3))
    assert fmt["verdict"] == "no detectable difference"
    # entropy A - B: -0.5 on every seed: a zero-width interval away from 0, which 3 seeds cannot read (the sign
    # test, the reading when s = 0, needs 6 equal signs)
    assert pairs["entropy"]["diff"]["mean"] == pytest.approx(-0.5)
    assert (pairs["entropy"]["diff"]["low"], pairs["entropy"]["diff"]["high"]) == pytest.approx((-0.5, -0.5))
    assert pairs["entropy"]["verdict"] == "all 3 differences equal (s = 0): too few seeds to read (a sign test needs 6)"


def test_stability_finds_the_format_drop_and_the_upward_ln2_crossing(study):
    spec, out = study
    runs = compare_report.aggregate(spec, out, window=2, format_drop=20.0, figures=False)["runs"]
    # B/seed0 format %: 100 100 60 60, moving average (2): 100 100 80 60 -> 40 points below its best at step 4
    b0 = runs["B/seed0"]["stability"]
    assert b0["format_drop_steps"] == [4] and b0["first_format_drop"] == 4 and b0["max_format_drop"] == 40.0
    # entropy 0.5 0.5 1.0 1.0, moving average 0.5 0.5 0.75 1.0: crosses ln 2 = 0.693 at step 3
    assert b0["entropy_crosses_ln2"] == 3 and b0["entropy_above_ln2_last"] is True
    # A/seed1: 100 100 80 80 -> 100 100 90 80: a fall of exactly 20 is not "more than 20"
    a1 = runs["A/seed1"]["stability"]
    assert a1["format_drop_steps"] == [] and a1["max_format_drop"] == 20.0
    assert runs["A/seed0"]["stability"]["entropy_crosses_ln2"] is None
    assert "A/seed3" not in runs


def test_held_out_pass_and_maj_at_k_enter_the_summary_in_percent(study):
    spec, out = study
    for (arm, seed), p1 in {
        ("A", 0): 0.5,
        ("A", 1): 0.25,
        ("A", 2): 0.75,
        ("B", 0): 0.5,
        ("B", 1): 0.25,
        ("B", 2): 0.5,
    }.items():
        folder = compare.run_dir(out, arm, seed) / "eval" / "synthetic"
        folder.mkdir(parents=True)
        results = {"ks": [1, 2], "pass@k": {"1": p1, "2": 1.0}, "maj@k": {"1": p1, "2": p1}}
        (folder / "results.json").write_text(json.dumps(results))
    summary = compare_report.aggregate(spec, out, window=2, figures=False)
    assert summary["arms"]["A"]["metrics"]["pass@1 %"]["mean"] == pytest.approx(50.0)  # 50, 25, 75
    pairs = {p["metric"]: p for p in summary["pairs"]}
    # A - B pass@1: 0, 0, 25 points -> mean 8.33; pass@2: 0 on every seed -> zero-width interval at 0
    assert pairs["pass@1 %"]["diff"]["mean"] == pytest.approx(25 / 3)
    assert pairs["pass@2 %"]["diff"] == {"mean": 0.0, "low": 0.0, "high": 0.0, "n": 3}
    assert pairs["pass@2 %"]["verdict"] == "no detectable difference"
    assert "| entropy | pass@1 % | pass@2 % | maj@1 % | maj@2 % |" in (out / "summary.md").read_text()


@pytest.mark.slow
def test_summary_files_and_figures_are_written_and_partial_studies_say_so(study):
    spec, out = study
    compare_report.aggregate(spec, out, window=2)
    text = (out / "summary.md").read_text()
    assert "6 of 8 runs finished" in text and "**Partial**" in text
    assert "| A − B | format % | 26.67 [-2.02, 55.35] | 3 | no detectable difference |" in text
    assert json.loads((out / "summary.json").read_text())["finished_runs"] == 6
    for name in ("training_curves.png", "format.png", "entropy.png", "stability.png"):
        assert (out / "figures" / name).read_bytes()[:8] == PNG_MAGIC, name
    unfinished = compare_report.aggregate(spec, out, window=2, include_unfinished=True, figures=False)
    assert unfinished["runs"]["A/seed3"]["status"] == "running"
    assert unfinished["arms"]["A"]["aggregated_seeds"] == [0, 1, 2, 3]


def test_a_preregistered_study_withholds_every_estimate_until_its_last_run(study):
    """No interim look (issue 38, item 6): a study folder with PREREGISTRATION.md gets, while a registered run is
    unfinished, a summary that says how many runs have finished and shows no estimate, no stability, no figures;
    once every run of compare.json has finished, the full summary."""
    spec, out = study
    assert not compare_report.withholds_estimates(spec, out)  # not registered: read as it goes
    (out / "PREREGISTRATION.md").write_text("# registered\n")
    assert compare_report.withholds_estimates(spec, out)
    for include_unfinished in (False, True):
        summary = compare_report.aggregate(spec, out, window=2, include_unfinished=include_unfinished)
        on_disk = json.loads((out / "summary.json").read_text())
        assert on_disk == summary and (summary["finished_runs"], summary["total_runs"]) == (6, 8)
        assert summary["pairs"] == [] and "all 8 runs" in summary["withheld"]
        assert summary["arms"] == {"A": {"finished_seeds": [0, 1, 2]}, "B": {"finished_seeds": [0, 1, 2]}}
        assert all(set(run) == {"status", "steps"} for run in summary["runs"].values())
        text = (out / "summary.md").read_text()
        assert "6 of 8 runs finished" in text and "Pre-registered study, not complete" in text
        assert "| A | 0,1,2 |" in text
        for estimate in ("−", "26.67", "90.00", "format %", "pass@1", "Stability per run"):
            assert estimate not in text, estimate
        assert not (out / "figures").exists()
    # A's seed 3 and B's seed 3 finish: the study is complete, the summary is the full one.
    write_run(compare.run_dir(out, "B", 3), [10, 10, 7, 7], [0, 0, 4, 4], [0.5, 0.5, 1.0, 1.0])
    shutil.rmtree(compare.run_dir(out, "A", 3))
    write_run(compare.run_dir(out, "A", 3), [10, 10, 9, 9], [0, 0, 5, 5], [0.5] * 4)
    summary = compare_report.aggregate(spec, out, window=2)
    assert not compare_report.withholds_estimates(spec, out)
    assert "withheld" not in summary and (summary["finished_runs"], summary["total_runs"]) == (8, 8)
    assert {p["metric"] for p in summary["pairs"]} >= {"format %", "accuracy %"}
    assert summary["arms"]["A"]["metrics"]["format %"]["n"] == 4
    text = (out / "summary.md").read_text()
    assert "| A − B | format % |" in text and "withheld" not in text and "Pre-registered" not in text
    assert (out / "figures" / "format.png").read_bytes()[:8] == PNG_MAGIC


def test_the_lock_in_warning_table_reads_no_run_of_a_registered_study_before_its_last(study, monkeypatch, capsys):
    """studies/tools/lockin_warning_table.py walks every study folder: a pre-registered one still running (6 of its
    8 runs finished) is listed as withheld and none of its runs is read; the same folder unregistered is read."""
    from cli_helpers import load_script

    spec, out = study
    studies = out / "studies"
    folder = studies / "registered"
    shutil.copytree(out / "runs", folder / "runs")
    (folder / "compare.json").write_text(json.dumps(spec.to_json()))
    table = load_script("lockin_warning_table")
    monkeypatch.setattr(table, "ROOT", out)
    assert table.main([]) == 0
    assert set(json.loads(capsys.readouterr().out)) == {"registered"}
    (folder / "PREREGISTRATION.md").write_text("# registered\n")
    monkeypatch.setattr(table, "study_table", lambda runs: pytest.fail(f"read {runs}"))
    assert table.main([]) == 0
    assert json.loads(capsys.readouterr().out) == {"withheld (pre-registered, still running)": ["registered"]}


def test_arm_band_averages_smoothed_curves_over_the_seeds_that_have_each_step():
    """Study A's conflict-fraction panel, on the steps every seed shared, showed steps 1-7 of 40 only (a step whose
    group got equal rewards has no conflict); each step now averages the seeds that logged it."""
    from gtpo.compare.figures import arm_band

    # Seed curves on steps 1-3 and 1, 2, 4; window 1 (no smoothing).
    steps, mean, low, high = arm_band([([1, 2, 3], [0.0, 2.0, 9.0]), ([1, 2, 4], [2.0, 4.0, 5.0])], window=1)
    assert steps == [1, 2, 3, 4] and mean == [1.0, 3.0, 9.0, 5.0]
    # two values 0 and 2: s = sqrt(2), half = 12.706 * sqrt(2) / sqrt(2) = 12.706; one value: no band
    assert low == pytest.approx([1.0 - 12.706, 3.0 - 12.706, 9.0, 5.0])
    assert high == pytest.approx([1.0 + 12.706, 3.0 + 12.706, 9.0, 5.0])
    # smoothing is per seed, over its own steps: seed 2's step 4 averages its steps 2 and 4 (window 2)
    assert arm_band([([1, 2, 4], [2.0, 4.0, 5.0])], window=2)[1] == [2.0, 3.0, 4.5]
    assert arm_band([], window=3) == ([], [], [], [])


def test_bands_are_cut_to_the_range_of_their_metric():
    """Study B's format band reached 200 % and its entropy band -1 nats (t = 4.303 at 3 seeds, 12.706 at 2): a mean
    of percentages lies in [0, 100] and one of entropies above 0, so the drawn band is cut there."""
    from gtpo.compare.figures import clip_band
    from gtpo.runs.plots import PANELS

    bounds = {panel.name: panel.bounds for panel in PANELS}
    assert bounds["format"] == bounds["accuracy"] == (0.0, 100.0)
    assert bounds["conflict"] == bounds["filtered"] == (0.0, 1.0) and bounds["entropy"] == (0.0, None)
    assert bounds["reward"] == (None, None)  # a user's reward functions may be negative
    assert clip_band([-5.0, 50.0, 200.0], (0.0, 100.0)) == [0.0, 50.0, 100.0]
    assert clip_band([-1.0, 2.5], (0.0, None)) == [0.0, 2.5]
    assert clip_band([-1.0, 2.5], (None, None)) == [-1.0, 2.5]


def test_arms_from_variants_and_bad_arm_specs_are_refused_in_one_line(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("algorithm: gtpo\n")
    arms = compare.parse_arms([str(recipe)], ["gtpo:", "grpo:--algorithm grpo --learning_rate 1e-3"])
    assert [(a.name, a.args) for a in arms] == [
        ("gtpo", []),
        ("grpo", ["--algorithm", "grpo", "--learning_rate", "1e-3"]),
    ]
    assert compare.parse_arms([f"x={recipe}"], [])[0].name == "x"
    for recipes, variants, message in [
        ([str(recipe), str(recipe)], ["a:"], "exactly one --recipe"),
        ([str(recipe)], ["nocolon"], "NAME:FLAGS"),
        ([str(recipe)], ["a:--seed 3"], "sets --seed"),
        ([str(tmp_path / "missing.yaml")], [], "not found"),
        ([str(recipe)], ["a:", "a:--beta 0"], "must differ"),
    ]:
        with pytest.raises(ValueError, match=message):
            compare.parse_arms(recipes, variants)


def test_rerun_with_changed_arms_is_refused_but_more_seeds_and_new_arms_are_added(tmp_path):
    """A rerun may add seeds and arms (new names, after the study's own); it may not change an arm the study
    has, nor the common flags, since the finished runs were made with them."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("algorithm: gtpo\n")
    compare.write_or_check_spec(Spec([Arm("a", str(recipe)), Arm("b", str(recipe), ["--beta", "0"])], [0, 1]), tmp_path)
    more = Spec([Arm("a", str(recipe))], [2])
    compare.write_or_check_spec(more, tmp_path)
    assert more.seeds == [0, 1, 2]
    assert [a.name for a in more.arms] == ["a", "b"]  # b, not on this command line, stays in the study
    # A new arm goes after the study's own, whatever order the command line gives.
    wider = Spec([Arm("c", str(recipe), ["--entropy_filter", "always"]), Arm("a", str(recipe))], [0])
    compare.write_or_check_spec(wider, tmp_path)
    assert [a.name for a in wider.arms] == ["a", "b", "c"] and wider.seeds == [0, 1, 2]
    saved = Spec.from_json(json.loads((tmp_path / "compare.json").read_text()))
    assert [(a.name, a.args) for a in saved.arms] == [
        ("a", []),
        ("b", ["--beta", "0"]),
        ("c", ["--entropy_filter", "always"]),
    ]
    with pytest.raises(ValueError, match="different study .arm 'b' has other recipe or flags"):
        compare.write_or_check_spec(Spec([Arm("b", str(recipe), ["--beta", "0.1"])], [0]), tmp_path)
    with pytest.raises(ValueError, match="common flags or --save_steps differ"):
        compare.write_or_check_spec(Spec([Arm("a", str(recipe))], [0], ["--max_steps", "3"]), tmp_path)
    with pytest.raises(ValueError, match="common flags or --save_steps differ"):
        compare.write_or_check_spec(Spec([Arm("a", str(recipe))], [0], save_steps=5), tmp_path)
    # Neither refusal touched compare.json.
    assert Spec.from_json(json.loads((tmp_path / "compare.json").read_text())).arms == saved.arms


def test_compare_help_documents_resume_statistics_and_many_gpus(capsys):
    from gtpo import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["compare", "--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0
    for text in (
        "gtpo compare",
        "--variant",
        "--seeds",
        "resumes",
        "95%",
        "no detectable",
        "--dry-run",
        "--launcher",
        "--eval",
        "ln 2",
        "--format-drop",
    ):
        assert text in out, text


def test_compare_without_arms_or_spec_is_one_line_exit_2(tmp_path, capsys):
    from gtpo import cli

    assert cli.main(["compare", "-o", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "compare.json" in err[0] and "--recipe" in err[0]


def test_a_second_compare_on_a_running_study_is_refused_and_a_stale_lock_is_taken_over(tmp_path):
    import os
    import socket

    from gtpo.compare.lock import LOCK_FILE, StudyLock

    with StudyLock(tmp_path), pytest.raises(ValueError, match="another gtpo compare"):
        StudyLock(tmp_path).__enter__()
    assert not (tmp_path / LOCK_FILE).exists()
    # A lock left by a process that is gone (pid 0 is never a live process here) is taken over.
    (tmp_path / LOCK_FILE).write_text(f"{socket.gethostname()} 0\n")
    with StudyLock(tmp_path) as lock:
        assert lock.mine == f"{socket.gethostname()} {os.getpid()}"
        assert (tmp_path / LOCK_FILE).read_text().strip() == lock.mine


def test_eval_runs_gtpo_eval_once_per_finished_run_with_the_runs_task_and_length(study, tmp_path):
    import sys

    spec, out = study
    for arm, seed in [("A", 0), ("A", 1), ("A", 2), ("B", 0), ("B", 1), ("B", 2), ("A", 3)]:
        record_path = compare.run_dir(out, arm, seed) / "run.json"
        record = json.loads(record_path.read_text())
        record["args"].update(TrainScriptArguments={"task": "synthetic"}, ModelConfig={"dtype": "bfloat16"})
        record["args"]["GTPOConfig"]["max_completion_length"] = 96
        record_path.write_text(json.dumps(record))
    # A stand-in for the gtpo CLI: records its arguments and writes the results.json gtpo eval would.
    fake = tmp_path / "fake_gtpo.py"
    fake.write_text(
        "import json, pathlib, sys\n"
        "args = sys.argv[1:]\n"
        "out = pathlib.Path(args[args.index('--output_dir') + 1]) / args[args.index('--task') + 1]\n"
        "out.mkdir(parents=True)\n"
        "(out / 'results.json').write_text(json.dumps({'ks': [1], 'pass@k': {'1': 0.5}, 'maj@k': {'1': 0.5}}))\n"
        "(out / 'argv.json').write_text(json.dumps(args))\n"
    )
    kwargs = dict(task=None, split="test", n=4, limit=40, max_new_tokens=None)
    compare.evaluate_runs(spec, out, [sys.executable, str(fake)], **kwargs)
    argvs = sorted(out.glob("runs/*/seed*/eval/synthetic/argv.json"))
    assert len(argvs) == 6  # the unfinished A/seed3 is not evaluated
    argv = json.loads(argvs[0].read_text())
    assert argv[0] == "eval" and argv[argv.index("--max_new_tokens") + 1] == "96"
    assert argv[argv.index("--dtype") + 1] == "bfloat16" and argv[argv.index("-n") + 1] == "4"
    before = [p.stat().st_mtime_ns for p in argvs]
    compare.evaluate_runs(spec, out, [sys.executable, str(fake)], **kwargs)  # results exist: skipped
    assert [p.stat().st_mtime_ns for p in argvs] == before
    # batch_size was not given: gtpo eval's own default applies (no flag passed); a key that is not an evaluation
    # setting is refused.
    assert compare.EVAL_DEFAULTS["batch_size"] is None and "--batch_size" not in argv
    with pytest.raises(TypeError, match="unknown evaluation settings \\['batch'\\]"):
        compare.evaluate_runs(spec, out, [sys.executable, str(fake)], batch=8)


def _fake_gtpo(tmp_path: Path) -> Path:
    """A stand-in for the gtpo CLI: appends its verb and output folder to tmp_path/calls.log; `train` writes a
    finished one-step run (model/ included), `eval` the results.json gtpo eval would, with its argv."""
    fake = tmp_path / "fake_gtpo.py"
    fake.write_text(
        "import json, pathlib, sys\n"
        "args = sys.argv[1:]\n"
        "log = pathlib.Path(sys.argv[0]).with_name('calls.log')\n"
        "out = pathlib.Path(args[args.index('--output_dir') + 1])\n"
        "with log.open('a') as f: f.write(args[0] + ' ' + str(out) + '\\n')\n"
        "if args[0] == 'train':\n"
        "    out.mkdir(parents=True, exist_ok=True); (out / 'model').mkdir()\n"
        "    (out / 'run.json').write_text(json.dumps({'status': 'finished', 'args': {\n"
        "        'GTPOConfig': {'max_steps': 1, 'max_completion_length': 8},\n"
        "        'TrainScriptArguments': {'task': 'synthetic'}, 'ModelConfig': {'dtype': 'float32'}}}))\n"
        "    (out / 'metrics.jsonl').write_text(json.dumps({'step': 1, 'reward': 1.0}) + '\\n')\n"
        "else:\n"
        "    (out / 'synthetic').mkdir(parents=True)\n"
        "    (out / 'synthetic' / 'results.json').write_text(json.dumps(\n"
        "        {'ks': [1], 'pass@k': {'1': 0.5}, 'maj@k': {'1': 0.5}, 'argv': args}))\n"
    )
    return fake


def test_each_run_is_evaluated_right_after_it_trains_and_the_hook_sees_it_complete(tmp_path):
    """With eval settings in the spec, run_all trains a run, evaluates it, then calls --after-run, before the
    next run starts: a study stopped between runs has every finished run complete (issue 18). The settings
    live in compare.json, so a continued study (spec read back) evaluates with the same ones."""
    import sys

    fake = _fake_gtpo(tmp_path)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("max_steps: 1\n")
    out = tmp_path / "study"
    settings = {**compare.EVAL_DEFAULTS, "n": 8, "limit": 100, "batch_size": 64, "dtype": "float32"}
    compare.write_or_check_spec(Spec([Arm("a", str(recipe)), Arm("b", str(recipe))], [0], eval=settings), out)
    spec = Spec.from_json(json.loads((out / compare.SPEC_FILE).read_text()))
    assert spec.eval == settings
    hook = f"echo hook $GTPO_RUN_DIR >> {tmp_path / 'calls.log'}"
    assert compare.run_all(spec, out, [sys.executable, str(fake)], after_run=hook) == []
    calls = (tmp_path / "calls.log").read_text().split()
    a, b = str(compare.run_dir(out, "a", 0)), str(compare.run_dir(out, "b", 0))
    assert calls == [
        "train",
        a,
        "eval",
        str(Path(a) / "eval"),
        "hook",
        a,
        "train",
        b,
        "eval",
        str(Path(b) / "eval"),
        "hook",
        b,
    ]
    argv = json.loads((Path(a) / "eval" / "synthetic" / "results.json").read_text())["argv"]
    assert argv[argv.index("--batch_size") + 1] == "64" and argv[argv.index("-n") + 1] == "8"
    assert argv[argv.index("--limit") + 1] == "100" and argv[argv.index("--max_new_tokens") + 1] == "8"
    assert argv[argv.index("--dtype") + 1] == "float32"  # the study's eval dtype wins over the run's
    # Continuing: nothing to train or evaluate, so neither runs nor the hook is called again.
    assert compare.run_all(spec, out, [sys.executable, str(fake)], after_run=hook) == []
    assert (tmp_path / "calls.log").read_text().split() == calls
    # Other evaluation settings for the same study are refused rather than mixed in.
    with pytest.raises(ValueError, match="evaluates with"):
        compare.write_or_check_spec(Spec(spec.arms, [0], eval={**settings, "n": 4}), out)


def test_a_finished_run_whose_model_is_gone_before_its_evaluation_is_trained_again(tmp_path):
    """Weights are never committed. A run that finished training but not its held-out evaluation when the
    machine went away comes back as run.json + metrics.jsonl without model/: continuing the study must train
    it again (then evaluate it and call the hook), not fail on a missing model every time. A run that was
    evaluated needs no model and stays done."""
    import sys

    fake = _fake_gtpo(tmp_path)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("max_steps: 1\n")
    out = tmp_path / "study"
    spec = Spec([Arm("a", str(recipe)), Arm("b", str(recipe))], [0, 1], eval=dict(compare.EVAL_DEFAULTS))
    compare.write_or_check_spec(spec, out)
    launcher = [sys.executable, str(fake)]
    assert compare.run_all(spec, out, launcher) == []
    log = tmp_path / "calls.log"
    log.write_text("")
    # A fresh machine: no run has its weights. a/seed0 also lost its evaluation (shut down mid-eval).
    for folder in out.glob("runs/*/seed*"):
        shutil.rmtree(folder / "model")
    shutil.rmtree(compare.run_dir(out, "a", 0) / "eval")
    actions = {(arm.name, seed): action for arm, seed, action, _ in compare.plan(spec, out)}
    assert actions == {("a", 0): "retrain", ("b", 0): "done", ("a", 1): "done", ("b", 1): "done"}
    assert compare.run_all(spec, out, launcher) == []
    a0 = compare.run_dir(out, "a", 0)
    assert log.read_text().split() == ["train", str(a0), "eval", str(a0 / "eval")]  # only a/seed0, then its eval
    assert (a0 / "eval" / "synthetic" / "results.json").is_file()
    # Without held-out evaluation in the study, a missing model changes nothing.
    no_eval = Spec(spec.arms, spec.seeds)
    shutil.rmtree(a0 / "eval")
    assert {action for *_, action, _ in compare.plan(no_eval, out)} == {"done"}


def test_run_record_names_the_git_commit_of_the_code_that_runs():
    """run.json's `code` is this checkout's HEAD (asked of git independently here), so a study's runs say which
    code produced them."""
    import subprocess

    from gtpo.runs.provenance import code_version

    package = Path(compare.__file__).parent
    head = subprocess.run(["git", "-C", str(package), "rev-parse", "HEAD"], capture_output=True, text=True)
    version = code_version()
    if head.returncode != 0:
        assert version["git_commit"] is None and version["git_dirty"] is None
    else:
        assert version["git_commit"] == head.stdout.strip() and isinstance(version["git_dirty"], bool)
