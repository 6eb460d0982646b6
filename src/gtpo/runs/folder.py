"""Run folders: one run per folder, its status in ``run.json``, and resume from its newest complete checkpoint.

A run folder (``gtpo train|sft --output_dir D``) holds ``run.json`` (the command, the recipe, every
argument, what the numbers depend on (`gtpo.runs.provenance`), and ``status``: ``running`` from the start,
``finished`` once ``model/`` is saved, ``failed`` when the run raised), ``metrics.jsonl``, ``checkpoint-N/``,
``model/`` and ``figures/``.

- A folder that already holds a run is refused, naming the choices: resume it
  (``--resume_from_checkpoint D/checkpoint-N``, or ``true``/``last`` for the newest complete checkpoint in
  ``--output_dir D``), start fresh in another folder, or ``--overwrite_output_dir true``.
- A checkpoint is complete when TRL can resume it: ``trainer_state.json`` (which Trainer writes last) reads
  as JSON, model or adapter weights are present, and, for a GTPO run, GTPO's state
  (``gtpo_state.json``, written before Trainer's files) reads as JSON. A kill between those writes
  leaves an incomplete ``checkpoint-N/``, which :func:`latest_checkpoint` skips with a logged line.
- Resume writes into the folder the checkpoint is in, never into a second one.

>>> from gtpo.runs.folder import latest_checkpoint, run_status
>>> run_status("runs/demo"), latest_checkpoint("runs/demo")  # doctest: +SKIP
('running', PosixPath('runs/demo/checkpoint-30'))
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import re
import shutil
from pathlib import Path

from gtpo.errors import InvalidInput
from gtpo.runs.completions import RECORD_DIR

logger = logging.getLogger(__name__)

RUN_RECORD = "run.json"
RUNNING, FINISHED, FAILED = "running", "finished", "failed"
RESUME_LATEST = ("true", "last")  # `--resume_from_checkpoint true` as in TRL's scripts; `last` reads better
TRAINER_STATE = "trainer_state.json"  # transformers.trainer.TRAINER_STATE_NAME, written last in a checkpoint
GTPO_STATE = "gtpo_state.json"  # gtpo.trainer.initial_entropy.STATE_FILE (not imported: that pulls in torch)
WEIGHTS = (
    "adapter_model.safetensors", "adapter_model.bin", "model.safetensors", "model.safetensors.index.json",
    "pytorch_model.bin", "pytorch_model.bin.index.json",
)  # fmt: skip
# What gtpo and Trainer write into a run folder; `--overwrite_output_dir true` removes these and nothing else.
RUN_OUTPUTS = (RUN_RECORD, "metrics.jsonl", "model", "figures", "README.md", RECORD_DIR)
_CHECKPOINT = re.compile(r"checkpoint-(\d+)")


def utc_timestamp() -> str:
    """Now, in UTC, as ISO 8601 to the second (``2026-11-25T04:20:26+00:00``): every timestamp gtpo writes."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write_json(path: Path, value) -> None:
    """Write ``value`` as JSON so that a kill at any moment leaves the old file or the new one, never half."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value, indent=2, default=str), encoding="utf-8")
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------- status


def read_record(run_dir: str | Path) -> dict | None:
    """``run.json`` of ``run_dir`` as a dict; None when there is none; ValueError naming it when unreadable."""
    path = Path(run_dir) / RUN_RECORD
    if not path.is_file():
        return None
    record = _read_json(path)
    if not isinstance(record, dict):
        raise InvalidInput(f"{path}: not a JSON object; it is written by `gtpo train`, restore it or remove the folder")
    return record


def run_status(run_dir: str | Path) -> str | None:
    """``"running"``, ``"finished"`` or ``"failed"`` from ``run_dir/run.json``; None when there is no run.json.

    A run killed with SIGKILL stays ``"running"``. Records written before ``status`` existed count as
    ``"finished"`` when ``model/`` is there, else ``"failed"``.
    """
    record = read_record(run_dir)
    if record is None:
        return None
    status = record.get("status")
    if status in (RUNNING, FINISHED, FAILED):
        return status
    return FINISHED if (Path(run_dir) / "model").is_dir() else FAILED


def set_status(run_dir: str | Path, status: str, error: str | None = None) -> None:
    """Record ``status`` (with the time it ended, and the error of a failed run) in ``run_dir/run.json``."""
    record = read_record(run_dir) or {}
    record["status"] = status
    if status in (FINISHED, FAILED):
        record[status] = utc_timestamp()
    if error:
        record["error"] = error
    write_json(Path(run_dir) / RUN_RECORD, record)


# ------------------------------------------------------------------------------------------- checkpoints


def _expects_gtpo_state(run_dir: Path) -> bool:
    try:
        record = read_record(run_dir) or {}
    except ValueError:
        return False
    return (record.get("args", {}).get("GTPOConfig") or {}).get("algorithm") == "gtpo"


def checkpoint_problem(checkpoint: str | Path, gtpo_state: bool | None = None) -> str | None:
    """Why TRL could not resume from ``checkpoint`` (a phrase), or None when it is complete.

    ``gtpo_state``: whether GTPO's state file is required (default: when the run folder's run.json says
    algorithm gtpo).
    """
    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        return "it is not a directory"
    if not isinstance(_read_json(checkpoint / TRAINER_STATE), dict):
        return f"{TRAINER_STATE} is missing or unreadable (the save was interrupted)"
    sharded = any(checkpoint.glob("global_step*")) or any(checkpoint.glob("pytorch_model_fsdp*"))
    if not sharded and not any((checkpoint / name).is_file() for name in WEIGHTS):
        return "it holds no model or adapter weights"
    if gtpo_state is None:
        gtpo_state = _expects_gtpo_state(checkpoint.parent)
    state_path = checkpoint / GTPO_STATE
    if (gtpo_state or state_path.exists()) and not isinstance(_read_json(state_path), dict):
        return f"GTPO's {GTPO_STATE} is missing or unreadable"
    return None


def checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Every ``checkpoint-N`` folder of ``run_dir`` as (N, path), newest first, complete or not."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in run_dir.iterdir() if p.is_dir() and (m := _CHECKPOINT.fullmatch(p.name))]
    return sorted(found, reverse=True)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of ``run_dir`` (see :func:`checkpoint_problem`), or None."""
    gtpo_state = _expects_gtpo_state(Path(run_dir))
    for _, path in checkpoints(run_dir):
        problem = checkpoint_problem(path, gtpo_state)
        if problem is None:
            return path
        logger.info("skipping incomplete checkpoint %s: %s", path, problem)
    return None


# ------------------------------------------------------------------------------------------- opening a run


def _has_run(run_dir: Path) -> bool:
    return (run_dir / RUN_RECORD).exists() or (run_dir / "metrics.jsonl").exists() or bool(checkpoints(run_dir))


def _check_writable(run_dir: Path, flag: str) -> None:
    if run_dir.exists() and not run_dir.is_dir():
        raise InvalidInput(f"{flag} {run_dir} is a file, not a folder: give a folder path for the run")
    parent = run_dir
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise InvalidInput(f"{flag} {run_dir}: {parent} is a file, so no folder can be made there; give another path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InvalidInput(f"{flag} {run_dir}: {parent} is not writable; give a folder you can write to")


def _refusal(run_dir: Path) -> str:
    try:
        status = run_status(run_dir) or "unknown"
    except ValueError:
        status = "unreadable"
    return (
        f"--output_dir {run_dir} already holds a run (status: {status}); a run folder belongs to one run. "
        f"Resume it with --resume_from_checkpoint last (or a {run_dir}/checkpoint-N), start fresh with another "
        f"--output_dir, or replace it with --overwrite_output_dir true"
    )


def plan_run(training_args, overwrite: bool, default_dir: Path, main_process: bool = True) -> Path:
    """Decide the run folder and the checkpoint to resume from, and refuse what would mix two runs.

    Sets ``training_args.output_dir`` (``default_dir`` when none was given, the checkpoint's folder when
    resuming from a checkpoint path) and ``training_args.resume_from_checkpoint`` (a checkpoint path, or
    None). Creates nothing. Raises ValueError with a one-line message naming the flag and the fix.
    Only ``main_process`` checks the folder's contents (other ranks would see what rank 0 just wrote).
    """
    steps = training_args.max_steps
    if steps == 0 or steps < -1:
        raise InvalidInput(
            f"--max_steps {steps}: give a positive number of optimizer steps, or -1 to train for num_train_epochs"
        )
    given = training_args.output_dir not in (None, "", "trainer_output")  # transformers' default when unset
    run_dir = Path(training_args.output_dir) if given else Path(default_dir)
    resume = training_args.resume_from_checkpoint
    resume = None if resume in (None, "", False) or str(resume).lower() in ("false", "none") else str(resume)
    if resume is not None and overwrite:
        raise InvalidInput("--resume_from_checkpoint and --overwrite_output_dir true contradict each other: give one")

    if resume is not None and resume.lower() in RESUME_LATEST:
        if not given:
            raise InvalidInput(
                f"--resume_from_checkpoint {resume} resumes the newest complete checkpoint of --output_dir: "
                f"give --output_dir RUN_DIR (the folder of the run to resume)"
            )
        checkpoint = latest_checkpoint(run_dir)
        if checkpoint is None:
            raise InvalidInput(
                f"--resume_from_checkpoint {resume}: {run_dir} has no complete checkpoint-N folder to resume "
                f"(--save_strategy steps --save_steps N writes them); start fresh with another --output_dir "
                f"or --overwrite_output_dir true"
            )
        resume = str(checkpoint)
    elif resume is not None:
        checkpoint = Path(resume)
        problem = checkpoint_problem(checkpoint)
        if problem is not None:
            hint = f"; --resume_from_checkpoint last picks the newest complete one in {checkpoint.parent}"
            raise InvalidInput(f"--resume_from_checkpoint {resume}: cannot resume from it, {problem}{hint}")
        home = checkpoint.parent
        if not given:
            run_dir = home
        elif run_dir.resolve() != home.resolve() and (home / RUN_RECORD).exists():
            raise InvalidInput(
                f"--resume_from_checkpoint {resume} belongs to the run in {home}; a resumed run writes into its own "
                f"folder: drop --output_dir or give --output_dir {home}"
            )
    _check_writable(run_dir, "--output_dir")
    if resume is None and main_process and _has_run(run_dir) and not overwrite:
        raise InvalidInput(_refusal(run_dir))
    training_args.output_dir = str(run_dir)
    training_args.resume_from_checkpoint = resume
    return run_dir


def start_run(run_dir: Path, record: dict, overwrite: bool = False, resume: str | None = None) -> None:
    """Make the run folder and write its run.json with status ``running``.

    ``overwrite`` first removes what an earlier run wrote (:data:`RUN_OUTPUTS` and ``checkpoint-N``).
    ``resume``: the checkpoint this run resumes from; the folder's record is kept and the resume is
    appended to its ``resumed`` list. If the folder cannot be written (a full disk), a folder made here is
    removed again, so a run that never started leaves nothing behind.
    """
    existed = run_dir.exists()
    try:
        if overwrite:
            for _, path in checkpoints(run_dir):
                shutil.rmtree(path)
            for name in RUN_OUTPUTS:
                path = run_dir / name
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink(missing_ok=True)
        run_dir.mkdir(parents=True, exist_ok=True)
        old = read_record(run_dir) if resume else None
        if old is not None:
            old.setdefault("resumed", []).append(
                {"from": resume, "command": record.get("command"), "at": utc_timestamp(),
                 **{key: record[key] for key in ("code", "versions", "machine") if key in record}}
            )  # fmt: skip
            for key in (FINISHED, FAILED, "error"):
                old.pop(key, None)
            record = old
        record["status"] = RUNNING
        write_json(run_dir / RUN_RECORD, record)
    except OSError:
        if not existed:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise


def _never_started(run_dir: Path) -> bool:
    """True for a fresh run folder holding only its run.json: nothing was logged, saved or resumed."""
    try:
        names = {p.name for p in run_dir.iterdir()}
        record = read_record(run_dir) or {}
    except (OSError, ValueError):
        return False
    return names <= {RUN_RECORD, f".{RUN_RECORD}.tmp"} and not record.get("resumed")


@contextlib.contextmanager
def recording_status(run_dir: Path, main_process: bool = True):
    """Around a run's training and final save: run.json says ``finished`` when the block completes,
    ``failed`` (with the error) when it raises. A SIGKILL leaves ``running``."""
    try:
        yield
    except BaseException as err:
        if main_process and _never_started(run_dir):
            shutil.rmtree(run_dir, ignore_errors=True)  # e.g. the model failed to load: leave nothing behind
        elif main_process:
            try:
                set_status(run_dir, FAILED, error=f"{type(err).__name__}: {err}"[:500])
            except OSError as write_err:  # e.g. the disk that made the run fail is still full
                logger.warning("could not record the failure in %s: %s", run_dir / RUN_RECORD, write_err)
        raise
    if main_process:
        set_status(run_dir, FINISHED)


def train(trainer, resume: str | None) -> None:
    """``trainer.train(resume_from_checkpoint=resume)``; when the checkpoint already reached ``max_steps``
    (a run killed after its last save), its weights are loaded instead: transformers 5.23 would train one
    step past ``max_steps`` there."""
    state = _read_json(Path(resume) / TRAINER_STATE) if resume else None
    max_steps = trainer.args.max_steps
    if isinstance(state, dict) and max_steps > 0 and state.get("global_step", 0) >= max_steps:
        logger.info(
            "%s is at step %s = max_steps: nothing left to train, its weights become the model",
            resume,
            state["global_step"],
        )
        trainer._load_from_checkpoint(resume)
        trainer.state.global_step = state["global_step"]
        metrics = Path(trainer.args.output_dir) / "metrics.jsonl"
        if trainer.is_world_process_zero() and metrics.is_file():
            from gtpo.runs.metrics_log import prepare_for_resume

            prepare_for_resume(metrics, None)  # only cut a torn last line: every step is already logged
        return
    trainer.train(resume_from_checkpoint=resume)
