"""Fault injection for `gtpo eval`: kill -9 at chosen points, resume, and compare with an uninterrupted run;
then the bad inputs of issue 10 as a table, each one line on stderr and exit 2.

The kills are real SIGKILLs (no clean-up handler, no atexit runs) delivered by the eval process to itself at
an exact point, so every case is deterministic: inside a generate call after a few decoding steps, in the
middle of writing a batch of records, after a batch written without its last newline, and while writing
results.json. One more kill comes from outside at whatever moment the run has reached. The resumed
run's samples.jsonl must hold exactly the uninterrupted run's records.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gtpo.cli import main as gtpo_main
from gtpo.eval.runner import RESULTS_FILE, RUN_FILE, SAMPLES_FILE, read_records

N, LIMIT, BATCH, TOKENS = 4, 3, 4, 6  # 12 samples in batches of 4, 4, 4 (batches hold whole problems)

# A fresh interpreter that imports everything once, then forks one child per fault line on stdin: the child
# installs the fault and runs `gtpo eval` as a user would; the parent prints how it ended. Forking skips the
# 5-7 s of imports per run; nothing has run a torch op before the fork, so no thread pool is inherited.
DRIVER = r"""
import json, os, signal, sys
import torch, transformers, datasets, tqdm.auto  # noqa: F401 - imported once, before any fork
# transformers imports lazily: these are the seconds a tiny-model eval spends importing
from transformers import (AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaForCausalLM,  # noqa: F401
                          LogitsProcessor, TemperatureLogitsWarper)
import transformers.generation.utils  # noqa: F401
from gtpo import cli, models
from gtpo.tasks import registry as data
from gtpo.eval import backends, runner

def die():
    os.kill(os.getpid(), signal.SIGKILL)

def install(fault):
    calls = {"generate": 0, "append": 0}
    if fault["at"] == "generate":  # inside the n-th generate call, after `step` decoding steps
        original_sampler = backends.per_row_sampler
        def sampler(seeds, sampling, device):
            calls["generate"] += 1
            inner = original_sampler(seeds, sampling, device)
            if calls["generate"] != fault["call"]:
                return inner
            class Dying(LogitsProcessor):
                steps = 0
                def __call__(self, input_ids, scores):
                    Dying.steps += 1
                    if Dying.steps == fault["step"]:
                        die()
                    return inner(input_ids, scores)
            return Dying()
        backends.per_row_sampler = sampler
    elif fault["at"] == "append":  # while writing the n-th batch: part of its bytes reach the file
        original_append = runner.append_records
        def append(path, records):
            calls["append"] += 1
            if calls["append"] != fault["call"]:
                return original_append(path, records)
            data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()
            data = data[: len(data) // 2] if fault["cut"] == "half" else data[:-1]  # mid-record / no last newline
            with open(path, "ab") as f:
                f.write(data); f.flush(); os.fsync(f.fileno())
            die()
        runner.append_records = append
    elif fault["at"] == "results":  # results.json half written to its temporary file
        original_write = runner.write_json_atomic
        def write(path, payload):
            if path.name != "results.json":
                return original_write(path, payload)
            path.with_suffix(".json.tmp").write_text(json.dumps(payload)[:50])
            die()
        runner.write_json_atomic = write

for line in sys.stdin:
    fault, argv = json.loads(line)
    pid = os.fork()
    if pid == 0:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1); os.dup2(devnull, 2)
        install(fault)
        code = 1
        try:
            code = cli.main(argv)
        finally:
            os._exit(code or 0)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                      "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None}), flush=True)
"""


def _eval_argv(source: str, output_dir: Path) -> list[str]:
    return [
        "eval",
        "--model",
        "tiny",
        "--task",
        "gsm8k",
        "--source",
        source,
        "-n",
        str(N),
        "--limit",
        str(LIMIT),
        "--batch-size",
        str(BATCH),
        "--max-new-tokens",
        str(TOKENS),
        "--output-dir",
        str(output_dir),
        "--no-progress",
        "--seed",
        "7",
    ]


def _env() -> dict:
    # The same thread settings as this process: the reference run is computed here.
    return dict(os.environ, PYTHONWARNINGS="ignore")


class FaultDriver:
    def __init__(self):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", DRIVER], env=_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def killed_run(self, fault: dict, argv: list[str]) -> None:
        self.proc.stdin.write(json.dumps([fault, argv]) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the fault driver died (exit {self.proc.wait()})"
        ended = json.loads(line)
        # SIGKILL: the run died at the injected point; an exit status would mean the point was never reached.
        assert ended["signal"] == signal.SIGKILL, f"fault {fault} not injected: {ended}"

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _by_key(records):
    return sorted(records, key=lambda r: (str(r["problem_id"]), r["sample_index"]))


@pytest.fixture(scope="module")
def source(shared_data) -> str:
    return str(shared_data / "gsm8k" / "test.jsonl")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, source):
    out = tmp_path_factory.mktemp("uninterrupted")
    assert gtpo_main(_eval_argv(source, out)) == 0
    records = read_records(out / "gsm8k" / SAMPLES_FILE)
    assert len(records) == N * LIMIT
    return records, json.loads((out / "gsm8k" / RESULTS_FILE).read_text()), out


@pytest.mark.slow
def test_kill_9_at_five_points_then_resume_gives_the_uninterrupted_samples(tmp_path, source, uninterrupted):
    reference, reference_results, _ = uninterrupted
    out = tmp_path / "eval"
    run_dir = out / "gsm8k"
    argv = _eval_argv(source, out)
    # (fault, fewest and most complete records on disk after the kill)
    faults = [
        ({"at": "generate", "call": 1, "step": 3}, 0, 0),  # mid-batch, before the first sample: only run.json
        ({"at": "append", "call": 1, "cut": "half"}, 1, BATCH - 1),  # batch 1 half written: a torn record last
        ({"at": "generate", "call": 2, "step": 4}, BATCH, BATCH),  # batch 1 regenerated whole; killed mid-batch 2
        ({"at": "append", "call": 1, "cut": "newline"}, 2 * BATCH, 2 * BATCH),  # batch 2 lacks its last newline
        ({"at": "results", "call": 1}, N * LIMIT, N * LIMIT),  # every sample written, results.json torn
    ]
    driver = FaultDriver()
    for fault, fewest, most in faults:
        driver.killed_run(fault, argv)
        assert (run_dir / RUN_FILE).is_file()
        # what survived the kill: every complete record, never a torn one (read_records repairs the tail)
        survived = read_records(run_dir / SAMPLES_FILE)
        assert fewest <= len(survived) <= most, fault
        assert all(r in reference for r in survived), f"a record written before the kill at {fault} differs"
    driver.close()
    assert not (run_dir / RESULTS_FILE).exists()
    assert gtpo_main(argv) == 0  # the last resume, in this process
    records = read_records(run_dir / SAMPLES_FILE)
    assert _by_key(records) == _by_key(reference)
    assert len({(r["problem_id"], r["sample_index"]) for r in records}) == len(records)  # each sample once
    results = json.loads((run_dir / RESULTS_FILE).read_text())
    assert results["pass@k"] == reference_results["pass@k"] and results["maj@k"] == reference_results["maj@k"]
    # run.json shows every resume: the four killed invocations after the first and the last one, each with the
    # samples recorded when it started (what the kill before it left; the last one found them all, no results)
    resumes = json.loads((run_dir / RUN_FILE).read_text())["resumes"]
    done = [r["samples_done"] for r in resumes]
    assert len(done) == len(faults) and all(r["samples_total"] == N * LIMIT for r in resumes)
    assert done[0] == 0 and 1 <= done[1] <= BATCH - 1 and done[2:] == [BATCH, 2 * BATCH, N * LIMIT]
    assert [r["at"] for r in resumes] == sorted(r["at"] for r in resumes)


@pytest.mark.slow
def test_kill_9_from_outside_while_sampling_then_resume_gives_the_uninterrupted_samples(
    tmp_path, source, uninterrupted
):
    reference, _, _ = uninterrupted
    out = tmp_path / "eval"
    samples = out / "gsm8k" / SAMPLES_FILE
    argv = _eval_argv(source, out)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gtpo.cli", *argv], env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:  # wait for the first written batch
        if samples.exists() and samples.stat().st_size > 0:
            break
        time.sleep(0.02)
    killed = proc.poll() is None
    proc.kill()
    proc.wait(timeout=60)
    assert killed, "the run finished before it could be killed"
    assert gtpo_main(argv) == 0
    assert _by_key(read_records(samples)) == _by_key(reference)


# ------------------------------------------------------------------------------ bad inputs: one line, exit 2


def _write(path: Path, text: str | bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


GSM8K_ROW = json.dumps({"question": "What is 2 + 3?", "answer": "2 + 3 = 5\n#### 5"})


def _bad_inputs(tmp: Path, source: str):
    """(case, argv, strings the one-line message must contain, path that must not exist afterwards)."""
    run = ["--model", "tiny", "--task", "gsm8k", "-n", "1", "--limit", "1", "--max-new-tokens", "2", "--no-progress"]
    a_file = _write(tmp / "a_file", "x")
    arrays = _write(tmp / "arrays.jsonl", '["a", "b"]\n')
    bad_json = _write(tmp / "bad.jsonl", GSM8K_ROW + '\n{"question": "x"\n')
    no_answer = _write(tmp / "no_answer.jsonl", GSM8K_ROW + '\n{"question": "x"}\n')
    results = _write(tmp / "plots_in" / RESULTS_FILE, '{"task": ')
    return [
        (
            "output dir is a file",
            ["eval", *run, "--source", source, "--output-dir", a_file],
            ["--output_dir", "a_file is a file"],
            None,
        ),
        (
            "output dir cannot be created",
            ["eval", *run, "--source", source, "--output-dir", "/proc/gtpo-no"],
            ["--output_dir", "cannot create /proc/gtpo-no"],
            None,
        ),
        (
            "unknown hub model",
            ["eval", *run[2:], "--model", "smollm", "--source", source, "--output-dir", str(tmp / "o1")],
            ["--model 'smollm'", "'smollm2'"],
            tmp / "o1",
        ),
        (
            "dataset rows are arrays",
            ["eval", *run, "--source", arrays, "--output-dir", str(tmp / "o2")],
            [f"{arrays}:1", "JSON object"],
            tmp / "o2",
        ),
        (
            "dataset line is not JSON",
            ["eval", *run, "--source", bad_json, "--output-dir", str(tmp / "o3"), "--limit", "2"],
            [f"{bad_json}:2", "not valid JSON"],
            tmp / "o3",
        ),
        (
            "dataset row without an answer",
            ["eval", *run, "--source", no_answer, "--output-dir", str(tmp / "o4"), "--limit", "2"],
            [no_answer, "row 2", "'answer'"],
            tmp / "o4",
        ),
        (
            "bad dtype",
            ["eval", *run, "--source", source, "--dtype", "float33", "--output-dir", str(tmp / "o5")],
            ["--dtype", "'float33'", "bfloat16"],
            tmp / "o5",
        ),
        (
            "zero samples",
            ["eval", *run, "--source", source, "-n", "0", "--output-dir", str(tmp / "o6")],
            ["-n", "got 0"],
            tmp / "o6",
        ),
        (
            "results.json is not JSON",
            ["eval-plot", results, "-o", str(tmp / "fig.png")],
            [f"{results}:1", "not valid JSON"],
            tmp / "fig.png",
        ),
    ]


@pytest.mark.parametrize("case", range(9), ids=lambda i: f"case{i}")
def test_bad_input_is_one_line_naming_where_and_exit_2(tmp_path, source, capsys, case):
    name, argv, needles, absent = _bad_inputs(tmp_path, source)[case]
    code = gtpo_main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, name
    assert len(err.splitlines()) == 1 and err.startswith("gtpo: error: "), f"{name}: {err}"
    for needle in needles:
        assert needle in err, f"{name}: {needle!r} not in {err!r}"
    assert absent is None or not Path(absent).exists(), f"{name} left {absent} behind"


def test_a_bom_dataset_evaluates_like_the_same_file_without_it(tmp_path, source, capsys):
    plain = _write(tmp_path / "plain.jsonl", GSM8K_ROW + "\n")
    bom = _write(tmp_path / "bom.jsonl", b"\xef\xbb\xbf" + GSM8K_ROW.encode() + b"\n")
    outputs = []
    for name, path in (("plain", plain), ("bom", bom)):
        argv = [
            "eval",
            "--model",
            "tiny",
            "--task",
            "gsm8k",
            "--source",
            path,
            "-n",
            "2",
            "--max-new-tokens",
            "3",
            "--no-progress",
            "--output-dir",
            str(tmp_path / name),
        ]
        assert gtpo_main(argv) == 0
        outputs.append([r["text"] for r in read_records(tmp_path / name / "gsm8k" / SAMPLES_FILE)])
    assert outputs[0] == outputs[1]


def test_few_shot_0_resumes_a_gsm8k_run_started_with_the_default(tmp_path, source, capsys):
    base = [
        "eval",
        "--model",
        "tiny",
        "--task",
        "gsm8k",
        "--source",
        source,
        "-n",
        "1",
        "--max-new-tokens",
        "2",
        "--no-progress",
        "--output-dir",
        str(tmp_path),
    ]
    assert gtpo_main([*base, "--limit", "1"]) == 0
    assert gtpo_main([*base, "--limit", "2", "--few-shot", "0"]) == 0  # GSM8K's default is 0 worked examples
    assert gtpo_main([*base, "--limit", "2", "--few-shot", "1"]) == 2  # a real difference is still refused
    assert "few_shot: recorded 0, now 1" in capsys.readouterr().err


def test_eval_plot_prints_the_path_it_wrote(tmp_path, uninterrupted, capsys):
    out = uninterrupted[2]
    assert gtpo_main(["eval-plot", str(out), "-o", str(tmp_path / "plots" / "e8")]) == 0
    printed = capsys.readouterr().out.strip().removeprefix("wrote ")
    assert Path(printed).is_file() and printed == str(tmp_path / "plots" / "e8.png")


def test_a_full_disk_is_one_line_and_the_rerun_equals_the_uninterrupted_run(
    tmp_path, source, uninterrupted, capsys, monkeypatch
):
    # ENOSPC surfaces at write or fsync; fsync of the second batch fails here, as on a full disk.
    from gtpo.eval import runner

    reference = uninterrupted[0]
    real_fsync, calls = runner.os.fsync, {"n": 0}

    def fsync(fd):
        calls["n"] += 1
        if calls["n"] == 2:  # call 1: batch 1; call 2: batch 2 (run.json is replaced atomically, no fsync)
            raise OSError(28, "No space left on device")
        return real_fsync(fd)

    argv = _eval_argv(source, tmp_path)
    monkeypatch.setattr(runner.os, "fsync", fsync)
    assert gtpo_main(argv) == 2
    err = capsys.readouterr().err.strip()
    last = err.splitlines()[-1]  # transformers' "Loading weights" bar comes before it on stderr
    assert "Traceback" not in err and last.startswith("gtpo: error: ")
    assert "No space left on device" in last and SAMPLES_FILE in last and "re-run" in last
    monkeypatch.setattr(runner.os, "fsync", real_fsync)
    assert gtpo_main(argv) == 0
    assert _by_key(read_records(tmp_path / "gsm8k" / SAMPLES_FILE)) == _by_key(reference)
