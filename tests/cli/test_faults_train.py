"""Fault injection for training: kill -9 at several points of a tiny `gtpo train`, resume, and compare with
the uninterrupted run; and the bad inputs of issue 10 as a table, each one line, exit 2, nothing left behind.

A killed run is a real SIGKILL of a `gtpo train` subprocess (no exception handler, no atexit, no flush),
sent by the process to itself at the chosen point; the point is reached by wrapping one library function
in the child (FAULT_RUNNER). The reference is the same command without a fault.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gtpo import cli
from gtpo.runs import folder as runfolder
from gtpo.runs.metrics_log import prepare_for_resume
from gtpo.trainer import policy

# One subprocess imports gtpo, transformers and TRL once, then runs each job (FAULT, ARGS) in a forked
# child: `gtpo.cli.main(ARGS)` with a SIGKILL arranged at FAULT. The child is killed as `kill -9` would
# kill it (no exception handler, no atexit, no flush); a fork saves the ~5 s import per run. FAULT:
# "none"; "mid-step:K" (step K's gradients computed, the optimizer has not stepped); "ckpt-weights:K"
# (checkpoint-K holds only GTPO's state: the kill comes as Trainer starts writing the weights);
# "ckpt-state:K" (half of checkpoint-K's trainer_state.json written); "torn-row:K" (half of step K's
# metrics line written); "before-finish" (model/ saved, run.json not yet marked finished).
# Prints the jobs' exit statuses (-9 for a SIGKILL) as one JSON line.
FAULT_RUNNER = r"""
import json, os, signal, sys
import transformers
from transformers.trainer_callback import TrainerState
import gtpo.cli, gtpo.trainer.trainer, trl
from gtpo.runs import folder as runfolder, metrics_log as runlog

def die():
    os.kill(os.getpid(), signal.SIGKILL)

def arrange(kind, k):
    if kind == "mid-step":
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            if state.global_step == k - 1:
                die()
        runlog.MetricsLogger.on_pre_optimizer_step = on_pre_optimizer_step
    elif kind == "ckpt-weights":
        save_model = transformers.Trainer.save_model
        def wrapped(self, output_dir=None, *a, **kw):
            if str(output_dir).endswith(f"checkpoint-{k}"):
                die()
            return save_model(self, output_dir, *a, **kw)
        transformers.Trainer.save_model = wrapped
    elif kind == "ckpt-state":
        save_to_json = TrainerState.save_to_json
        def torn(self, path):
            save_to_json(self, path)
            if self.global_step == k:
                with open(path, "r+") as f:
                    f.truncate(os.path.getsize(path) // 2)
                die()
        TrainerState.save_to_json = torn
    elif kind == "torn-row":
        on_log = runlog.MetricsLogger.on_log
        def torn_log(self, args, state, control, logs=None, **kwargs):
            if state.global_step == k and logs and "loss" in logs:
                with self.path.open("a") as f:
                    f.write('{"step": %d, "time": 1.0, "loss": 0.6' % k)
                die()
            return on_log(self, args, state, control, logs=logs, **kwargs)
        runlog.MetricsLogger.on_log = torn_log
    elif kind == "before-finish":
        set_status = runfolder.set_status
        def wrapped(run_dir, status, error=None):
            if status == runfolder.FINISHED:
                die()
            return set_status(run_dir, status, error)
        runfolder.set_status = wrapped

statuses = []
for number, (fault, args, log) in enumerate(json.loads(sys.argv[1])):
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1); os.dup2(fd, 2)
        kind, _, k = fault.partition(":")
        arrange(kind, int(k or 0))
        try:
            code = gtpo.cli.main(args)
        except BaseException as err:
            import traceback; traceback.print_exc(); code = 1
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(code or 0)
    _, status = os.waitpid(pid, 0)
    statuses.append(-os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
print(json.dumps(statuses))
"""

MAX_STEPS, SAVE_STEPS = 6, 3
# (fault, the checkpoint `--resume_from_checkpoint last` must pick)
FAULTS = [
    ("mid-step:5", 3),  # steps 4 and 5 were logged past checkpoint-3: dropped on resume, run again
    ("ckpt-weights:6", 3),  # the case: checkpoint-6 holds only gtpo_state.json, skipped
    ("ckpt-state:6", 3),  # checkpoint-6 has weights and a torn trainer_state.json, skipped
    ("torn-row:5", 3),  # a half-written line at the end of metrics.jsonl, cut
    ("before-finish", 6),  # everything saved, status still "running": resume trains 0 steps and finishes
]


def train_args(model: str, run_dir: Path) -> list[str]:
    return [
        "train", "--model_name_or_path", model, "--dtype", "float32", "--max_steps", str(MAX_STEPS),
        "--num_generations", "2", "--per_device_train_batch_size", "2", "--max_completion_length", "6",
        "--initial_entropy_prompts", "2", "--num_examples", "8", "--save_strategy", "steps",
        "--save_steps", str(SAVE_STEPS), "--plot", "false", "--output_dir", str(run_dir),
    ]  # fmt: skip


def run_jobs(jobs: list[tuple[str, list[str]]], logs: Path) -> list[tuple[int, str]]:
    """Run each (fault, argv) in turn (FAULT_RUNNER); return each job's (exit status, output)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("GTPO_DEBUG", None)
    spec = [(fault, args, str(logs / f"job{i}.log")) for i, (fault, args) in enumerate(jobs)]
    result = subprocess.run([sys.executable, "-c", FAULT_RUNNER, json.dumps(spec)], cwd=logs, env=env,
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    statuses = json.loads(result.stdout.strip().splitlines()[-1])
    return [(status, Path(log).read_text()) for status, (_, _, log) in zip(statuses, spec, strict=False)]


def step_rows(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [row for row in map(json.loads, lines) if "loss" in row]


def adapter(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(run_dir / "model" / "adapter_model.safetensors")


def sft_args(model: str, run_dir: Path) -> list[str]:
    return [
        "sft", "--model_name_or_path", model, "--task", "synthetic", "--num_examples", "8", "--max_steps", "4",
        "--per_device_train_batch_size", "2", "--logging_steps", "1", "--use_peft", "true", "--lora_r", "4",
        "--lora_target_modules", "q_proj", "v_proj", "--report_to", "none", "--save_strategy", "steps",
        "--save_steps", "2", "--disable_tqdm", "true", "--output_dir", str(run_dir),
    ]  # fmt: skip


@pytest.fixture(scope="module")
def fault_runs(tmp_path_factory, tiny_model_path) -> dict:
    """The uninterrupted reference run, and for each fault: the killed run, a rerun of the same command
    (refused), and the resumed run (`--resume_from_checkpoint last`), all into one folder per fault.
    Also: a run killed twice (the second time while resuming), and `gtpo sft` killed and resumed."""
    root = tmp_path_factory.mktemp("faults")
    last = ["--resume_from_checkpoint", "last"]
    jobs = {"reference": [("none", train_args(tiny_model_path, root / "reference"))]}
    for fault, _ in FAULTS:
        args = train_args(tiny_model_path, root / fault.replace(":", "-"))
        jobs[fault] = [(fault, args), ("none", args), ("none", args + last)]
    twice = train_args(tiny_model_path, root / "twice")
    jobs["twice"] = [("mid-step:5", twice), ("ckpt-weights:6", twice + last), ("none", twice + last)]
    jobs["sft-reference"] = [("none", sft_args(tiny_model_path, root / "sft-reference"))]
    sft = sft_args(tiny_model_path, root / "sft")
    jobs["sft"] = [("mid-step:3", sft), ("none", sft + last)]
    flat = [job for group in jobs.values() for job in group]
    results = iter(run_jobs(flat, root))
    runs = {name: [next(results) for _ in group] for name, group in jobs.items()}
    for name in ("reference", "sft-reference"):
        assert runs[name][0][0] == 0, runs[name][0][1][-3000:]
    return {"root": root, "reference": root / "reference", "runs": runs}


def assert_equals_the_reference(run_dir: Path, reference: Path, steps: int, keys: tuple[str, ...]) -> None:
    """metrics.jsonl: steps 1..steps once each, the reference's values, time non-decreasing, one summary;
    the adapter bit-identical to the reference's."""
    rows, expected = step_rows(run_dir), step_rows(reference)
    assert [row["step"] for row in rows] == list(range(1, steps + 1))  # each step exactly once
    for row, ref in zip(rows, expected, strict=False):
        for key in keys:
            assert row[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-7), (row["step"], key)
    times = [row["time"] for row in rows]
    assert times == sorted(times)  # the time column continues from the checkpoint's row
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert sum("train_runtime" in json.loads(line) for line in lines) == 1  # one closing summary
    got, want = adapter(run_dir), adapter(reference)
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].equal(want[name]), name  # bit-identical, as an uninterrupted run


TRAIN_KEYS = ("loss", "reward", "grad_norm", "gtpo/mean_entropy", "completions/mean_length")


@pytest.mark.slow
@pytest.mark.parametrize("fault, resumed_from", FAULTS, ids=[f for f, _ in FAULTS])
def test_kill_9_then_resume_last_equals_the_uninterrupted_run(fault, resumed_from, fault_runs):
    run_dir, reference = fault_runs["root"] / fault.replace(":", "-"), fault_runs["reference"]
    (killed, killed_log), (again, again_log), (resumed, resumed_log) = fault_runs["runs"][fault]
    assert killed == -9, killed_log[-3000:]  # SIGKILL, not an error exit
    assert again == 2, again_log[-3000:]  # the same command into the same folder is refused, in one line
    refusal = [line for line in again_log.splitlines() if line.startswith("gtpo: error: ")]
    assert len(refusal) == 1 and "status: running" in refusal[0] and "--resume_from_checkpoint last" in refusal[0]

    assert resumed == 0, resumed_log[-3000:]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "finished" and record["resumed"][0]["from"] == str(
        run_dir / f"checkpoint-{resumed_from}"
    )

    assert_equals_the_reference(run_dir, reference, MAX_STEPS, TRAIN_KEYS)


@pytest.mark.slow
def test_a_run_killed_again_while_resuming_still_equals_the_uninterrupted_run(fault_runs):
    """Killed mid-step 5 (checkpoint-3 kept), resumed, killed again as checkpoint-6 is saved (rows 4-6
    logged, checkpoint-6 incomplete), resumed again: from checkpoint-3 both times."""
    run_dir = fault_runs["root"] / "twice"
    (first, log1), (second, log2), (resumed, log3) = fault_runs["runs"]["twice"]
    assert (first, second) == (-9, -9), (log1[-2000:], log2[-2000:])
    assert resumed == 0, log3[-3000:]
    record = json.loads((run_dir / "run.json").read_text())
    assert [r["from"] for r in record["resumed"]] == [str(run_dir / "checkpoint-3")] * 2
    assert_equals_the_reference(run_dir, fault_runs["reference"], MAX_STEPS, TRAIN_KEYS)


@pytest.mark.slow
def test_sft_killed_mid_step_then_resumed_equals_the_uninterrupted_run(fault_runs):
    run_dir = fault_runs["root"] / "sft"
    (killed, log1), (resumed, log2) = fault_runs["runs"]["sft"]
    assert killed == -9, log1[-3000:]
    assert resumed == 0, log2[-3000:]
    assert json.loads((run_dir / "run.json").read_text())["resumed"][0]["from"] == str(run_dir / "checkpoint-2")
    assert_equals_the_reference(run_dir, fault_runs["root"] / "sft-reference", 4, ("loss", "grad_norm"))


# ------------------------------------------------------------------------------------------ bad input


def one_line_error(capsys, argv: list[str]) -> str:
    status = cli.main(argv)
    err = capsys.readouterr().err
    assert status == 2, err[-2000:]
    messages = [line for line in err.splitlines() if "gtpo: error: " in line]
    assert len(messages) == 1 and "Traceback" not in err, err[-2000:]
    return messages[0]


def finished_run(run_dir: Path) -> Path:
    """A run folder as a finished `gtpo train` leaves it (enough of it for the refusal)."""
    (run_dir / "model").mkdir(parents=True)
    runfolder.write_json(run_dir / "run.json", {"command": ["gtpo", "train"], "status": "finished"})
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "time": 0.1, "loss": 0.5}\n')
    return run_dir


def incomplete_checkpoint(run_dir: Path, step: int) -> Path:
    path = run_dir / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "gtpo_state.json").write_text('{"initial_entropy": 1.0}')
    return path


# (id, arrange(tmp) -> extra argv, words the one line must contain, folder that must not exist afterwards)
BAD_TRAIN_INPUTS = [
    ("output-dir-is-a-file",
     lambda t: (t / "f").write_text("x") and ["--output_dir", str(t / "f")],
     ["is a file", "--output_dir"], None),
    ("output-dir-under-a-file",
     lambda t: (t / "f").write_text("x") and ["--output_dir", str(t / "f" / "run")],
     ["is a file", "f"], None),
    ("hub-name-that-does-not-exist",
     lambda t: ["--model_name_or_path", "smollm", "--output_dir", str(t / "run")],
     ["'smollm'", "smollm2", "tiny"], "run"),
    ("dtype-float33",
     lambda t: ["--dtype", "float33", "--output_dir", str(t / "run")],
     ["--dtype", "float33", "float32"], "run"),
    ("max-steps-negative",
     lambda t: ["--max_steps", "-3", "--output_dir", str(t / "run")],
     ["--max_steps -3", "-1"], "run"),
    ("max-steps-zero",
     lambda t: ["--max_steps", "0", "--output_dir", str(t / "run")],
     ["--max_steps 0", "positive"], "run"),
    ("finished-folder-reused",
     lambda t: ["--output_dir", str(finished_run(t / "done"))],
     ["already holds a run", "finished", "--resume_from_checkpoint last", "--overwrite_output_dir true"], None),
    ("resume-last-without-output-dir",
     lambda t: ["--resume_from_checkpoint", "last"],
     ["give --output_dir"], None),
    ("resume-true-without-a-checkpoint",
     lambda t: ["--resume_from_checkpoint", "true", "--output_dir", str(finished_run(t / "done"))],
     ["no complete checkpoint", "done"], None),
    ("resume-from-incomplete-checkpoint",
     lambda t: ["--resume_from_checkpoint", str(incomplete_checkpoint(t / "r", 4))],
     ["checkpoint-4", "trainer_state.json", "last"], None),
    ("resume-and-overwrite",
     lambda t: ["--resume_from_checkpoint", "last", "--overwrite_output_dir", "true", "--output_dir", str(t / "run")],
     ["contradict"], "run"),
]  # fmt: skip


@pytest.mark.parametrize(
    "arrange, words, absent", [c[1:] for c in BAD_TRAIN_INPUTS], ids=[c[0] for c in BAD_TRAIN_INPUTS]
)
def test_bad_train_input_is_one_line_and_leaves_no_run_folder(
    arrange, words, absent, tmp_path, tiny_model_path, capsys, monkeypatch
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = ["train", "--model_name_or_path", tiny_model_path, "--max_steps", "2"] + arrange(tmp_path)
    message = one_line_error(capsys, argv)
    for word in words:
        assert word in message, (word, message)
    if absent:
        assert not (tmp_path / absent).exists()


def test_resume_into_another_folder_names_the_checkpoints_own(tmp_path, tiny_model_path, capsys):
    done = finished_run(tmp_path / "done")
    (done / "checkpoint-1").mkdir()
    runfolder.write_json(done / "checkpoint-1" / "trainer_state.json", {"global_step": 1})
    (done / "checkpoint-1" / "adapter_model.safetensors").write_bytes(b"x")
    argv = ["train", "--model_name_or_path", tiny_model_path, "--resume_from_checkpoint", str(done / "checkpoint-1"),
            "--output_dir", str(tmp_path / "other")]  # fmt: skip
    message = one_line_error(capsys, argv)
    assert f"--output_dir {done}" in message and "drop --output_dir" in message
    assert not (tmp_path / "other").exists()


def test_a_full_disk_at_the_start_is_one_line_and_leaves_no_folder(tmp_path, tiny_model_path, capsys, monkeypatch):
    def full(path, value):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(runfolder, "write_json", full)
    message = one_line_error(
        capsys, ["train", "--model_name_or_path", tiny_model_path, "--output_dir", str(tmp_path / "run")]
    )
    assert "no space left" in message and "run.json" in message and "--output_dir" in message
    assert not (tmp_path / "run").exists()


def test_a_full_disk_mid_run_is_one_line_and_marks_the_run_failed(tmp_path, tiny_model_path, capsys, monkeypatch):
    import transformers

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", "checkpoint-1/optimizer.pt")

    monkeypatch.setattr(transformers.Trainer, "_save_checkpoint", full)
    run_dir = tmp_path / "run"
    argv = ["train", "--model_name_or_path", tiny_model_path, "--dtype", "float32", "--max_steps", "2",
            "--num_generations", "2", "--per_device_train_batch_size", "2", "--max_completion_length", "4",
            "--initial_entropy", "1.0", "--num_examples", "4", "--save_strategy", "steps", "--save_steps", "1",
            "--disable_tqdm", "true", "--output_dir", str(run_dir)]  # fmt: skip
    message = one_line_error(capsys, argv)
    assert "no space left" in message and "checkpoint-1/optimizer.pt" in message
    assert runfolder.run_status(run_dir) == "failed"
    assert "No space left on device" in json.loads((run_dir / "run.json").read_text())["error"]


def test_a_folder_that_cannot_be_made_is_one_line(tmp_path, tiny_model_path, capsys, monkeypatch):
    real_mkdir = Path.mkdir

    def denied(self, *args, **kwargs):
        if self.name == "run":
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", denied)
    message = one_line_error(
        capsys, ["train", "--model_name_or_path", tiny_model_path, "--output_dir", str(tmp_path / "run")]
    )
    assert "permission denied" in message and str(tmp_path / "run") in message


def run_with_metrics(tmp: Path, text: str | None) -> str:
    """A run folder whose metrics.jsonl holds ``text`` (no file when None); its path as an argument."""
    (tmp / "r").mkdir()
    if text is not None:
        (tmp / "r" / "metrics.jsonl").write_text(text)
    return str(tmp / "r")


def a_file(path: Path) -> str:
    path.write_text("x")
    return str(path)


BAD_PLOT_INPUTS = [
    ("empty-metrics", lambda t: [run_with_metrics(t, "")], ["no logged step", "r"]),
    ("rows-are-arrays", lambda t: [run_with_metrics(t, "[1, 2]\n[3]\n")], ["metrics.jsonl:1", "'step'"]),
    ("no-metrics-file", lambda t: [run_with_metrics(t, None)], ["no metrics.jsonl"]),
    (
        "output-is-a-file",
        lambda t: [run_with_metrics(t, '{"step": 1, "reward": 1.0}\n'), "-o", a_file(t / "o")],
        ["is a file", "-o"],
    ),
]


@pytest.mark.parametrize("arrange, words", [c[1:] for c in BAD_PLOT_INPUTS], ids=[c[0] for c in BAD_PLOT_INPUTS])
def test_bad_plot_input_is_one_line(arrange, words, tmp_path, capsys):
    message = one_line_error(capsys, ["plot"] + arrange(tmp_path))
    for word in words:
        assert word in message, (word, message)


def test_sft_refuses_a_folder_that_holds_a_run(tmp_path, tiny_model_path, capsys):
    run_dir = finished_run(tmp_path / "done")
    message = one_line_error(capsys, ["sft", "--model_name_or_path", tiny_model_path, "--output_dir", str(run_dir)])
    assert "already holds a run" in message


# ------------------------------------------------------------------------------------------ units


def test_latest_checkpoint_skips_incomplete_ones_newest_first(tmp_path):
    run_dir = tmp_path / "run"
    runfolder.write_json(run_dir.mkdir() or run_dir / "run.json", {"args": {"GTPOConfig": {"algorithm": "gtpo"}}})

    def checkpoint(step, state=True, weights=True, gtpo=True, torn=False):
        path = run_dir / f"checkpoint-{step}"
        path.mkdir()
        if state:
            (path / "trainer_state.json").write_text('{"global_step": 1' if torn else f'{{"global_step": {step}}}')
        if weights:
            (path / "adapter_model.safetensors").write_bytes(b"w")
        if gtpo:
            (path / "gtpo_state.json").write_text('{"initial_entropy": 1.0}')

    checkpoint(2)
    checkpoint(10)  # numeric order, not text order: 10 > 9 > 2
    checkpoint(11, state=False)
    checkpoint(12, weights=False)
    checkpoint(13, gtpo=False)  # a GTPO run's checkpoint without GTPO's state
    checkpoint(14, torn=True)
    assert runfolder.latest_checkpoint(run_dir) == run_dir / "checkpoint-10"
    assert runfolder.checkpoint_problem(run_dir / "checkpoint-13", gtpo_state=False) is None  # e.g. a GRPO run
    assert runfolder.latest_checkpoint(tmp_path / "missing") is None


def test_run_status_of_each_record(tmp_path):
    assert runfolder.run_status(tmp_path) is None
    for status in ("running", "finished", "failed"):
        runfolder.write_json(tmp_path / "run.json", {"status": status})
        assert runfolder.run_status(tmp_path) == status
    runfolder.write_json(tmp_path / "run.json", {"command": ["gtpo", "train"]})  # written before `status` existed
    assert runfolder.run_status(tmp_path) == "failed"
    (tmp_path / "model").mkdir()
    assert runfolder.run_status(tmp_path) == "finished"
    (tmp_path / "run.json").write_text("{")
    with pytest.raises(ValueError, match="run.json"):
        runfolder.run_status(tmp_path)


def rows_text(*rows) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def test_prepare_for_resume_drops_rows_past_the_checkpoint_and_the_summary(tmp_path):
    path = tmp_path / "metrics.jsonl"
    steps = [{"step": s, "time": 0.5 * s, "loss": s} for s in range(1, 6)]
    path.write_text(rows_text(*steps, {"step": 5, "time": 2.6, "train_runtime": 2.6}))
    assert prepare_for_resume(path, 3) == 1.5  # the time of step 3's row: the new rows continue from it
    assert path.read_text() == rows_text(*steps[:3])


@pytest.mark.parametrize(
    "tail, kept",
    [('{"step": 4, "ti', False), ('{"step": 4, "time": 2.0}', True), ("[4", False), ("", False)],
    ids=["torn", "whole-row-without-newline", "torn-array", "clean-end"],
)
def test_prepare_for_resume_cuts_a_torn_last_line_and_keeps_a_whole_one(tail, kept, tmp_path):
    path = tmp_path / "metrics.jsonl"
    head = rows_text({"step": 1, "time": 1.0}, {"step": 2, "time": 1.5})
    path.write_text(head + tail)
    prepare_for_resume(path, None)
    assert path.read_text() == head + (tail + "\n" if kept else "")


def plan(tmp_path, output_dir=None, resume=None, max_steps=-1, overwrite=False):
    from types import SimpleNamespace

    args = SimpleNamespace(output_dir=output_dir, resume_from_checkpoint=resume, max_steps=max_steps)
    run_dir = runfolder.plan_run(args, overwrite, tmp_path / "default")
    return run_dir, args


def complete_checkpoint(run_dir: Path, step: int) -> Path:
    path = run_dir / f"checkpoint-{step}"
    path.mkdir(parents=True)
    runfolder.write_json(path / "trainer_state.json", {"global_step": step})
    (path / "adapter_model.safetensors").write_bytes(b"w")
    return path


def test_plan_run_resumes_into_the_checkpoints_own_folder(tmp_path):
    run_dir = finished_run(tmp_path / "run")
    checkpoint = complete_checkpoint(run_dir, 4)
    complete_checkpoint(run_dir, 2)
    incomplete_checkpoint(run_dir, 6)
    planned, args = plan(tmp_path, resume=str(checkpoint))  # no --output_dir: the checkpoint's folder
    assert planned == run_dir and (args.output_dir, args.resume_from_checkpoint) == (str(run_dir), str(checkpoint))
    for word in ("true", "last", "True"):  # the newest complete one; checkpoint-6 is incomplete
        _, args = plan(tmp_path, output_dir=str(run_dir), resume=word)
        assert args.resume_from_checkpoint == str(checkpoint)
    _, args = plan(tmp_path, output_dir=str(tmp_path / "new"), resume="false")
    assert args.resume_from_checkpoint is None
    assert plan(tmp_path)[0] == tmp_path / "default"  # no --output_dir: the default folder
    assert plan(tmp_path, max_steps=-1)[1].max_steps == -1  # -1 keeps TRL's meaning: train num_train_epochs


def test_overwrite_removes_only_what_a_run_wrote(tmp_path):
    run_dir = finished_run(tmp_path / "run")
    complete_checkpoint(run_dir, 2)
    (run_dir / "figures").mkdir()
    (run_dir / "notes.txt").write_text("mine")
    run_dir_planned, _ = plan(tmp_path, output_dir=str(run_dir), overwrite=True)
    runfolder.start_run(run_dir_planned, {"command": ["gtpo", "train"]}, overwrite=True)
    assert sorted(p.name for p in run_dir.iterdir()) == ["notes.txt", "run.json"]
    assert runfolder.run_status(run_dir) == "running"


def test_a_run_that_fails_before_its_first_step_leaves_no_folder(tmp_path, tiny_model_path, capsys, monkeypatch):
    def no_model(model_args, script_name):
        raise ValueError("the model could not be loaded")

    monkeypatch.setattr(policy, "load_policy", no_model)
    message = one_line_error(
        capsys, ["train", "--model_name_or_path", tiny_model_path, "--output_dir", str(tmp_path / "run")]
    )
    assert "could not be loaded" in message
    assert not (tmp_path / "run").exists()
