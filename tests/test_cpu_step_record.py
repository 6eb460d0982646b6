"""The CPU step figures docs/performance.md quotes for issue 58's item 4 are the committed log's
(docs/measurements/cpu-epyc-20261128-step/bench_step.log): the ratio, its per-pair range and the alone ratio recomputed
from the log's own step times, the parts and floors read from its lines, the profile's shares from its tables. An edit
of the page's numbers, or a new log with other figures, fails here instead of going stale."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOG_DIR = ROOT / "docs" / "measurements" / "cpu-epyc-20261128-step"
LOG = (LOG_DIR / "bench_step.log").read_text()
PAGE = " ".join((ROOT / "docs" / "performance.md").read_text().split())


def _times(label: str) -> list[float]:
    return [float(t) for t in re.search(re.escape(label) + r" \[([^\]]+)\]", LOG).group(1).split(", ")]


def _alone_times(arm: str) -> list[float]:
    return [float(t) for t in re.search(rf"{arm} alone: .*?step_time \[([^\]]+)\]", LOG).group(1).split(", ")]


def test_the_step_ratio_and_its_range_are_the_logs_step_times():
    """R is the median of the step-by-step ratios of both paired runs (recomputed here from the four lines, not read
    from the log's last line, which must agree); the range is their min and max; alone, the ratio of the medians."""
    ratios = []
    for first in ("gtpo", "grpo"):
        g, r = (
            _times(f"taking turns, {first} first: gtpo step_time"),
            _times(f"taking turns, {first} first: grpo step_time"),
        )
        ratios += [a / b for a, b in zip(g, r, strict=True)]
    median = statistics.median(ratios)
    assert f"gtpo/grpo step time ratio {median:.3f}" in LOG
    assert f"came out at {median:.3f}x" in PAGE and f"which ranged {min(ratios):.3f}-{max(ratios):.3f}" in PAGE
    alone = {arm: statistics.median(_alone_times(arm)) for arm in ("gtpo", "grpo")}
    ratio = alone["gtpo"] / alone["grpo"]
    assert f"**{ratio:.3f}x TRL's step, not met**" in PAGE  # the figure to quote on a CPU: no threads
    assert f"give {ratio:.3f}x ({alone['gtpo']:.2f} against {alone['grpo']:.2f} s)" in PAGE


def test_the_thread_penalty_quoted_is_its_logs():
    """The paired child's bias: TRL's generate in a process's main thread against a new thread, and both under
    OMP_WAIT_POLICY=PASSIVE, as generate_thread.log printed them (ranges of its three calls per place)."""
    text = (LOG_DIR / "generate_thread.log").read_text()
    default, passive = text.split("OMP_WAIT_POLICY=PASSIVE")
    ranges = {}
    for name, block in (("default", default), ("passive", passive)):
        for place in ("main thread", "new thread"):
            values = [float(v) for v in re.search(rf"{place}: ([\d., ]+) s", block).group(1).split(", ")]
            ranges[name, place] = f"{min(values):.2f}-{max(values):.2f}"
    assert f"{ranges['default', 'main thread']} s a call in a process's main thread" in PAGE
    assert f"and {ranges['default', 'new thread']} s in a new thread" in PAGE
    both = [float(x) for r in (ranges["passive", "main thread"], ranges["passive", "new thread"]) for x in r.split("-")]
    assert f"{min(both):.2f}-{max(both):.2f} s in both with `OMP_WAIT_POLICY=PASSIVE`" in PAGE


def test_the_parts_floors_and_profile_shares_are_the_logs():
    parts = {arm: dict(re.findall(r"(\w+) ([\d.]+)", re.search(rf"{arm} step parts \(median s\): (.*)", LOG).group(1)))
             for arm in ("gtpo", "grpo")}  # fmt: skip
    gtpo, trl = ({k: float(v) for k, v in parts[arm].items()} for arm in ("gtpo", "grpo"))
    generation = f"generation {gtpo['generation']:.2f} s against TRL's {trl['generation']:.2f} s"
    assert f"{generation} ({gtpo['generation'] / trl['generation']:.3f}x)" in PAGE
    assert f"scoring {gtpo['scoring']:.2f} against {trl['scoring']:.2f} s" in PAGE
    assert f"backward {gtpo['backward']:.2f} against {trl['backward']:.2f} s" in PAGE
    assert "read bandwidth 49.3 GB/s measured" in LOG and "read bandwidth 49.3 GB/s" in PAGE
    assert "gtpo generation = 8.09x its weight-read floor" in LOG and "generation 8.09x its floor" in PAGE
    gtpo_profile = LOG[LOG.index("profile of gtpo's generation") : LOG.index("profile of grpo's generation")]
    mm = re.search(r"aten::mm\s+([\d.]+)%\s+([\d.]+)s", gtpo_profile)
    assert round(float(mm.group(1))) == 74 and f"**74 % in the weight matmuls** (`aten::mm`, {mm.group(2)} s" in PAGE
    exponential = re.search(r"aten::exponential_\s+([\d.]+)%", gtpo_profile)
    assert round(float(exponential.group(1))) == 9 and "9 % in `aten::exponential_`" in PAGE
    assert "Self CPU time total: 5.955s" in gtpo_profile and "self CPU time 5.96 s" in PAGE
