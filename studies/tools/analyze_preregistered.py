"""The primary outcomes of studies C and D, computed exactly as their PREREGISTRATION.md registers them, from the
committed run files alone; and the power figures the pre-registrations quote.

With the project's interpreter (.venv/bin/python):

    python studies/tools/analyze_preregistered.py c studies/smollm2-synthetic-lr1e-3-c            # study C: runaways
    python studies/tools/analyze_preregistered.py d studies/smollm2-synthetic-lr2e-4-d            # study D: pass@1
    python studies/tools/analyze_preregistered.py power                                           # the power table
    python studies/tools/analyze_preregistered.py runs studies/smollm2-synthetic-lr1e-3-c         # per-run table
    python studies/tools/analyze_preregistered.py heldout studies/smollm2-synthetic-lr2e-4-d      # D's length pairs
    python studies/tools/analyze_preregistered.py seeds studies/smollm2-synthetic-lr2e-4-d        # per-seed table
    python studies/tools/analyze_preregistered.py e studies/smollm2-synthetic-lr1e-3-e            # study E: the stall
    python studies/tools/analyze_preregistered.py e studies/smollm2-synthetic-lr1e-3-guard --arms gtpo gtpo-guard
    python studies/tools/analyze_preregistered.py f studies/smollm2-synthetic-lr2e-4-f  # study F: guard vs GRPO
    python studies/tools/analyze_preregistered.py seeds studies/smollm2-synthetic-lr2e-4-f --arms gtpo-guard grpo
    python studies/tools/analyze_preregistered.py g studies/smollm2-two-step-g  # study G: two-step task
    python studies/tools/analyze_preregistered.py h studies/smollm2-two-step-h  # study H: GTPO, no filter, GRPO
    python studies/tools/analyze_preregistered.py h-seeds studies/smollm2-two-step-h  # H's per-seed table
    python studies/tools/analyze_preregistered.py h-screen studies/smollm2-two-step-h-screen studies/smollm2-two-step-g
    python studies/tools/analyze_preregistered.py h-parts studies/smollm2-two-step-h-parts \
        studies/smollm2-two-step-h-screen studies/smollm2-two-step-g   # exploratory: GTPO's parts off
    python studies/tools/analyze_preregistered.py h-screen PARTS G --arm ARM --with FOLLOWUP  # a part arm, 13 seeds
    python studies/tools/analyze_preregistered.py e-secondary studies/smollm2-synthetic-lr1e-3-e  # E, steps 11-15
    python studies/tools/analyze_preregistered.py f-subgroups studies/smollm2-synthetic-lr2e-4-f  # post hoc

Standard library only (no scipy): Fisher's exact test by enumerating the hypergeometric distribution with exact
integers, the paired t-interval with gtpo compare's t table (gtpo.compare.stats), and the power of the paired t-test
from the noncentral t distribution, integrated numerically over the chi-square of the variance estimate.

Study C (per run ``runs/<arm>/seed<S>/metrics.jsonl``): a run *ran away* when ``completions/clipped_ratio`` >= 0.5 at
6 or more of its last 10 logged steps (31-40 of 40; the last record of a step counts, as a resumed run may log a
step twice). Only finished runs (``run.json`` status ``finished``, 40 steps) count. Test: Fisher's exact test of
the 2x2 table (arm x ran away), one-sided (alternative: GTPO's runaway rate is lower), alpha = 0.05, as the
pre-registration's "Test and alpha" section registers it; the two-sided p is printed beside it, secondary.

Study D (per run ``runs/<arm>/seed<S>/eval/synthetic/results.json``): held-out pass@1 in points, 100 x
``results["pass@k"]["1"]``; the primary outcome is the mean over seeds of gtpo - grpo with its 95 % t-interval
(t_{0.975, n-1} from gtpo.compare.stats), over the seeds where both arms' evaluations are complete.

Study E (per run ``runs/<arm>/seed<S>/metrics.jsonl``, steps 1-15): a step's group *had the full format* when its
``rewards/format_reward/mean`` is >= 1.25 (one full-format completion of 8 scores 10 / 8; eight partial credits
score 1.0); a run *stalled* when no step 1-15 did. Only finished runs with steps 1-15 logged count, in pairs (both
arms of a seed). Test: McNemar's exact test on the pairs, one-sided (alternative: runs stall more often with the
conflict correction, arm ``gtpo``, than without, arm ``gtpo-nocc``), alpha = 0.05. A seed whose step-1 group had the
full format cannot stall in either arm (step 1 precedes any update, so both arms' first groups are the same), so
only the seeds whose first group lacked it can be discordant.

Study F: study D's primary outcome with arms ``gtpo-guard`` and ``grpo`` (the paired gtpo-guard - grpo held-out pass@1
difference, 95 % t-interval, two-sided), and as its registered secondary outcome E's stall rule (no full-format group
in steps 1-15) applied to each arm's runs, with McNemar's exact p in each direction, descriptive; beside them the
other registered secondaries this script computes: held-out length and cut share, paired (``heldout`` on F's arms),
and per gtpo-guard run the share of conflict-span tokens at λ 0 in its completion record (``span_lambda_shares``).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from gtpo.compare.report import folder_withholds_estimates  # noqa: E402
from gtpo.compare.stats import mean_interval, sample_std  # noqa: E402

ALPHA = 0.05
RUNAWAY_CLIPPED = 0.5  # a step's share of completions cut at max_completion_length
RUNAWAY_STEPS = 6  # of the last RUNAWAY_WINDOW steps
RUNAWAY_WINDOW = 10
MAX_STEPS = 40
ARMS = ("gtpo", "grpo")
E_ARMS = ("gtpo", "gtpo-nocc")  # study E: with and without the conflict correction (Eq. 5)
E_STEPS = 15
F_ARMS = ("gtpo-guard", "grpo")  # study F: GTPO with the stall guard (conflict_guard) against GRPO
F_PAIRS = 20
D_SEED_SD = 17.6  # study D's SD of the paired pass@1 differences (points), F's power assumption
FULL_FORMAT_MEAN = 1.25  # a group of 8 with one full-format completion (10 points) scores >= 10 / 8; none: <= 1.0
STEP1_KEYS = ("rewards/format_reward/mean", "completions/mean_length", "reward")  # the same first group in both arms
_REL_TOL = 1 + 1e-7  # ties of hypergeometric probabilities, as R and scipy treat them


# ------------------------------------------------------------------------------------------- Fisher's exact test


def _hypergeom(x: int, row1: int, col1: int, total: int) -> float:
    """P(X = x): x of the ``row1`` runs of arm 1 among the ``col1`` runaways of ``total`` runs."""
    return math.comb(col1, x) * math.comb(total - col1, row1 - x) / math.comb(total, row1)


def fisher_exact(a: int, b: int, c: int, d: int, alternative: str = "two-sided") -> float:
    """p-value of Fisher's exact test of the table [[a, b], [c, d]] (rows: arms; columns: ran away, did not).

    ``two-sided``: the probability of every table with the same margins at most as likely as this one;
    ``less``: P(X <= a), arm 1 having fewer runaways than its share under the null."""
    row1, col1, total = a + b, a + c, a + b + c + d
    low, high = max(0, row1 + col1 - total), min(row1, col1)
    probs = {x: _hypergeom(x, row1, col1, total) for x in range(low, high + 1)}
    if alternative == "less":
        return min(1.0, sum(p for x, p in probs.items() if x <= a))
    if alternative == "two-sided":
        return min(1.0, sum(p for p in probs.values() if p <= probs[a] * _REL_TOL))
    raise ValueError(f"alternative must be 'two-sided' or 'less', got {alternative!r}")


def fisher_power(n1: int, n2: int, p1: float, p2: float, alternative: str = "two-sided", alpha: float = ALPHA):
    """Exact power of :func:`fisher_exact` with n1 runs at true runaway rate p1 against n2 at p2: the summed
    binomial probability of every outcome the test rejects at ``alpha``."""
    power = 0.0
    for x1 in range(n1 + 1):
        for x2 in range(n2 + 1):
            if fisher_exact(x1, n1 - x1, x2, n2 - x2, alternative) <= alpha:
                power += (
                    math.comb(n1, x1)
                    * p1**x1
                    * (1 - p1) ** (n1 - x1)
                    * math.comb(n2, x2)
                    * p2**x2
                    * (1 - p2) ** (n2 - x2)
                )
    return power


# ------------------------------------------------------------------------------------------- McNemar's exact test


def mcnemar_exact(b: int, c: int) -> float:
    """One-sided p of McNemar's exact test: P(B >= b) for B ~ Binomial(b + c, 1/2). ``b`` counts the pairs where only
    arm 1 had the outcome, ``c`` those where only arm 2 had it; concordant pairs carry no information. 1.0 when no
    pair is discordant."""
    n = b + c
    return sum(math.comb(n, k) for k in range(b, n + 1)) / 2**n


def mcnemar_power(n: int, p1: float, p2: float, alpha: float = ALPHA) -> float:
    """Exact power of :func:`mcnemar_exact` (rejecting at p < alpha) with ``n`` pairs whose two outcomes are
    independent given the pair, with probabilities p1 (arm 1) and p2 (arm 2): the multinomial probability of every
    (b, c) it rejects."""
    only_1, only_2 = p1 * (1 - p2), p2 * (1 - p1)
    neither_or_both = 1 - only_1 - only_2
    power = 0.0
    for b in range(n + 1):
        for c in range(n - b + 1):
            if mcnemar_exact(b, c) < alpha:
                ways = math.factorial(n) // (math.factorial(b) * math.factorial(c) * math.factorial(n - b - c))
                power += ways * only_1**b * only_2**c * neither_or_both ** (n - b - c)
    return power


# ------------------------------------------------------------------------------------------- the paired t-test


def _normal_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2))


@functools.cache
def _u_grid(df: int, steps: int = 4000) -> tuple[tuple[float, float], ...]:
    """Midpoints u and weights density(u) * du of U = sqrt(V / df), V ~ chi-square(df), on [0, 5 + 12 / sqrt(df)]
    (beyond it the density's mass is below 1e-12)."""
    du = (5 + 12 / math.sqrt(df)) / steps
    log_norm = (df / 2) * math.log(df / 2) - math.lgamma(df / 2) + math.log(2)
    grid = []
    for i in range(steps):
        u = (i + 0.5) * du
        grid.append((u, math.exp(log_norm + (df - 1) * math.log(u) - df * u * u / 2) * du))
    return tuple(grid)


def _t_sf(c: float, df: int, shift: float) -> float:
    """P(T > c) for T = (Z + shift) / sqrt(V / df): the noncentral t's upper tail, E_U[1 - Phi(c U - shift)],
    integrated with the midpoint rule."""
    return sum(w * (1 - _normal_cdf(c * u - shift)) for u, w in _u_grid(df))


@functools.cache
def t_quantile(q: float, df: int) -> float:
    """The central t quantile (bisection on :func:`_t_sf`); t_quantile(0.975, 11) = 2.2010."""
    low, high = 0.0, 50.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if _t_sf(mid, df, 0.0) > 1 - q else (low, mid)
    return (low + high) / 2


def paired_t_power(effect: float, sd: float, n: int, alpha: float = ALPHA) -> float:
    """Power of the two-sided paired t-test at ``alpha`` with n pairs whose differences have mean ``effect`` and
    standard deviation ``sd``: P(|T| > t_{1-alpha/2, n-1}) under the noncentral t with shift effect * sqrt(n) / sd."""
    crit = t_quantile(1 - alpha / 2, n - 1)
    shift = effect * math.sqrt(n) / sd
    return _t_sf(crit, n - 1, shift) + _t_sf(crit, n - 1, -shift)


def detectable_effect(sd: float, n: int, power: float = 0.8, alpha: float = ALPHA) -> float:
    """The smallest true mean difference the two-sided paired t-test detects with ``power`` (bisection)."""
    low, high = 0.0, 20 * sd
    for _ in range(50):
        mid = (low + high) / 2
        low, high = (mid, high) if paired_t_power(mid, sd, n, alpha) < power else (low, mid)
    return (low + high) / 2


# ------------------------------------------------------------------------------------------- the committed files


def _finished(run: Path) -> bool:
    try:
        return json.loads((run / "run.json").read_text()).get("status") == "finished"
    except (OSError, ValueError):
        return False


def _steps(metrics: Path) -> dict[int, dict]:
    steps = {}
    for line in metrics.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a torn last line
        if isinstance(row, dict) and "completions/clipped_ratio" in row and "step" in row:
            steps[int(row["step"])] = row  # the last record of a step
    return steps


def _finished_steps(run: Path) -> dict[int, dict] | None:
    """A finished run's logged steps, step -> its last record; None for a run that is not finished or has no
    metrics.jsonl."""
    if not _finished(run) or not (run / "metrics.jsonl").is_file():
        return None
    return _steps(run / "metrics.jsonl")


def _finished_rows(run: Path, max_steps: int = MAX_STEPS) -> list[dict] | None:
    """A finished run's logged steps in order (the last record of each); None for a run that is not finished with
    ``max_steps`` steps (40 in studies A-F)."""
    steps = _finished_steps(run)
    if steps is None or sorted(steps)[-1:] != [max_steps]:
        return None
    return [steps[s] for s in sorted(steps)]


def _ran_away(rows: list[dict]) -> bool:
    last = rows[-RUNAWAY_WINDOW:]
    return sum(row["completions/clipped_ratio"] >= RUNAWAY_CLIPPED for row in last) >= RUNAWAY_STEPS


def runaway(run: Path, max_steps: int = MAX_STEPS) -> bool | None:
    """Whether a finished run ran away (module docstring); None for a run that is not finished with ``max_steps``
    steps."""
    rows = _finished_rows(run, max_steps)
    return None if rows is None else _ran_away(rows)


def _seeds(study: Path, arm: str) -> list[int]:
    return sorted(int(p.name[4:]) for p in (study / "runs" / arm).glob("seed*") if p.name[4:].isdigit())


def _finished_runs(study: Path, arm: str):
    """(seed, run folder) of each of ``arm``'s finished runs in ``study``, by seed."""
    for seed in _seeds(study, arm):
        run = study / "runs" / arm / f"seed{seed}"
        if _finished(run):
            yield seed, run


def study_c(study: Path) -> dict:
    """Study C's primary outcome: runaways per arm and the one-sided Fisher p (alternative: GTPO's rate is lower),
    as registered; the two-sided p beside it is a secondary outcome."""
    counts = {}
    for arm in ARMS:
        outcomes = {s: runaway(study / "runs" / arm / f"seed{s}") for s in _seeds(study, arm)}
        done = {s: r for s, r in outcomes.items() if r is not None}
        counts[arm] = {
            "runs": len(done),
            "ran_away": sum(done.values()),
            "seeds": sorted(s for s, r in done.items() if r),
        }
    g, r = counts["gtpo"], counts["grpo"]
    table = (g["ran_away"], g["runs"] - g["ran_away"], r["ran_away"], r["runs"] - r["ran_away"])
    result = {"arms": counts}
    if g["runs"] and r["runs"]:
        result["p_one_sided_gtpo_less"] = fisher_exact(*table, alternative="less")  # the primary test
        result["p_two_sided"] = fisher_exact(*table)  # secondary
        result["reject"] = result["p_one_sided_gtpo_less"] < ALPHA
    return result


def run_row(run: Path) -> dict | None:
    """Secondary, per finished run: its last 10 steps' means (reward, format in % of its maximum 10, TRL's token-mean
    entropy in nats, completion length in tokens, share of completions clipped at the limit), the primary
    criterion's count (steps of the last 10 with >= 50 % clipped), the steps after step 2 whose raw entropy exceeded
    ln 2 with their maximum, the most clipped step, and the summed ``step_time`` (training compute, without the
    gaps of an interrupted run). None for a run that is not finished with 40 steps."""
    rows = _finished_rows(run)
    if rows is None:
        return None
    last = rows[-RUNAWAY_WINDOW:]

    def mean_of(key: str, scale: float = 1.0) -> float:
        return scale * sum(row[key] for row in last) / len(last)

    high = [row for row in rows if row["step"] > 2 and row["entropy"] > math.log(2)]
    return {
        "reward": mean_of("reward"),
        "format %": mean_of("rewards/format_reward/mean", 10.0),
        "entropy": mean_of("entropy"),
        "length": mean_of("completions/mean_length"),
        "clipped %": mean_of("completions/clipped_ratio", 100.0),
        "steps >= 50 % clipped, last 10": sum(row["completions/clipped_ratio"] >= RUNAWAY_CLIPPED for row in last),
        "ran away": _ran_away(rows),
        "entropy > ln 2 after step 2, steps": [int(row["step"]) for row in high],
        "entropy > ln 2 after step 2, max": max((row["entropy"] for row in high), default=None),
        "most clipped in a step %": 100.0 * max(row["completions/clipped_ratio"] for row in rows),
        "step time min": sum(row.get("step_time", 0.0) for row in rows) / 60,
    }


def runs_table(study: Path) -> list[str]:
    """The per-run rows of :func:`run_row` as a markdown table, arms in their order, seeds ascending."""
    arms = [p.name for p in sorted((study / "runs").iterdir()) if p.is_dir()]
    order = [a for a in ARMS if a in arms] + [a for a in arms if a not in ARMS]
    lines = [
        "| run | reward | format % | entropy | length | clipped | steps >= 50 % clipped (of last 10) | ran away "
        "| entropy > ln 2 after step 2 | most clipped in a step | step time (min) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm in order:
        for seed in _seeds(study, arm):
            row = run_row(study / "runs" / arm / f"seed{seed}")
            if row is None:
                continue
            steps = row["entropy > ln 2 after step 2, steps"]
            peak = row["entropy > ln 2 after step 2, max"]
            high = f"{len(steps)} step{'s' * (len(steps) > 1)} (up to {peak:.2f})" if steps else "–"
            lines.append(
                f"| {arm}/seed{seed} | {row['reward']:.2f} | {row['format %']:.1f} | {row['entropy']:.2f} "
                f"| {row['length']:.1f} | {row['clipped %']:.0f} % | {row['steps >= 50 % clipped, last 10']} "
                f"| {'yes' if row['ran away'] else 'no'} | {high} | {row['most clipped in a step %']:.0f} % "
                f"| {row['step time min']:.1f} |"
            )
    return lines


def _eval_folder(run: Path) -> Path | None:
    """The run's held-out evaluation folder ``eval/<task>/`` (``synthetic`` in studies A-F, ``two-step`` in G): the
    one task folder with a results.json; None while there is none. A run evaluated on two tasks is refused: which one
    is the study's outcome would be a guess."""
    found = sorted(path.parent for path in run.glob("eval/*/results.json"))
    if len(found) > 1:
        raise SystemExit(f"{run}: held-out results of several tasks ({', '.join(p.name for p in found)}); expected one")
    return found[0] if found else None


def _eval_results(run: Path) -> dict:
    """The run's held-out ``eval/<task>/results.json``; {} while it is missing or unreadable (not evaluated yet)."""
    folder = _eval_folder(run)
    try:
        return json.loads((folder / "results.json").read_text()) if folder else {}
    except (OSError, ValueError):
        return {}


def pass_at_1(run: Path) -> float | None:
    try:
        return 100 * float(_eval_results(run)["pass@k"]["1"])
    except (KeyError, ValueError):
        return None


def study_d(study: Path, arms: tuple[str, str] = ARMS) -> dict:
    """Study D's primary outcome: the paired arms[0] - arms[1] (gtpo - grpo) held-out pass@1 difference with its 95 %
    t-interval, over the seeds where both arms are evaluated."""
    first, second = arms
    scores = {arm: {s: pass_at_1(study / "runs" / arm / f"seed{s}") for s in _seeds(study, arm)} for arm in arms}
    seeds = sorted(s for s in scores[first] if scores[first][s] is not None and scores[second].get(s) is not None)
    diffs = [scores[first][s] - scores[second][s] for s in seeds]
    result = {"seeds": seeds, "differences": diffs}
    if len(diffs) >= 2:
        interval = mean_interval(diffs)
        result.update(interval.as_dict())
        result["sd"] = sample_std(diffs)
        result["excludes"] = f"effects below {interval.low:+.2f} and above {interval.high:+.2f} points"
    return result


def seeds_table(study: Path, arms: tuple[str, str] = ARMS) -> list[str]:
    """Secondary, per seed where both arms are evaluated (the per-seed table of study A's and D's sections): each
    arm's held-out pass@1 / pass@8 / maj@8 in %, its mean TRL ``entropy`` over its last 10 logged steps, and the
    seed's pass@1 difference arms[0] - arms[1] (gtpo - grpo: d_S, the primary outcome's terms)."""
    first, second = arms
    lines = [
        f"| seed | {first} pass@1 / pass@8 / maj@8 % | {second} pass@1 / pass@8 / maj@8 % "
        f"| entropy, last 10 steps, {first} / {second} | pass@1 {first} - {second} |",
        "|---|---|---|---|---|",
    ]
    for seed in sorted(set(_seeds(study, first)) & set(_seeds(study, second))):
        runs = [study / "runs" / arm / f"seed{seed}" for arm in arms]
        results = [_eval_results(run) for run in runs]
        rows = [_finished_rows(run) for run in runs]
        if not all(results) or None in rows:
            continue
        held_out = [
            " / ".join(f"{100 * r[key][k]:.1f}" for key, k in (("pass@k", "1"), ("pass@k", "8"), ("maj@k", "8")))
            for r in results
        ]
        entropy = " / ".join(f"{sum(row['entropy'] for row in r[-10:]) / 10:.3f}" for r in rows)
        diff = 100 * (results[0]["pass@k"]["1"] - results[1]["pass@k"]["1"])
        lines.append(f"| {seed} | {held_out[0]} | {held_out[1]} | {entropy} | {diff:+.1f} |")
    return lines


HELDOUT_KEYS = (
    ("mean_length", 1.0, "held-out mean length (tokens)"),
    ("truncated_frac", 100.0, "held-out cut at the limit (%)"),
)


def heldout(study: Path, arms: tuple[str, str] = ARMS) -> dict:
    """Secondary outcome of studies D and F (their PREREGISTRATION.md, "Secondary outcomes"): held-out mean completion
    length and share of completions cut at the token limit, from each run's ``eval/synthetic/results.json``
    (``mean_length``; ``truncated_frac`` in %): per arm the mean with its 95 % t-interval, and the paired arms[0] -
    arms[1] difference (gtpo - grpo) over the seeds where both arms' evaluations are complete."""
    first, second = arms
    values: dict[str, dict[str, dict[int, float]]] = {key: {arm: {} for arm in arms} for key, _, _ in HELDOUT_KEYS}
    for arm in arms:
        for seed in _seeds(study, arm):
            results = _eval_results(study / "runs" / arm / f"seed{seed}")  # read once for both keys
            for key, scale, _ in HELDOUT_KEYS:
                try:
                    values[key][arm][seed] = scale * float(results[key])
                except (KeyError, ValueError):
                    continue
    result = {}
    for key, _, label in HELDOUT_KEYS:
        a, b = values[key][first], values[key][second]
        seeds = sorted(set(a) & set(b))
        result[label] = {"seeds": seeds}
        if seeds:  # none while no seed has both evaluations
            result[label][first] = mean_interval([a[s] for s in seeds]).as_dict()
            result[label][second] = mean_interval([b[s] for s in seeds]).as_dict()
            result[label][f"{first} - {second}"] = mean_interval([a[s] - b[s] for s in seeds]).as_dict()
    return result


def _first_steps(run: Path, last_step: int) -> dict[int, dict] | None:
    """Steps 1..``last_step`` of a finished run (the last record of each); None unless it is finished with all of
    them logged."""
    steps = _finished_steps(run)
    if steps is None or any(step not in steps for step in range(1, last_step + 1)):
        return None
    return {step: steps[step] for step in range(1, last_step + 1)}


def first_full_format(steps: dict[int, dict]) -> int | None:
    """The first step whose group had a full-format completion (format mean >= 1.25), or None."""
    return next((t for t in sorted(steps) if steps[t]["rewards/format_reward/mean"] >= FULL_FORMAT_MEAN), None)


def study_e(study: Path, arms: tuple[str, str] = E_ARMS, last_step: int = E_STEPS) -> dict:
    """Study E's primary outcome: runs that stalled (no full-format group in steps 1-``last_step``) per arm, over the
    complete pairs, and McNemar's one-sided exact p (alternative: ``arms[0]`` stalls more often), as registered.
    Secondary beside it: the seeds whose first group lacked the full format, the one-sided Fisher p of the 2x2 table
    over them (pairing ignored), each run's first full-format step, and any seed whose two first groups differ."""
    first, second = arms
    pairs = {}
    for seed in sorted(set(_seeds(study, first)) & set(_seeds(study, second))):
        steps = [_first_steps(study / "runs" / arm / f"seed{seed}", last_step) for arm in arms]
        if None not in steps:
            pairs[seed] = steps
    found = {arm: {seed: first_full_format(pairs[seed][i]) for seed in pairs} for i, arm in enumerate(arms)}
    stalled = {arm: sorted(seed for seed, step in found[arm].items() if step is None) for arm in arms}
    only_first = sorted(set(stalled[first]) - set(stalled[second]))
    only_second = sorted(set(stalled[second]) - set(stalled[first]))
    eligible = [s for s, (a, _) in pairs.items() if a[1]["rewards/format_reward/mean"] < FULL_FORMAT_MEAN]
    result = {
        "pairs": len(pairs),
        "stalled": stalled,
        "discordant": {f"{first} only": only_first, f"{second} only": only_second},
        "first_group_without_full_format": eligible,
        "first_group_differs": [
            s for s, (a, b) in pairs.items() if any(a[1].get(k) != b[1].get(k) for k in STEP1_KEYS)
        ],
        "first_full_format_step": found,
    }
    if pairs:
        result["p_one_sided"] = mcnemar_exact(len(only_first), len(only_second))  # the primary test
        result["reject"] = result["p_one_sided"] < ALPHA
    if eligible:  # secondary: Fisher over the seeds that could stall, pairing ignored
        n, x1, x2 = len(eligible), len(stalled[first]), len(stalled[second])
        result["fisher_one_sided_secondary"] = fisher_exact(x2, n - x2, x1, n - x1, alternative="less")
    return result


# Study E's registered secondary per-arm values (PREREGISTRATION.md, "Secondary outcomes"): metric name -> (key in
# metrics.jsonl, scale). Entropy twice: the summary's `gtpo/mean_entropy` (mean over completions of each one's mean
# token entropy, both arms log it) and TRL's token-mean `entropy` (what F's tables use, as GRPO logs no other).
E_SECONDARY_METRICS = {
    "format %": ("rewards/format_reward/mean", 10.0),
    "entropy (gtpo/mean_entropy)": ("gtpo/mean_entropy", 1.0),
    "entropy (TRL entropy)": ("entropy", 1.0),
    "completion length": ("completions/mean_length", 1.0),
    "frac_reward_zero_std": ("frac_reward_zero_std", 1.0),
}
E_SECONDARY_STEPS = (11, 15)  # the registration's window for them


def _interval_dict(values: list[float]) -> dict:
    interval = mean_interval(values)
    return {"mean": interval.mean, "low": interval.low, "high": interval.high, "n": interval.n}


def study_e_registered_secondary(study: Path, arms: tuple[str, str] = E_ARMS) -> dict:
    """Study E's registered secondary per-arm values: per arm, the mean over seeds [95 % t-interval] of each run's
    mean over steps 11-15 of :data:`E_SECONDARY_METRICS`, over the complete pairs (``study_e``'s).

    Returns:
        {arm: {metric: {"mean", "low", "high", "n"}}}."""
    first, last = E_SECONDARY_STEPS
    runs = {arm: {s: _first_steps(study / "runs" / arm / f"seed{s}", last) for s in _seeds(study, arm)} for arm in arms}
    seeds = sorted(s for s in set(runs[arms[0]]) & set(runs[arms[1]]) if None not in (runs[a][s] for a in arms))
    out = {}
    for arm in arms:
        out[arm] = {}
        for name, (key, scale) in E_SECONDARY_METRICS.items():
            per_run = [scale * sum(runs[arm][s][t][key] for t in range(first, last + 1)) / (last - first + 1)
                       for s in seeds]  # fmt: skip
            out[arm][name] = _interval_dict(per_run)
    return out


def format_lost_from(steps: dict[int, dict]) -> int | None:
    """Step by step (no smoothing): the first step of the final stretch without a full-format group (format mean
    below 1.25 at it and at every later step) in a run that had one before it; None if the run never had one or
    ends with one. Unlike summary.md's "first format drop" (a 10-step moving average), this is the step the
    format was lost at."""
    ordered = sorted(steps)
    if not ordered or steps[ordered[-1]]["rewards/format_reward/mean"] >= FULL_FORMAT_MEAN:
        return None
    t = len(ordered)
    while t > 0 and steps[ordered[t - 1]]["rewards/format_reward/mean"] < FULL_FORMAT_MEAN:
        t -= 1
    return ordered[t] if t > 0 else None


def span_lambda_shares(run: Path) -> dict | None:
    """From a run's completion record (``completions/``, one group per step in the studies): over all its recorded
    steps, the span tokens (each recorded completion's forward span and backward span, a token in both counted
    once) and the share of them whose λ, as the loss applied it, is 0, is 2, and is 0 among positive completions'
    span tokens (A_i > 0). Under the paper's Eq. 5 a positive's span token gets 2 and a negative's 0; under the
    stall guard (``conflict_guard``) every span token gets 0 or 1, and a positive's 0 is where the guard withheld the
    doubled push (its sharers' advantages summed below 0). None for a run without a record."""
    from gtpo.runs import completions as records

    steps = records.recorded_steps(run)
    if not steps:
        return None
    span = zero = doubled = positive = positive_zero = 0
    for step in steps:
        c = records.read_step(run, step)["columns"]
        for i, ids in enumerate(c["completion_ids"]):
            n = len(ids)
            lam = records.lambda_row(c["lambda_positions"][i], c["lambda_values"][i], n)
            fw, bw = c["forward_span"][i], c["backward_span"][i]
            in_span = [t for t in range(n) if t < fw or t >= n - bw]
            zeros = sum(lam[t] == 0.0 for t in in_span)
            span, zero, doubled = span + len(in_span), zero + zeros, doubled + sum(lam[t] == 2.0 for t in in_span)
            if c["advantage"][i] > 0:
                positive, positive_zero = positive + len(in_span), positive_zero + zeros
    return {
        "steps": len(steps),
        "span tokens": span,
        "λ 0 %": 100.0 * zero / span if span else None,
        "λ 2 %": 100.0 * doubled / span if span else None,
        "positive span tokens": positive,
        "positive λ 0 %": 100.0 * positive_zero / positive if positive else None,
    }


def stall_secondary(study: Path, arms: tuple[str, str], names: tuple[str, str] | None = None) -> dict:
    """Studies F's and G's registered stall secondary: study E's rule (no full-format group in steps 1-15) per arm
    over the complete pairs, with McNemar's exact one-sided p in each direction, descriptive. ``names``: the arms as
    the p keys name them (``p_one_sided_<name>_stalls_more``; F's are 'guard' and 'grpo'), by default the arms."""
    stall = study_e(study, arms)
    only = stall["discordant"]
    b, c = (len(only[f"{arm} only"]) for arm in arms)
    first, second = names or arms
    return {
        "pairs": stall["pairs"],
        "stalled": stall["stalled"],
        "discordant": only,
        "first_group_without_full_format": stall["first_group_without_full_format"],
        f"p_one_sided_{first}_stalls_more": mcnemar_exact(b, c) if stall["pairs"] else None,
        f"p_one_sided_{second}_stalls_more": mcnemar_exact(c, b) if stall["pairs"] else None,
    }


def study_f(study: Path) -> dict:
    """Study F: the primary outcome (study D's computation on arms gtpo-guard and grpo), the registered secondary
    one (E's stall rule per arm over steps 1-15 with McNemar's exact p in each direction, descriptive), and the other
    registered secondaries computed here: held-out length and cut share paired (``heldout``) and, per finished
    gtpo-guard run, the span tokens the guard set to λ 0 (``span_lambda_shares``; the remaining pass@k / maj@k
    intervals are in the study's summary.md, the last-10-step training metrics in ``runs``)."""
    result = study_d(study, F_ARMS)
    result["secondary_stall"] = stall_secondary(study, F_ARMS, names=("guard", "grpo"))
    result["secondary_heldout"] = heldout(study, F_ARMS)
    guard = F_ARMS[0]
    result["secondary_guard_spans"] = {
        seed: span_lambda_shares(study / "runs" / guard / f"seed{seed}")
        for seed in _seeds(study, guard)
        if _finished(study / "runs" / guard / f"seed{seed}")
    }
    return result


def _regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, by its continued fraction (Lentz's method)."""
    if x <= 0.0 or x >= 1.0:
        return max(0.0, min(1.0, x))
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast only below the mean: use the symmetry
        return 1.0 - _regularized_beta(1.0 - x, b, a)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(1 - x)) / a
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 300):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):  # fmt: skip
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-14:
            break
    return front * f


def welch_t_test(a: list[float], b: list[float]) -> dict:
    """Welch's unequal-variance t-test of mean(a) - mean(b), two-sided.

    Returns:
        {"difference", "t", "df" (Welch-Satterthwaite, not an integer), "p" (two-sided: I_{df/(df+t^2)}(df/2, 1/2))}."""
    va, vb = sample_std(a) ** 2 / len(a), sample_std(b) ** 2 / len(b)
    difference = sum(a) / len(a) - sum(b) / len(b)
    t = difference / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return {"difference": difference, "t": t, "df": df, "p": _regularized_beta(df / (df + t * t), df / 2, 0.5)}


def study_f_first_group_subgroups(study: Path) -> dict:
    """Found after F's analysis (post hoc): the paired pass@1 difference (gtpo-guard - grpo) over the seeds whose
    first group lacked the full format and over the others, each with its 95 % t-interval, and Welch's test of the
    difference between the two subgroups (a pattern to describe, not a registered test).

    Returns:
        {"lacking": {"seeds", mean/low/high/n}, "other": {...}, "welch": welch_t_test(lacking, other)}."""
    diffs = study_d(study, F_ARMS)
    per_seed = dict(zip(diffs["seeds"], diffs["differences"], strict=True))
    lacking = study_e(study, F_ARMS)["first_group_without_full_format"]
    groups = {"lacking": [s for s in per_seed if s in lacking], "other": [s for s in per_seed if s not in lacking]}
    out = {name: {"seeds": seeds, **_interval_dict([per_seed[s] for s in seeds])} for name, seeds in groups.items()}
    out["welch"] = welch_t_test(*([per_seed[s] for s in groups[name]] for name in ("lacking", "other")))
    return out


G_ARMS = ("gtpo", "grpo")  # study G (issue 48): GTPO as the two-step recipe ships against GRPO
G_PAIRS = 20
G_STEPS = 40
G_SEED_SD = 17.64  # the larger SD of the paired pass@1 differences so far: study D's (F's 15.81), G's assumption
G_FIRST_STEP = "share of negatives, %"  # two_step_spans.run_counts: negatives whose forward span holds a right step


def _tools_module(name: str):
    """studies/tools/<name>.py as a module (studies/tools/ is no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "studies" / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def heldout_first_step(run: Path) -> float | None:
    """Study G's secondary: the share (%) of a run's held-out samples (``eval/two-step/samples.jsonl``) whose first
    equation is the question's first step computed right (`gtpo.tasks.two_step.first_step_correct`); the question is
    rebuilt from the problem id (``two-step/test/9+8-3``). None while the run has no held-out samples."""
    import re

    from gtpo.tasks.two_step import first_step_correct

    folder = _eval_folder(run)
    if folder is None or not (folder / "samples.jsonl").is_file():
        return None
    right = total = 0
    for line in (folder / "samples.jsonl").read_text().splitlines():
        sample = json.loads(line)
        a, op1, b, op2, c = re.fullmatch(r".*/(\d+)([+-])(\d+)([+-])(\d+)", sample["problem_id"]).groups()
        right += first_step_correct(sample["text"], f"What is {a} {op1} {b} {op2} {c}?")
        total += 1
    return 100 * right / total if total else None


def _per_arm_and_paired(values: dict[str, dict[int, float]], arms: tuple[str, str]) -> dict:
    """Per arm the mean with its 95 % t-interval, and the paired arms[0] - arms[1] difference, over the seeds where
    both arms have a value."""
    first, second = arms
    seeds = sorted(set(values[first]) & set(values[second]))
    result = {"seeds": seeds}
    if seeds:
        for arm in arms:
            result[arm] = mean_interval([values[arm][s] for s in seeds]).as_dict()
        result[f"{first} - {second}"] = mean_interval([values[first][s] - values[second][s] for s in seeds]).as_dict()
    return result


def study_g(study: Path, arms: tuple[str, str] = G_ARMS, max_steps: int = G_STEPS) -> dict:
    """Study G, as its PREREGISTRATION.md registers it: the primary outcome (study D's computation: the paired gtpo -
    grpo held-out pass@1 difference with its 95 % t-interval, two-sided) and the registered secondaries: the share of
    negative completions whose forward span holds a correct first step (per run over its completion record, per arm
    and paired); E's stall rule (steps 1-15) and C's runaway rule (the last 10 of ``max_steps`` steps) per arm with
    McNemar's exact p in each direction, descriptive; held-out length and cut share (``heldout``); and the held-out
    share of samples with a correct first step (per arm and paired)."""
    first, second = arms
    result = study_d(study, arms)
    spans = _tools_module("two_step_spans")
    shares = {arm: {} for arm in arms}
    first_steps = {arm: {} for arm in arms}
    ran_away = {arm: {} for arm in arms}
    for arm in arms:
        for seed, run in _finished_runs(study, arm):
            share = spans.run_counts(run)[G_FIRST_STEP] if (run / "completions").is_dir() else None
            if share is not None:
                shares[arm][seed] = share
            if (value := heldout_first_step(run)) is not None:
                first_steps[arm][seed] = value
            if (away := runaway(run, max_steps)) is not None:
                ran_away[arm][seed] = away
    result["secondary_protected_first_step"] = _per_arm_and_paired(shares, arms)
    result["secondary_stall"] = stall_secondary(study, arms)
    pairs = sorted(set(ran_away[first]) & set(ran_away[second]))
    b = sum(ran_away[first][s] and not ran_away[second][s] for s in pairs)
    c = sum(ran_away[second][s] and not ran_away[first][s] for s in pairs)
    result["secondary_runaway"] = {
        "pairs": len(pairs),
        "ran_away": {arm: sorted(s for s in pairs if ran_away[arm][s]) for arm in arms},
        f"p_one_sided_{first}_runs_away_more": mcnemar_exact(b, c) if pairs else None,
        f"p_one_sided_{second}_runs_away_more": mcnemar_exact(c, b) if pairs else None,
    }
    result["secondary_heldout"] = heldout(study, arms)
    result["secondary_heldout_first_step"] = _per_arm_and_paired(first_steps, arms)
    return result


H_ARMS = (
    "gtpo",
    "no-filter",
    "grpo",
)  # study H (issue 56): the paper's GTPO, GTPO without Eq. 6's filter (the parts screen's choice), GRPO
H_PAIRS_CHOICES = (20, 24, 30)  # the pairs H may register, chosen by h_pairs from the screen's SD
H_EFFECT = 15.0  # points of held-out pass@1 that H's n must detect with 80 % power
H_SD_FLOOR = 20.0  # the SD H's n assumes at least (the screen has 13 pairs: its SD is itself uncertain)
H_LOCKIN_SHARE = 0.8  # a run locks in when at least this share of its recorded completions, steps 21-30, open so
H_LOCKIN_STEPS = (21, 30)
H_FAILED_BELOW = 11.0  # held-out pass@1 (points) under which a run failed, G's seven low seeds' bound
H_SCREEN_ARM = "common-prefix"  # the first screen's variant: h-screen's arm unless --arm names another


def _failed(points: float) -> bool:
    """A run *failed* when its held-out pass@1 (points) is below H_FAILED_BELOW."""
    return points < H_FAILED_BELOW


def _locked_in(share: float | None) -> bool:
    """A run *locked in* when its single-equation share over steps 21-30 is at least H_LOCKIN_SHARE (no record: no)."""
    return share is not None and share >= H_LOCKIN_SHARE


H_SCREEN_SEEDS = (404, 401, 417, 402, 407, 403, 410, 406, 418, 408, 400, 409, 405)  # G's seven low seeds first


def h_pairs(screen_sd: float) -> int:
    """Study H's number of seeds, by its PREREGISTRATION.md's rule: the smallest of H_PAIRS_CHOICES at which the
    two-sided paired t-test (alpha 0.05) has 80 % power for an H_EFFECT-point difference at SD max(screen_sd,
    H_SD_FLOOR); the largest where none has."""
    sd = max(float(screen_sd), H_SD_FLOOR)
    for n in H_PAIRS_CHOICES:
        if detectable_effect(sd, n) <= H_EFFECT:
            return n
    return H_PAIRS_CHOICES[-1]


def h_screen(screen: Path, g: Path, arm: str = H_SCREEN_ARM, also: tuple[Path, ...] = ()) -> dict:
    """The screen for study H (exploratory): the variant's held-out pass@1 at each screen seed against study G's
    gtpo and grpo runs at the same seed (G repeats bit for bit on the screen's code: its control), the paired
    differences with their SD, and the n H registers from it (``h_pairs``). Seeds where any of the three is not
    evaluated are left out and listed.

    Args:
        screen: the folder with the variant's runs (``runs/<arm>/seed<S>``).
        g: study G's folder.
        arm: the variant's arm name.
        also: more folders with the same arm's runs at other seeds (a part arm chosen at G's seven low seeds, then
            run at the six others); a seed in two folders is an error.
    """
    variant: dict[int, float | None] = {}
    for folder in (screen, *also):
        for s in _seeds(folder, arm):
            if s in variant:
                raise SystemExit(f"h-screen: {arm}/seed{s} is in more than one folder; give each seed once")
            variant[s] = pass_at_1(folder / "runs" / arm / f"seed{s}")
    scores = {
        arm: variant,
        **{a: {s: pass_at_1(g / "runs" / a / f"seed{s}") for s in _seeds(g, a)} for a in G_ARMS},
    }
    seeds = [s for s in H_SCREEN_SEEDS if all(scores[a].get(s) is not None for a in scores)]
    result = {"seeds": seeds, "missing": [s for s in H_SCREEN_SEEDS if s not in seeds],
              "pass@1": {a: {s: scores[a][s] for s in seeds} for a in scores}}  # fmt: skip
    for first, second in ((arm, "grpo"), (arm, "gtpo"), ("gtpo", "grpo")):
        diffs = [scores[first][s] - scores[second][s] for s in seeds]
        key = f"{first} - {second}"
        result[key] = {"differences": diffs, **(mean_interval(diffs).as_dict() if len(diffs) >= 2 else {})}
        if len(diffs) >= 2:
            result[key]["sd"] = sample_std(diffs)
    for a in scores:
        result[f"{a} below {H_FAILED_BELOW:g}"] = [s for s in seeds if _failed(scores[a][s])]
    if len(seeds) >= 2:
        sd = result[f"{arm} - grpo"]["sd"]
        used = max(sd, H_SD_FLOOR)
        detectable = {n: detectable_effect(used, n) for n in H_PAIRS_CHOICES}
        result["h_pairs"] = {"screen_sd": sd, "sd_used": used, "n": h_pairs(sd), "detectable": detectable}
    return result


H_PARTS_ARMS = ("no-filter", "no-correction", "no-entropy-term")  # the parts screen: one part of GTPO off per arm
H_LOW_SEEDS = (404, 417, 407, 410, 418, 400, 405)  # G's seven seeds where GTPO ended below 11 %, the screen's order


def h_parts(parts: Path, screen: Path, g: Path) -> dict:
    """The parts screen (exploratory): at G's low seeds, per arm (its three, the common-prefix screen's arm, G's gtpo
    and grpo) held-out pass@1 and the lock-in share (steps 21-30) per seed, the seeds below 11 % and those locked in
    (share >= 0.8), and each part arm's paired difference from G's gtpo with its 95 % t-interval, over the seeds where
    both are evaluated. Seeds still running are left out of an arm and listed as missing."""
    roots = {**{arm: parts for arm in H_PARTS_ARMS}, H_SCREEN_ARM: screen, "gtpo": g, "grpo": g}
    result = {"seeds": list(H_LOW_SEEDS), "arms": {}}
    for arm, root in roots.items():
        rows = {}
        for seed in H_LOW_SEEDS:
            run = root / "runs" / arm / f"seed{seed}"
            score = pass_at_1(run) if _finished(run) else None
            if score is not None:
                rows[seed] = {"pass@1": score, "lockin_share": lockin_share(run)}
        result["arms"][arm] = {
            "per_seed": rows,
            "missing": [s for s in H_LOW_SEEDS if s not in rows],
            f"below {H_FAILED_BELOW:g}": [s for s, r in rows.items() if _failed(r["pass@1"])],
            "locked_in": [s for s, r in rows.items() if _locked_in(r["lockin_share"])],
        }
    gtpo = result["arms"]["gtpo"]["per_seed"]
    for arm in (*H_PARTS_ARMS, H_SCREEN_ARM):
        mine = result["arms"][arm]["per_seed"]
        diffs = [mine[s]["pass@1"] - gtpo[s]["pass@1"] for s in H_LOW_SEEDS if s in mine and s in gtpo]
        result["arms"][arm]["- gtpo"] = {
            "differences": diffs,
            **(mean_interval(diffs).as_dict() if len(diffs) >= 2 else {}),
        }
    result["choice"] = h_parts_choice(result)
    return result


H_RESCUES_NEEDED = 5  # of G's seven low seeds: a part arm qualifies as H's variant when it rescues at least this many


def h_parts_choice(parts: dict) -> dict:
    """H's variant from the parts screen, by the rule its README wrote before any of its outcomes was read: an arm
    *rescues* a seed when its held-out pass@1 there is at least H_FAILED_BELOW points and it did not lock in (share
    below H_LOCKIN_SHARE, or no record). An arm qualifies when it rescues at least H_RESCUES_NEEDED of the seven;
    of those the one with the most rescues, then the higher mean pass@1 over the seven, is chosen. No choice while
    any part arm has a seed missing; None when no arm qualifies (no single part carries the failure).

    Args:
        parts: ``h_parts``' result (its "arms" with per-seed pass@1 and lock-in shares).

    Returns:
        {"complete", "rescued": {arm: seeds}, "mean_pass@1": {arm: points}, "qualifying": [arms], "chosen": arm or None}
    """
    arms = {arm: parts["arms"][arm] for arm in H_PARTS_ARMS}
    rescued = {
        arm: [s for s, r in a["per_seed"].items() if not _failed(r["pass@1"]) and not _locked_in(r["lockin_share"])]
        for arm, a in arms.items()
    }
    scores = {arm: [r["pass@1"] for r in a["per_seed"].values()] for arm, a in arms.items()}
    means = {arm: math.fsum(v) / len(v) if v else None for arm, v in scores.items()}
    complete = all(not a["missing"] for a in arms.values())
    qualifying = [arm for arm in H_PARTS_ARMS if len(rescued[arm]) >= H_RESCUES_NEEDED]
    chosen = max(qualifying, key=lambda arm: (len(rescued[arm]), means[arm])) if complete and qualifying else None
    return {"complete": complete, "rescued": rescued, "mean_pass@1": means, "qualifying": qualifying,
            "chosen": chosen}  # fmt: skip


def lockin_share(run: Path, steps: tuple[int, int] = H_LOCKIN_STEPS) -> float | None:
    """The share of a run's recorded completions in steps ``steps`` (inclusive) whose reasoning opens with a single
    equation (`lockin_tokens.single_equation_opening` > 0: three numbers before the first "="); None while the run
    has no record of those steps."""
    from gtpo.runs import completions as records

    opening = _tools_module("lockin_tokens").single_equation_opening
    single = total = 0
    for step in records.recorded_steps(run):
        if steps[0] <= step <= steps[1]:
            for tokens in records.read_step(run, step)["columns"]["completion_tokens"]:
                single += opening(list(tokens)) > 0
                total += 1
    return single / total if total else None


NOT_LOGGED = "not logged"  # no_progress_step of a run whose log never carries the flag (code from before the warning)


def no_progress_step(run: Path) -> int | str | None:
    """The first step at which the run's own training log (``metrics.jsonl``) has ``monitor/no_progress`` on: the
    warning as the pinned code computed it while training, so its rule is the pinned commit's; None if never on;
    NOT_LOGGED if no step logs the flag at all (such a run is not judged: never warned is not the same as unwatched)."""
    rows = [row for _, row in sorted(_steps(run / "metrics.jsonl").items()) if "monitor/no_progress" in row]
    on = [int(row["step"]) for row in rows if row["monitor/no_progress"]]
    return NOT_LOGGED if not rows else on[0] if on else None


def study_h(study: Path, arms: tuple[str, str, str] = H_ARMS) -> dict:
    """Study H, as its PREREGISTRATION.md registers it: the primary outcome (study D's computation on variant - grpo
    (H_ARMS' middle arm): the paired held-out pass@1 difference with its 95 % t-interval, two-sided) and the
    registered secondaries: lock-in per run (share of single-equation openings over steps 21-30 >= 0.8) per arm with
    McNemar's exact two-sided p, gtpo against the variant; gtpo - grpo and gtpo - variant, paired; the no-progress
    warning (as logged; a run whose log lacks the flag is listed, not judged) against held-out pass@1 below 11 %,
    hits, misses and false alarms per arm; held-out maj@k and pass@k for k = 2, 4, 8, length and cut share."""
    gtpo, variant, grpo = arms
    result = {"primary": study_d(study, (variant, grpo))}
    for first, second in ((gtpo, grpo), (gtpo, variant)):
        result[f"secondary {first} - {second}"] = study_d(study, (first, second))
    locked = {arm: {} for arm in arms}
    warned = {arm: {} for arm in arms}
    scores = {arm: {} for arm in arms}
    for arm in arms:
        for seed, run in _finished_runs(study, arm):
            if (share := lockin_share(run)) is not None:
                locked[arm][seed] = _locked_in(share)
            warned[arm][seed] = no_progress_step(run)
            if (score := pass_at_1(run)) is not None:
                scores[arm][seed] = score
    pairs = sorted(set(locked[gtpo]) & set(locked[variant]))
    b = sum(locked[gtpo][s] and not locked[variant][s] for s in pairs)
    c = sum(locked[variant][s] and not locked[gtpo][s] for s in pairs)
    result["secondary_lockin"] = {
        "rule": f"single-equation share, steps {H_LOCKIN_STEPS[0]}-{H_LOCKIN_STEPS[1]}, >= {H_LOCKIN_SHARE}",
        "locked_in": {arm: sorted(s for s, v in locked[arm].items() if v) for arm in arms},
        "runs": {arm: len(locked[arm]) for arm in arms},
        "pairs": len(pairs),
        f"discordant {gtpo} only, {variant} only": [b, c],
        "p_two_sided_mcnemar": min(1.0, 2 * min(mcnemar_exact(b, c), mcnemar_exact(c, b))) if pairs else None,
    }
    warning = {}
    for arm in arms:
        unlogged = sorted(s for s, step in warned[arm].items() if step == NOT_LOGGED)
        judged = sorted(set(warned[arm]) & set(scores[arm]) - set(unlogged))
        failed = {s for s in judged if _failed(scores[arm][s])}
        on = {s for s in judged if warned[arm][s] is not None}
        warning[arm] = {"runs": len(judged), "failed": sorted(failed), "hits": sorted(failed & on),
                        "misses": sorted(failed - on), "false_alarms": sorted(on - failed),
                        "first_steps": {s: warned[arm][s] for s in sorted(on)}, "not_logged": unlogged}  # fmt: skip
    result["secondary_no_progress_warning"] = warning
    heldout_k = {}
    for kind in ("pass@k", "maj@k"):
        for k in ("2", "4", "8"):
            values = {arm: {} for arm in arms}
            for arm in arms:
                for seed in _seeds(study, arm):
                    try:
                        values[arm][seed] = 100 * float(_eval_results(study / "runs" / arm / f"seed{seed}")[kind][k])
                    except (KeyError, ValueError, TypeError):
                        continue
            heldout_k[f"{kind[:-2]}@{k}"] = _per_arm_and_paired(values, (variant, grpo))
    result["secondary_heldout_k"] = heldout_k
    result["secondary_heldout"] = heldout(study, (variant, grpo))
    return result


def h_seeds_table(study: Path, arms: tuple[str, str, str] = H_ARMS) -> list[str]:
    """Study H's per-seed table (the figures of its registered outcomes, seed by seed), over the seeds where all three
    arms are evaluated: each arm's held-out pass@1 in %, its lock-in share (steps 21-30; "*" when locked in, "–"
    without a record of those steps), the first step its no-progress warning was on ("–" never; "not logged" for a
    log without the flag, as :func:`no_progress_step`), and the seed's pass@1 differences variant - grpo (d_S, the
    primary outcome's terms) and gtpo - grpo."""
    gtpo, variant, grpo = arms
    names = " / ".join(arms)
    lines = [
        f"| seed | pass@1 %, {names} | lock-in share, steps {H_LOCKIN_STEPS[0]}-{H_LOCKIN_STEPS[1]}, {names} "
        f"| no-progress warning from step, {names} | pass@1 {variant} - {grpo} | pass@1 {gtpo} - {grpo} |",
        "|---|---|---|---|---|---|",
    ]

    def share(run: Path) -> str:
        value = lockin_share(run)
        return "–" if value is None else f"{value:.2f}{'*' * _locked_in(value)}"

    def warning(run: Path) -> str:
        step = no_progress_step(run)
        return "–" if step is None else str(step)

    for seed in sorted(set.intersection(*(set(_seeds(study, arm)) for arm in arms))):
        runs = [study / "runs" / arm / f"seed{seed}" for arm in arms]
        scores = [pass_at_1(run) if _finished(run) else None for run in runs]
        if None in scores:
            continue
        cells = (" / ".join(f"{v:.1f}" for v in scores), " / ".join(map(share, runs)), " / ".join(map(warning, runs)))
        lines.append(f"| {seed} | {' | '.join(cells)} | {scores[1] - scores[2]:+.1f} | {scores[0] - scores[2]:+.1f} |")
    return lines


E_POWER_PAIRS = (8, 12, 16)  # seeds whose first group lacks the full format, of 32 (study C: 6 of 12)
E_POWER_RATES = ((5 / 6, 0.2), (0.6, 0.2))  # study C's 5 of 6 and the ablation's 1 of 5; a weaker effect


def power_table() -> list[str]:
    lines = ["Study C: Fisher's exact test, 12 runs against 12, alpha 0.05 (exact enumeration)"]
    for p1, p2 in ((0.0, 2 / 3), (0.1, 0.5), (0.0, 0.5), (0.1, 2 / 3)):
        two, one = fisher_power(12, 12, p1, p2), fisher_power(12, 12, p1, p2, "less")
        lines.append(f"  rates gtpo {p1:.2f}, grpo {p2:.2f}: power two-sided {two:.3f}, one-sided {one:.3f}")
    lines.append("Study D: two-sided paired t-test, 12 pairs, alpha 0.05 (noncentral t)")
    lines.append(f"  t_0.975,11 = {t_quantile(0.975, 11):.4f}")
    for sd in (10.0, 29.0):
        powers = ", ".join(f"{e:g} pts {paired_t_power(e, sd, 12):.3f}" for e in (5, 10, 15, 20, 27))
        lines.append(f"  SD {sd:g}: 80 % power at {detectable_effect(sd, 12):.1f} points; power at {powers}")
        lines.append(f"  SD {sd:g}: expected 95 % half-width {2.201 * sd / math.sqrt(12):.1f} points")
    lines.append("Studies A and B as run: the effect detectable with 80 % power (two-sided paired t, alpha 0.05)")
    for n, sd, what in ((5, 10.07, "A, pass@1, 5 pairs, SD 10.07"), (5, 29.0, "A, pass@1, 5 pairs, SD 29"),
                        (3, 1.0, "B, 3 pairs, in SDs of the paired difference")):  # fmt: skip
        lines.append(f"  {what}: {detectable_effect(sd, n):.2f}")
    lines.append(f"  B, Fisher two-sided, 3 against 3, smallest p possible: {fisher_exact(0, 3, 3, 0):.3f}")
    lines.append(
        "Study E: McNemar's exact test, one-sided, alpha 0.05, over the seeds whose first group lacks the format"
    )
    for n in E_POWER_PAIRS:
        powers = ", ".join(f"{a:.2f}/{b:.2f} {mcnemar_power(n, a, b):.3f}" for a, b in E_POWER_RATES)
        lines.append(f"  {n} such seeds, stall rates gtpo/gtpo-nocc: {powers}")
    lines.append(f"Study F: two-sided paired t-test, {F_PAIRS} pairs, alpha 0.05, SD {D_SEED_SD} (study D's)")
    lines.append(f"  t_0.975,{F_PAIRS - 1} = {t_quantile(0.975, F_PAIRS - 1):.4f}")
    for n in (12, 16, 20, 24):  # F registers F_PAIRS of them
        powers = ", ".join(f"{e:g} pts {paired_t_power(e, D_SEED_SD, n):.3f}" for e in (5, 10, 12.07, 15))
        lines.append(f"  {n} pairs: 80 % power at {detectable_effect(D_SEED_SD, n):.1f} points; power at {powers}")
    half = t_quantile(0.975, F_PAIRS - 1) * D_SEED_SD / math.sqrt(F_PAIRS)
    lines.append(f"  {F_PAIRS} pairs: expected 95 % half-width {half:.1f} points")
    lines.append(f"Study G: two-sided paired t-test, {G_PAIRS} pairs, alpha 0.05, SD {G_SEED_SD} (study D's, > F's)")
    for n in (20, 24, 28):  # G registers G_PAIRS of them
        powers = ", ".join(f"{e:g} pts {paired_t_power(e, G_SEED_SD, n):.3f}" for e in (5, 10))
        lines.append(f"  {n} pairs: 80 % power at {detectable_effect(G_SEED_SD, n):.1f} points; power at {powers}")
    half = t_quantile(0.975, G_PAIRS - 1) * G_SEED_SD / math.sqrt(G_PAIRS)
    lines.append(f"  {G_PAIRS} pairs: expected 95 % half-width {half:.1f} points")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "what",
        choices=(
            "c",
            "d",
            "e",
            "f",
            "g",
            "h",
            "h-screen",
            "h-parts",
            "h-seeds",
            "power",
            "runs",
            "seeds",
            "heldout",
            "e-secondary",
            "f-subgroups",
        ),  # fmt: skip
    )
    parser.add_argument(
        "study", nargs="?", type=Path, help="the study folder (for c, d, e, f, g, h, h-seeds, runs, seeds, heldout)"
    )
    parser.add_argument(
        "g_study", nargs="?", type=Path, help="with h-screen: study G's folder; with h-parts: the screen's"
    )
    parser.add_argument("third", nargs="?", type=Path, help="with h-parts: study G's folder")
    parser.add_argument(
        "--arms", nargs=2, metavar=("A", "B"), help="with e, seeds, heldout: two other arms (F: gtpo-guard grpo)"
    )
    parser.add_argument("--arm", help=f"with h-screen: the variant's arm (default {H_SCREEN_ARM})")
    parser.add_argument(
        "--with", dest="also", type=Path, action="append", default=[], metavar="FOLDER",
        help="with h-screen: another folder with the same arm's runs at other seeds (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--partial", action="store_true",
        help="read a pre-registered study before its last run: only for a stop its registration allows (compute run "
        "out after a complete seed of every arm), and the result reported as partial",
    )  # fmt: skip
    args = parser.parse_args(argv)
    for folder in (args.study, args.g_study, args.third, *args.also):
        if folder is not None and not args.partial and folder_withholds_estimates(folder):
            raise SystemExit(
                f"analyze_preregistered: {folder} is pre-registered and not all its runs have finished: it is "
                "analysed once, after its last run (--partial only for a stop its registration allows)"
            )
    if args.arms and args.what not in ("e", "seeds", "heldout"):
        parser.error("--arms goes with e, seeds or heldout")
    if (args.also or args.arm is not None) and args.what != "h-screen":
        parser.error("--arm and --with go with h-screen")
    arms = tuple(args.arms) if args.arms else None
    if args.what == "power":
        print("\n".join(power_table()))
        return 0
    if args.study is None:
        parser.error(f"{args.what} needs the study folder")
    if args.what == "h-screen":
        if args.g_study is None:
            parser.error("h-screen needs the screen's folder and study G's: h-screen SCREEN G")
        print(json.dumps(h_screen(args.study, args.g_study, args.arm or H_SCREEN_ARM, tuple(args.also)), indent=2))
        return 0
    if args.what == "h-parts":
        if args.g_study is None or args.third is None:
            parser.error("h-parts needs three folders: h-parts PARTS SCREEN G")
        print(json.dumps(h_parts(args.study, args.g_study, args.third), indent=2))
        return 0
    if args.what == "h-seeds":
        print("\n".join(h_seeds_table(args.study)))
        return 0
    if args.what == "runs":
        print("\n".join(runs_table(args.study)))
        return 0
    if args.what == "seeds":
        print("\n".join(seeds_table(args.study, arms or ARMS)))
        return 0
    if arms:  # e or heldout on two other arms
        print(json.dumps((study_e if args.what == "e" else heldout)(args.study, arms), indent=2))
        return 0
    result = {"c": study_c, "d": study_d, "e": study_e, "f": study_f, "g": study_g, "h": study_h, "heldout": heldout,
              "e-secondary": study_e_registered_secondary, "f-subgroups": study_f_first_group_subgroups}[args.what](
        args.study
    )  # fmt: skip
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
