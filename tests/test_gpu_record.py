"""The GPU record of 2026-11-28 (docs/measurements/gpu-h100-20261128): every figure docs/performance.md and the
record's README quote from it is what its logs print, and the checks it reports as passed did pass there.

Invariant: a GPU figure on the user's page comes from a committed log (no GPU in CI, so the logs are the only
witness); editing a figure on the page, or a log, without the other fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "measurements" / "gpu-h100-20261128"
PAGE = (ROOT / "docs" / "performance.md").read_text()
README = (RECORD / "README.md").read_text()


def _ratio(log: str, arm: str, what: str = "forward + backward") -> str:
    """The 'N.NNNx [low, high]' a bench_loss_step log prints for ``arm`` / trl."""
    line = re.search(
        rf"^{re.escape(arm)} / trl, {re.escape(what)}: (\S+ \[[\d.]+, [\d.]+\])", (RECORD / log).read_text(), re.M
    )
    assert line, (log, arm, what)
    return line[1]


@pytest.mark.parametrize("log", ["qwen-t07.log", "qwen-t1.log", "qwen3b-t07.log", "step-t07.log"])
def test_step_ratios_quoted_are_the_logs(log):
    for arm in ("gtpo", "gtpo-padded"):
        ratio = _ratio(log, arm)
        assert f"| {ratio} |" in PAGE, (log, arm, ratio)
        assert f"| {ratio} |" in README, (log, arm, ratio)
    forward = _ratio(log, "gtpo", "forward").split()[0]  # the median alone in the tables' last column
    assert f"| {forward} |" in PAGE and f"| {forward} |" in README, (log, forward)


def test_the_h200_3b_ratio_is_its_log_and_says_h200():
    text = (RECORD / "qwen3b-t07-h200.log").read_text()
    assert "device: NVIDIA H200" in text  # the tool ran this call on an H200: the page must not call it an H100
    ratio = _ratio("qwen3b-t07-h200.log", "gtpo")
    assert f"{ratio} on an H200" in PAGE
    assert f"| the same on an H200 (`qwen3b-t07-h200.log`) | {ratio} |" in README


def _decode(log: str) -> dict:
    """{rows: {arm: ms}} of a bench_decode_graph log's per-row-count lines."""
    out = {}
    for rows, body in re.findall(r"^(\d+) rows, 128 tokens: a token step (.*?);", (RECORD / log).read_text(), re.M):
        out[int(rows)] = dict(part.removesuffix(" ms").rsplit(" ", 1) for part in body.split(", "))
    return out


def test_decode_figures_quoted_are_the_logs():
    per_row, multinomial = _decode("decode-graph.log"), _decode("decode-graph-multinomial.log")
    assert set(per_row) == set(multinomial) == {8, 64}
    p8, p64, m8, m64 = per_row[8], per_row[64], multinomial[8], multinomial[64]
    assert (f"`decode` {p8['decode']} ms a step at 8 rows ({p64['decode']} at 64)") in PAGE
    assert f"**{p8['steady replayed graph']} ms steady ({p64['steady replayed graph']})" in PAGE
    assert (
        f"`decode` {m8['decode']} ms ({m64['decode']}), the graph {m8['static-graph']} ms ({m64['static-graph']})"
        in PAGE
    )
    for sampler, figures in (("per-row", per_row), ("multinomial", multinomial)):
        for rows, arms in figures.items():
            row = f"| {sampler}{' (evaluation)' if sampler == 'per-row' and rows == 8 else ''}"
            row += f"{' (training)' if sampler == 'multinomial' and rows == 8 else ''}, {rows} | {arms['decode']} ms"
            assert row in README, row
    text = (RECORD / "decode-graph.log").read_text() + (RECORD / "decode-graph-multinomial.log").read_text()
    assert "MEASUREMENT BUG" not in text  # no figure under its floor
    assert text.count("graph tokens == eager static tokens: True") == 4


def test_the_checks_reported_as_passed_passed():
    status = (RECORD / "status.txt").read_text()
    assert re.findall(r"rc=(\d+)", status) and set(re.findall(r"rc=(\d+)", status)) == {"0"}
    assert re.search(r"^11 passed, \d+ deselected", (RECORD / "tests.log").read_text(), re.M)
    for group, delta in (("fsdp", "0"), ("zero2", "5.96e-08"), ("zero3", "7.45e-09")):
        log = (RECORD / "sharded" / f"{group}.log").read_text()
        assert "sharded check: PASSED" in log, group
        assert f"reloaded weights: max |Δw| = {delta}" in log, group
        assert delta in README, group
    assert "e2e train: 3 steps" in (RECORD / "e2e-check.log").read_text()


def test_the_packed_layouts_attention_times_quoted_are_the_profiles():
    """The cuDNN attention's device time of each layout (issue 58 item 1: the dense packed mask computes all N²
    pairs), as qwen-t07.log's two profiles print it (Self CUDA, 28 calls: one per layer)."""
    text = (RECORD / "qwen-t07.log").read_text()
    times = {}
    for block in text.split("profile of ")[1:]:
        arm = block.split()[0]
        for kind in ("forward", "backward"):
            row = re.search(rf"^\s*aten::_cudnn_attention_{kind}\s+(.*)$", block, re.M)[1].split()
            assert row[-1] == "28", row
            times[arm, kind] = row[5].removesuffix("ms")
    assert set(times) == {(arm, kind) for arm in ("gtpo", "gtpo-padded") for kind in ("forward", "backward")}
    assert (
        f"the packed layout's cuDNN attention took {times['gtpo', 'forward']} ms forward and "
        f"{times['gtpo', 'backward']} ms backward over the 28 layers, against {times['gtpo-padded', 'forward']} ms "
        f"and {times['gtpo-padded', 'backward']} ms in the padded layout"
    ) in " ".join(PAGE.split())  # the page's lines joined
