"""Every command's data-bound cost as its work grows: time, peak memory and the growth exponent between sizes.

Run by hand (not in CI):  .venv/bin/python benchmarks/bench_scale.py  [--only CASE ...] [--json OUT.json]

Each (case, size) runs in a fresh child process (cold caches, its own peak RSS from ``ru_maxrss``), on data
generated here; the parent prints one table. The exponent of a size against the case's first size is
log(t2/t1) / log(w2/w1), w the work (samples, steps, runs x steps, tokens): about 1 is linear, below 1 means a
fixed cost still dominates, and above ~1.2 is a cost that grows faster than its work. Cases:

- eval-grade: grading n samples of P problems (extract + is_equivalent against the gold, as `gtpo eval` does
  per sample), then pass@k / maj@k over them (`summarize_records`, fingerprints on). Answers: per problem a mix
  of integers, decimals and two distinct LaTeX surds (the shapes that made pairwise maj@k quadratic).
- maj-worst: maj@k grouping alone where every answer is distinct LaTeX (64 distinct answers per problem).
- plot: `gtpo plot` of one run of S logged steps (the full metrics rows of a GTPO run).
- compare: `gtpo compare --aggregate_only` over R finished runs of S steps each (summary + figures).
- eval-resume: `gtpo eval` re-run on a complete run folder of N recorded samples (read, check, summarise).
- metrics-log: the training-side metrics logger, one `on_log` per step for S steps.
- inspect: `gtpo inspect --group` of a recorded group of G completions (tiny model: load, entropy, analysis,
  figure).

The machine's load shows in the times (the load average is printed): compare exponents, not absolute times,
across runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GTPO = [sys.executable, "-m", "gtpo.cli"]

# case -> [(label, work, parameters)]
SIZES = {
    "eval-grade": [("50 x 8", 400, (50, 8)), ("500 x 8", 4000, (500, 8)), ("500 x 64", 32000, (500, 64))],
    "maj-worst": [("5 x 64 distinct", 320, (5, 64)), ("50 x 64 distinct", 3200, (50, 64))],
    "plot": [("1k steps", 1000, (1000,)), ("10k steps", 10000, (10000,)), ("100k steps", 100000, (100000,))],
    "compare": [
        ("6 runs x 1k", 6000, (6, 1000)),
        ("60 runs x 1k", 60000, (60, 1000)),
        ("6 runs x 10k", 60000, (6, 10000)),
    ],
    "eval-resume": [("3.2k samples", 3200, (400, 8)), ("32k samples", 32000, (500, 64))],
    "metrics-log": [("1k steps", 1000, (1000,)), ("10k steps", 10000, (10000,))],
    "inspect": [("G=8 x 96", 768, (8, 96)), ("G=64 x 96", 6144, (64, 96))],
}


# --------------------------------------------------------------------------------------------- generated data


def answers_for(problem: int, n: int, rng: random.Random) -> tuple[str, list[str]]:
    gold = str(10 + problem % 90)
    surd = rf"{problem % 7 + 2}\sqrt{{{problem % 5 + 2}}}+1"
    fraction = rf"\frac{{{problem + 1}}}{{{problem % 9 + 2}}}"
    pool = [gold, str(int(gold) + 1), f"{gold}.0", str(int(gold) - 3), surd, fraction]
    return gold, [rng.choice(pool) for _ in range(n)]


def metrics_row(step: int) -> dict:
    x = step / 100
    return {"step": step, "time": step * 20.0, "loss": 0.1 * math.sin(x), "reward": 10 + 5 * math.sin(x),
            "rewards/format_reward/mean": 9.0, "rewards/accuracy_reward/mean": 3 + math.cos(x),
            "gtpo/mean_entropy": 0.5 + 0.1 * math.sin(x), "gtpo/conflict_token_frac": 0.2,
            "gtpo/filtered_frac": 0.0, "entropy": 0.5, "grad_norm": 1.0, "learning_rate": 2e-4,
            "completions/mean_length": 80.0, "step_time": 20.0}  # fmt: skip


def write_run(folder: Path, steps: int, template: dict) -> None:
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({**template, "status": "finished"}))
    with open(folder / "metrics.jsonl", "w") as f:
        for step in range(1, steps + 1):
            f.write(json.dumps(metrics_row(step)) + "\n")


# --------------------------------------------------------------------------------------------- the cases


def case_eval_grade(tmp: Path, problems: int, n: int) -> None:
    from gtpo.eval.metrics import summarize_records
    from gtpo.eval.runner import _graders, grade

    extract_answer, is_equivalent = _graders()
    rng = random.Random(0)
    records, golds = [], []
    for p in range(problems):
        gold, answers = answers_for(p, n, rng)
        golds.append(type("Problem", (), {"id": f"p{p}", "gold": gold})())
        for s, answer in enumerate(answers):
            text = f"<reasoning>...</reasoning><answer>{answer}</answer>"
            extracted, correct = grade(text, gold, extract_answer, is_equivalent)
            records.append({"problem_id": f"p{p}", "sample_index": s, "text": text, "answer": extracted,
                            "correct": correct, "length": 20, "truncated": False, "gold": gold})  # fmt: skip
    summarize_records(records, golds, n)


def case_maj_worst(tmp: Path, problems: int, n: int) -> None:
    from gtpo.eval.metrics import group_answers

    for p in range(problems):
        answers = [rf"{a}\sqrt{{{b}}}+{p}" for a in range(2, 10) for b in (2, 3, 5, 6, 7, 10, 11, 13)][:n]
        group_answers(answers, correct=[False] * n)


def case_plot(tmp: Path, steps: int) -> None:
    write_run(tmp / "run", steps, {})
    subprocess.run([*GTPO, "plot", str(tmp / "run"), "-o", str(tmp / "figures")], check=True, capture_output=True)


def case_compare(tmp: Path, runs: int, steps: int) -> None:
    fixture = ROOT / "tests/fixtures/tiny-study"
    template = json.loads((fixture / "runs/gtpo/seed0/run.json").read_text())
    seeds = list(range(runs // 2))
    spec = {"arms": [{"name": "gtpo", "recipe": "r.yaml", "args": []},
                     {"name": "grpo", "recipe": "r.yaml", "args": ["--algorithm", "grpo"]}],
            "seeds": seeds, "common": [], "save_steps": 10, "eval": None}  # fmt: skip
    study = tmp / "study"
    study.mkdir()
    (study / "compare.json").write_text(json.dumps(spec))
    for arm in ("gtpo", "grpo"):
        for seed in seeds:
            write_run(study / "runs" / arm / f"seed{seed}", steps, template)
    subprocess.run([*GTPO, "compare", "--output_dir", str(study), "--aggregate_only"], check=True, capture_output=True)


def case_eval_resume(tmp: Path, problems: int, n: int) -> None:
    """A complete evaluation run folder of problems x n records on a synthetic-task file, evaluated again."""
    from gtpo.eval.runner import EvalConfig, SamplingSettings, evaluate, load_problems

    source = tmp / "problems.jsonl"
    with open(source, "w") as f:
        for p in range(problems):
            f.write(json.dumps({"question": f"What is {p} + 1?", "answer": f"#### {p + 1}"}) + "\n")
    config = EvalConfig(model="tiny", output_dir=tmp / "run", task="gsm8k", split="test", source=str(source),
                        num_samples=n, sampling=SamplingSettings(max_new_tokens=8), progress=False)  # fmt: skip

    class Replay:  # writes the records once; the timed call must not generate anything
        name = "replay"

        def generate(self, prompts, seeds, sampling):
            from gtpo.eval.backends import Completion

            return [Completion(f"<answer>{i % 50}</answer>", 8, False) for i, _ in enumerate(prompts)]

    evaluate(config, backend=Replay())
    assert len(load_problems("gsm8k", "test", str(source), None)) == problems
    start = time.perf_counter()

    class Refuse:
        name = "refuse"

        def generate(self, *args):
            raise AssertionError("a complete evaluation generated again")

    evaluate(config, backend=Refuse())
    print(json.dumps({"inner_seconds": time.perf_counter() - start}))


def case_metrics_log(tmp: Path, steps: int) -> None:
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from gtpo.runs.metrics_log import MetricsLogger

    logger = MetricsLogger(tmp)
    args = TrainingArguments(output_dir=str(tmp), use_cpu=True, report_to=[])
    state, control = TrainerState(), TrainerControl()
    start = time.perf_counter()
    for step in range(1, steps + 1):
        state.global_step = step
        logger.on_log(args, state, control, logs={k: v for k, v in metrics_row(step).items() if k != "step"})
    print(json.dumps({"inner_seconds": time.perf_counter() - start}))


def case_inspect(tmp: Path, completions: int, tokens: int) -> None:
    rng = random.Random(0)
    words = ["the", "sum", "of", "is", "<answer>", "</answer>", "12", "7", "so", "we", "add"]
    group = {"prompt": "What is 5 + 7?", "answer": "12",
             "completions": [" ".join(rng.choice(words) for _ in range(tokens // 2)) for _ in range(completions)],
             "rewards": [float(rng.choice([0, 10, 20])) for _ in range(completions)]}  # fmt: skip
    (tmp / "group.json").write_text(json.dumps(group))
    subprocess.run([*GTPO, "inspect", "--model", "tiny", "--group", str(tmp / "group.json"), "-o", str(tmp / "out"),
                    "--color", "never"], check=True, capture_output=True)  # fmt: skip


# The maj@k cases (one problem's answers, all wrong, as recorded verdicts make them): grouped pairwise
# (today's rule, prefilter=None) and with fingerprints, each in a fresh process, side by side.
MAJ_CASES = {
    "64 distinct surds like 3\\sqrt{47}+5": [rf"{a}\sqrt{{{b}}}+{c}" for a in (2, 3, 5, 7) for b in (2, 3, 47, 11)
                                              for c in (1, 5, 9, 13)],
    "16 distinct slow answers like (x+y+z)^{60}": [rf"(x+y+z)^{{{60 + i}}}" for i in range(16)],
    "6 distinct slow answers": [rf"(x+y+z)^{{{60 + i}}}" for i in range(6)],
    "64 distinct integers and fractions": [str(i) for i in range(32)] + [rf"\frac{{{i}}}{{7}}" for i in range(1, 33)],
}  # fmt: skip


def case_maj_pairs(tmp: Path, which: int, fingerprints: int) -> None:
    from gtpo.eval.metrics import group_answers
    from gtpo.grading import is_equivalent
    from gtpo.grading.fingerprint import AnswerFingerprints

    answers = list(MAJ_CASES.values())[which]
    calls = [0]

    def counting(prediction, gold):
        calls[0] += 1
        return is_equivalent(prediction, gold)

    is_equivalent("1", "2")  # the grading pool's start, not any answer's cost
    is_equivalent("x", "y")
    start = time.perf_counter()
    prefilter = AnswerFingerprints() if fingerprints else None
    classes = group_answers(answers, equivalent=counting, correct=[False] * len(answers), prefilter=prefilter)
    print(json.dumps({"inner_seconds": time.perf_counter() - start, "comparisons": calls[0],
                      "classes": list(classes.labels)}))  # fmt: skip


CASES = {"eval-grade": case_eval_grade, "maj-worst": case_maj_worst, "plot": case_plot, "compare": case_compare,
         "eval-resume": case_eval_resume, "metrics-log": case_metrics_log, "inspect": case_inspect,
         "maj-pairs": case_maj_pairs}  # fmt: skip


# --------------------------------------------------------------------------------------------- driver


def run_child(case: str, params: tuple) -> dict:
    """One (case, size) in a fresh process: wall seconds, the case's own inner seconds if it reports them, and
    the peak RSS of the process and its children."""
    command = [sys.executable, __file__, "--child", case, *map(str, params)]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{case} {params} failed:\n{done.stderr[-2000:]}")
    inner = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"inner_seconds"')]
    peak = json.loads(done.stdout.splitlines()[-1])["peak_rss_mb"]
    extra = {k: v for k, v in (inner[-1] if inner else {}).items() if k != "inner_seconds"}
    return {"seconds": inner[-1]["inner_seconds"] if inner else seconds, "wall": seconds, "peak_rss_mb": peak, **extra}


def child(case: str, params: list[str]) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        CASES[case](Path(tmp), *map(int, params))
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(json.dumps({"peak_rss_mb": max(own, kids) / 1024}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=sorted(SIZES), help="run these cases only")
    parser.add_argument("--maj", action="store_true", help="only the maj@k cases, pairwise against fingerprints")
    parser.add_argument("--json", help="also write the measurements here")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1:])
        return
    print(f"# bench_scale: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    print(
        "| maj@k grouping of one problem's answers | pairwise: time (s), comparisons | fingerprints: time (s), "
        "comparisons | same classes |"
    )
    print("|---|---|---|---|")
    for which, name in enumerate(MAJ_CASES):
        plain, fast = (run_child("maj-pairs", (which, mode)) for mode in (0, 1))
        print(
            f"| {name} | {plain['seconds']:.2f}, {plain['comparisons']:,} | {fast['seconds']:.2f}, "
            f"{fast['comparisons']:,} | {plain['classes'] == fast['classes']} |",
            flush=True,
        )
    if args.maj:
        return
    print()
    print("| case | size | work | time (s) | peak RSS (MB) | growth exponent vs the case's first size |")
    print("|---|---|---|---|---|---|")
    table = []
    for case in args.only or SIZES:
        previous = None
        for label, work, params in SIZES[case]:
            result = run_child(case, params)
            exponent = ""
            if previous is not None and work != previous[0]:
                exponent = f"{math.log(result['seconds'] / previous[1]) / math.log(work / previous[0]):.2f}"
            else:
                previous = (work, result["seconds"])
            seconds, memory = f"{result['seconds']:.2f}", f"{result['peak_rss_mb']:.0f}"
            print(f"| {case} | {label} | {work:,} | {seconds} | {memory} | {exponent} |", flush=True)
            table.append({"case": case, "size": label, "work": work, **result, "exponent": exponent})
    print(f"# load average {os.getloadavg()[0]:.1f} at the end")
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=2))


if __name__ == "__main__":
    main()
