"""scripts/gpu_checks.sh's groups of issue 58 (item 3) cannot rot on a machine without a GPU.

Invariants: the default groups are the fast ones they were (the new groups are opt-in); every command the new groups
run parses as its script parses it (a renamed flag fails here, not on a rented GPU); and
benchmarks/bench_eval_job.py runs a whole, tiny `gtpo eval` job each way on a CPU, in-process and as a fresh process,
with the same samples in every arm.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_eval_job  # noqa: E402
import bench_step  # noqa: E402


def _dry_run(tmp_path, groups: str | None) -> dict[str, list[str]]:
    """{step name: argv} of what gpu_checks.sh would run for ``groups`` (None: the default)."""
    env = {**os.environ, "GPU_CHECKS_DRY_RUN": "1", "PYTHON": "python3"}
    env.pop("GPU_CHECKS", None)
    if groups is not None:
        env["GPU_CHECKS"] = groups
    out = subprocess.run(["bash", "scripts/gpu_checks.sh", str(tmp_path / "logs")], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    steps = {}
    for line in out.splitlines():
        if line.startswith("== "):
            name, _, command = line[3:].partition(": ")
            steps[name] = shlex.split(command)
    assert (tmp_path / "logs" / "status.txt").read_text().count("rc=dry-run") == len(steps)
    return steps


def test_the_default_groups_stay_the_fast_ones(tmp_path):
    steps = _dry_run(tmp_path, None)
    assert "eval-job" not in steps and "gen-step" not in steps
    assert {"tests", "qwen-t07", "qwen3b-t07", "e2e-eval", "decode-graph"} <= set(steps)


def test_the_new_groups_commands_parse_and_fit_their_timeouts(tmp_path):
    """eval-job: bench_eval_job.py on SmolLM2 (offline), the three arms; gen-step: bench_step.py on CUDA at
    Qwen2.5-1.5B's config; each under a timeout that keeps the pair within issue 58's 8 minutes in sequence."""
    steps = _dry_run(tmp_path, "eval-job gen-step")
    assert list(steps) == ["eval-job", "gen-step"]
    timeouts = []
    for name, argv in steps.items():
        assert argv[0] == "timeout"
        timeouts.append(int(argv[1]))
        script, args = argv[3], argv[4:]
        assert argv[2] == "python3" and (ROOT / script).is_file()
        if name == "eval-job":
            options, rest = bench_eval_job.parse_args(args)
            assert rest == [] and options.model == "smollm2" and options.arms == list(bench_eval_job.ARMS)
            assert not options.in_process and options.reps >= 2
        else:
            options = bench_step.parse_args(args)
            assert options.device == "cuda" and options.model == "qwen1.5b-shape"
    assert sum(timeouts) <= 8 * 60


def test_the_eval_job_arms_turn_the_flag_and_the_generate_path_on(tmp_path):
    """--dry-run's commands: the eager arm alone passes --cuda_graphs false, and each parses as `gtpo eval`."""
    from gtpo.cli.main import parse_command

    out = subprocess.run([sys.executable, "benchmarks/bench_eval_job.py", "--dry-run", "--output_dir", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout  # fmt: skip
    commands = dict(line.split(": gtpo ", 1) for line in out.splitlines())
    assert list(commands) == ["graphs", "eager", "generate"]
    for arm, command in commands.items():
        argv = shlex.split(command)
        assert ("--cuda_graphs" in argv) == (arm == "eager")
        parse_command(argv)


def test_the_eval_job_benchmark_runs_a_tiny_job_each_way_on_a_cpu(tmp_path, capsys):
    bench_eval_job.main(["--model", "tiny", "--limit", "2", "-n", "2", "--max_new_tokens", "8", "--reps", "1",
                         "--in-process", "--output_dir", str(tmp_path)])  # fmt: skip
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("device CPU")
    rows = {line.split()[0]: line for line in lines if line.split()[0] in bench_eval_job.ARMS}
    assert set(rows) == set(bench_eval_job.ARMS)
    assert all(line.endswith("0 samples differ from graphs's") for line in rows.values())
    assert "x generate" in rows["graphs"] and "x graphs" in rows["generate"]
    assert len(bench_eval_job.samples(tmp_path / "eager", "synthetic")) == 4


@pytest.mark.slow
def test_the_eval_job_benchmark_runs_each_job_in_a_fresh_process(tmp_path, capsys):
    bench_eval_job.main(["--model", "tiny", "--limit", "1", "-n", "2", "--max_new_tokens", "4", "--reps", "1",
                         "--arms", "eager", "generate", "--output_dir", str(tmp_path)])  # fmt: skip
    out = capsys.readouterr().out
    assert "each a fresh process" in out and "0 samples differ from eager's" in out


def test_the_decode_group_measures_each_sampler_and_the_tests_group_runs_the_counter_samplers_gpu_tests(tmp_path):
    """Issue 58 item 2: the decode group times the counter sampler (its draw inside the replayed step; each line ends
    with the capture's cost) beside the per-row and multinomial ones, each with a sampler bench_decode_graph knows;
    the tests group runs the counter sampler's CUDA tests."""
    import bench_decode_graph

    steps = _dry_run(tmp_path, "tests decode")
    decode = {name: argv for name, argv in steps.items() if name.startswith("decode-graph")}
    samplers = {argv[argv.index("--sampler") + 1] if "--sampler" in argv else "per-row" for argv in decode.values()}
    assert samplers == set(bench_decode_graph.SAMPLERS) == {"per-row", "multinomial", "counter"}
    assert all(argv[1] == "benchmarks/bench_decode_graph.py" for argv in decode.values())
    assert "tests/test_counter_sampler.py" in steps["tests"] and "tests/test_graph_decode.py" in steps["tests"]


# The step group's measured seconds on one H100 (docs/measurements/gpu-h100-20261128/status.txt: step-t07 24,
# qwen-t07 47, qwen-t1 32; the 3B run's were cut off, about 57 by the group's 160): what the flex runs' timeouts add to.
STEP_SECONDS_BEFORE_FLEX = 160


def test_the_step_group_times_the_flex_arm_within_its_timeouts(tmp_path):
    """Issue 58 item 1: the step group runs bench_loss_step's gtpo-flex arm (FlexAttention's block mask) beside trl
    and gtpo at Qwen2.5-1.5B's and 3B's configs (gtpo-padded too at 1.5B, with the flex arm's profile), each command
    parsing as the benchmark parses it, under a timeout that keeps the group within issue 58's 8 minutes by the
    measured seconds of its other runs; the earlier runs' arms are unchanged; the tests group runs the flex tests."""
    import bench_loss_step

    steps = _dry_run(tmp_path, "tests step")
    flex = {name: argv for name, argv in steps.items() if "gtpo-flex" in argv}
    assert set(flex) == {"qwen-flex", "qwen3b-flex"}
    for name, argv in flex.items():
        assert argv[0] == "timeout" and argv[3] == "benchmarks/bench_loss_step.py"
        options = bench_loss_step._parse(argv[4:])
        assert options.reference == "trl" and {"trl", "gtpo", "gtpo-flex"} <= set(options.arms)
        assert options.shape == {"qwen-flex": "qwen1.5b", "qwen3b-flex": "qwen3b"}[name]
        assert options.temperature == 0.7 and options.reps >= 6
    assert "gtpo-padded" in flex["qwen-flex"] and flex["qwen-flex"][-2:] == ["--profile", "gtpo-flex"]
    assert STEP_SECONDS_BEFORE_FLEX + sum(int(argv[1]) for argv in flex.values()) <= 8 * 60
    others = [argv for name, argv in steps.items() if name not in flex and name != "tests"]
    assert others and all("--arms" not in argv for argv in others)  # trl, gtpo, gtpo-padded: the default arms
    assert "tests/trainer/test_packed_flex.py" in steps["tests"]


def test_the_flex_arm_runs_on_a_cpu_and_says_why_it_fell_back(capsys):
    """On a CPU torch has no FlexAttention backward: the gtpo-flex arm scores with the dense packed mask, its line says
    so, and its ratio to TRL's is printed like any arm's (the tiny shape, 1 repetition: a check that it runs)."""
    import bench_loss_step

    bench_loss_step.main(["--shape", "tiny", "--reps", "1", "--arms", "trl", "gtpo-flex"])
    lines = capsys.readouterr().out.splitlines()
    line = next(line for line in lines if line.startswith("gtpo-flex attention:"))
    assert "ran 0 times in 2 runs" in line and "FlexAttention has no backward on cpu" in line
    assert any(line.startswith("gtpo-flex / trl, forward + backward: ") for line in lines)
    assert bench_loss_step.ARMS[:3] == ("trl", "gtpo", "gtpo-padded")  # the default arms, unchanged
