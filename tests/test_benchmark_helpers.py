"""The benchmarks' shared helpers (benchmarks/floors.py, benchmarks/ratio_stats.py), against hand-derived values
and brute force.

Invariants: a floor is bytes over the fastest measured rate and a figure under it is reported as a measurement
bug, never as a ratio below 1 (issue 47, item 1: a decode step printed 0.61x "one read of the weights"); the
median's interval covers with at least the confidence asked, exactly as enumerating every sign pattern says, and
no wider than it must be (issue 47, item 3).
"""

from __future__ import annotations

import itertools
import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import floors  # noqa: E402
import ratio_stats  # noqa: E402

# ------------------------------------------------------------------------------------------------- floors


def test_weight_read_is_bytes_over_bandwidth():
    # Qwen2.5-1.5B in bf16: 1,543,714,304 parameters x 2 bytes at 3 TB/s read in 1.029 ms (issue 47's "about 1 ms").
    assert floors.weight_read_seconds(3_087_428_608, 3e12) == pytest.approx(1.029142869e-3)
    assert floors.flop_seconds(17.0e12, 500e12) == pytest.approx(0.034)
    with pytest.raises(ValueError, match="bandwidth must be positive"):
        floors.weight_read_seconds(10, 0)


def test_parameter_bytes_counts_a_tied_weight_once():
    embed = torch.nn.Embedding(10, 4).to(torch.bfloat16)
    head = torch.nn.Linear(4, 10, bias=True).to(torch.bfloat16)
    head.weight = embed.weight  # tied, as Qwen2.5-1.5B's head is
    model = torch.nn.ModuleDict({"embed": embed, "head": head})
    assert floors.parameter_bytes(model) == (10 * 4 + 10) * 2


def test_probe_is_the_weights_size_within_its_bounds():
    assert floors.probe_bytes(3_087_428_608) == 1 << 30
    assert floors.probe_bytes(300 << 20) == 300 << 20
    assert floors.probe_bytes(1000) == 1 << 20
    with pytest.raises(ValueError, match="parameter_bytes"):
        floors.probe_bytes(0)


def test_read_bandwidth_takes_the_faster_of_reduction_and_copy(monkeypatch):
    # 1 MiB float32 buffer: a reduction reads 2^20 bytes, a copy moves 2^21 (read + write).
    times = iter([1e-3, 1.5e-3])  # reduction, then copy
    monkeypatch.setattr(floors, "best_seconds", lambda run, device, reps: next(times))
    assert floors.read_bandwidth("cpu", 1 << 20) == pytest.approx(max(2**20 / 1e-3, 2**21 / 1.5e-3))
    times = iter([1e-3, 4e-3])  # here the reduction is the faster
    assert floors.read_bandwidth("cpu", 1 << 20) == pytest.approx(2**20 / 1e-3)


def test_matmul_rate_is_two_n_cubed_over_the_best_time(monkeypatch):
    monkeypatch.setattr(floors, "best_seconds", lambda run, device, reps: 0.5)
    assert floors.matmul_rate("cpu", torch.float32, size=64) == pytest.approx(2 * 64**3 / 0.5)


def test_best_seconds_keeps_the_fastest_call(monkeypatch):
    clock = iter([0.0, 3.0, 10.0, 11.0, 20.0, 22.0])  # three calls taking 3, 1 and 2 s
    monkeypatch.setattr(floors.time, "perf_counter", lambda: next(clock))
    calls = []
    assert floors.best_seconds(lambda: calls.append(1), "cpu", reps=3, warmup=2) == 1.0
    assert len(calls) == 5  # two warm-up calls, untimed, then three timed


def test_a_figure_under_its_floor_is_a_bug_not_a_ratio():
    assert floors.ratio_to_floor(6.31e-3, 1.03e-3) == pytest.approx(6.31 / 1.03)
    assert floors.floor_ratio_text("graph step", 6.31e-3, 1.03e-3, "one read of the weights") == (
        "graph step = 6.13x one read of the weights"
    )
    with pytest.raises(floors.BelowFloorError, match="below its floor"):
        floors.ratio_to_floor(6.31e-3, 10.43e-3)
    line = floors.floor_ratio_text("graph step", 6.31e-3, 10.43e-3, "one read of the weights")
    assert line.startswith("MEASUREMENT BUG") and "6.31 ms" in line and "10.43 ms" in line
    assert "x one read" not in line and "0.6" not in line  # no ratio below 1 is printed, not even in the bug line
    assert floors.any_bug(["ok", line]) and not floors.any_bug(["graph step = 6.13x one read of the weights"])


def test_measured_floors_are_positive_on_this_cpu():
    """A smoke test of the real probes (their arithmetic is tested above): finite, positive, in a sane range."""
    bandwidth = floors.read_bandwidth("cpu", 1 << 20, reps=2)
    assert 1e8 < bandwidth < 1e13  # 0.1 GB/s to 10 TB/s
    assert 1e8 < floors.matmul_rate("cpu", torch.float32, size=128, reps=2) < 1e15


# ------------------------------------------------------------------------------------------------- ratio_stats


def _miss_probability_by_enumeration(n: int, k: int) -> float:
    """P(the median lies outside [x_(k), x_(n-k+1)]) by enumerating all 2^n patterns of which ratios fall below
    the true median (each with probability 1/2, independently): it is outside when fewer than k fall below
    (x_(k) above it) or fewer than k fall above (x_(n-k+1) below it)."""
    missed = 0
    for pattern in itertools.product((0, 1), repeat=n):
        below = sum(pattern)
        missed += below < k or n - below < k
    return missed / 2**n


@pytest.mark.parametrize("n", range(6, 17))
def test_interval_rank_is_the_widest_coverage_that_holds(n):
    k, achieved = ratio_stats.median_rank(n, 0.95)
    assert achieved == pytest.approx(1 - _miss_probability_by_enumeration(n, k))
    assert achieved >= 0.95
    if k + 1 <= (n + 1) // 2:  # one rank further in would cover less than asked
        assert 1 - _miss_probability_by_enumeration(n, k + 1) < 0.95


def test_interval_ranks_by_hand():
    # n = 6: only [min, max], covering 1 - 2/64. n = 10: P(B <= 1) = 11/1024 <= 0.025 < P(B <= 2) = 56/1024.
    assert ratio_stats.median_rank(6) == (1, pytest.approx(1 - 2 / 64))
    assert ratio_stats.median_rank(10) == (2, pytest.approx(1 - 22 / 1024))
    # n = 30: the sign-test table's ranks 10 and 21.
    assert ratio_stats.median_rank(30)[0] == 10
    with pytest.raises(ValueError, match="use at least 6"):
        ratio_stats.median_rank(5)


def test_summary_of_ratios_by_hand():
    ratios = [1.10, 0.90, 1.00, 1.05, 0.95, 1.20, 0.97, 1.02, 0.99, 1.01]
    summary = ratio_stats.summarize(ratios)
    # Sorted: 0.90 0.95 0.97 0.99 1.00 1.01 1.02 1.05 1.10 1.20; k = 2 -> [0.95, 1.10]; median (1.00 + 1.01) / 2.
    assert (summary.median, summary.low, summary.high) == (pytest.approx(1.005), 0.95, 1.10)
    assert (summary.minimum, summary.maximum, summary.n) == (0.90, 1.20, 10)
    assert summary.half_width == pytest.approx(0.075 / 1.005)
    assert summary.text().startswith("1.005x [0.950, 1.100] (97.9 % interval of the median, ±7.5 %; 10 repetitions")


def test_paired_ratios_pair_each_repetition():
    assert ratio_stats.paired_ratios([2.0, 3.0], [1.0, 4.0]) == [2.0, 0.75]
    with pytest.raises(ValueError, match="pair each repetition"):
        ratio_stats.paired_ratios([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="not positive"):
        ratio_stats.paired_ratios([1.0], [0.0])


# ------------------------------------------------------------------------------------------------- code_versions


def _write_version(root: Path, package: str, number: int) -> Path:
    """A package whose top level and a lazily imported submodule both say which version they are."""
    (root / package).mkdir(parents=True)
    (root / package / "__init__.py").write_text(
        f"VERSION = {number}\n\ndef lazy():\n    from {package}.sub import NUMBER\n\n    return NUMBER\n"
    )
    (root / package / "sub.py").write_text(f"NUMBER = {number}\n")
    return root


def test_two_versions_of_a_package_run_side_by_side(tmp_path, monkeypatch):
    """Invariant: under a version's `active()`, every import (a lazy one inside a function included) resolves to that
    version's own files, and leaving the block restores the other version; the version imported normally is left
    in place by loading another."""
    import code_versions

    package = "bench_probe_pkg"
    monkeypatch.syspath_prepend(str(_write_version(tmp_path / "one", package, 1)))
    current = code_versions.CodeVersion.current(package)
    other = code_versions.CodeVersion.load(package, _write_version(tmp_path / "two", package, 2), "two")
    try:
        import bench_probe_pkg

        assert bench_probe_pkg.VERSION == 1 and bench_probe_pkg.lazy() == 1
        with other.active():
            import bench_probe_pkg as inside

            assert inside.VERSION == 2 and inside.lazy() == 2
            assert other.origin() == str((tmp_path / "two" / package).resolve())
        with current.active():
            assert sys.modules[f"{package}.sub"].NUMBER == 1
        assert sys.modules[package].VERSION == 1 and sys.modules[f"{package}.sub"].NUMBER == 1
    finally:
        for name in [k for k in sys.modules if k == package or k.startswith(package + ".")]:
            del sys.modules[name]


def test_loading_a_folder_without_the_package_says_what_to_pass(tmp_path):
    import code_versions

    with pytest.raises(SystemExit, match="holds no gtpo/__init__.py"):
        code_versions.CodeVersion.load("gtpo", tmp_path, "empty")


def test_extract_commit_reads_the_history_or_says_why_not(tmp_path):
    """The extracted src of HEAD is HEAD's (its gtpo/__init__.py byte for byte); an unknown commit is one line."""
    import subprocess

    import code_versions

    root = Path(__file__).resolve().parents[1]
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True).returncode != 0:
        pytest.skip("needs a git checkout")
    source = code_versions.extract_commit("HEAD", "src", repository=root)
    committed = subprocess.run(["git", "show", "HEAD:src/gtpo/__init__.py"], cwd=root, capture_output=True).stdout
    assert (source / "gtpo" / "__init__.py").read_bytes() == committed
    with pytest.raises(SystemExit, match="name a commit this clone has"):
        code_versions.extract_commit("0000000000", "src", repository=root)


# ------------------------------------------------------------------------------------------------- bench_loss_step


def test_step_ratio_is_the_median_of_per_repetition_ratios_not_a_ratio_of_medians():
    """bench_loss_step's figure pairs each arm's repetition with the reference's same repetition (issue 47, item 3):
    here the per-repetition median (1.0) differs from the ratio of the medians (0.4 / 0.35), and the printed figure
    is the former, with the interval of ranks 1 and 6 of six ratios."""
    import bench_loss_step

    gtpo = [0.1, 0.2, 0.3, 0.6, 0.5, 0.6]
    trl = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]  # forward alone: ratios 1, 1, 1, 1.5, 1, 1
    zero = [0.0] * 6
    assert ratio_stats.median(gtpo) / ratio_stats.median(trl) == pytest.approx(0.4 / 0.35)
    times = {"trl": {"forward": trl, "backward": zero}, "gtpo": {"forward": gtpo, "backward": zero}}
    lines = bench_loss_step._ratio_lines(times, "trl", 6)
    assert lines[0].startswith("gtpo / trl, forward + backward: 1.000x [1.000, 1.500] (96.9 % interval")
    assert lines[1].startswith("gtpo / trl, forward: 1.000x")
    few = {arm: {k: v[:2] for k, v in t.items()} for arm, t in times.items()}
    assert "no interval under 6 repetitions" in bench_loss_step._ratio_lines(few, "trl", 2)[0]


# ------------------------------------------------------------------------------------- the steady decode step


def test_steady_step_differences_out_the_prefill_and_skips_the_capturing_repetition():
    """bench_decode_graph's steady-state replayed step: a call costs prefill P + steps x step S (+ capture C in the
    first repetition); (full - half) / (step difference) is S whatever P and C, from the second repetition on."""
    import bench_decode_graph

    prefill, step, capture = 0.050, 0.002, 0.400
    full = [(capture + prefill + 128 * step, 128), (prefill + 128 * step, 128), (prefill + 128 * step + 0.001, 128)]
    half = [(capture + prefill + 64 * step, 64), (prefill + 64 * step, 64), (prefill + 64 * step, 64)]
    # Repetitions 2 and 3 give 2 ms and 2 ms + 1 ms / 64; their median is the mean of the two.
    assert bench_decode_graph.steady_step(full, half) == pytest.approx(step + 0.001 / 64 / 2)
    # One repetition only: it is used (capture included in both calls, so it cancels too).
    assert bench_decode_graph.steady_step(full[:1], half[:1]) == pytest.approx(step)
    # Rows that ended as early in both calls leave nothing to difference.
    assert bench_decode_graph.steady_step([(0.1, 5), (0.1, 5)], [(0.09, 5), (0.09, 5)]) is None
    # A few steps apart the difference is the timings' noise (a CPU smoke run at 4 tokens once came out negative,
    # under the floor, and failed `make test`): no figure under MIN_STEADY_STEPS steps, one from there on.
    few = bench_decode_graph.MIN_STEADY_STEPS - 1
    assert bench_decode_graph.steady_step([(0.05, 2 * few)], [(0.07, few)]) is None
    enough = bench_decode_graph.MIN_STEADY_STEPS
    assert bench_decode_graph.steady_step([(0.05 + enough * step, 2 * enough)], [(0.05, enough)]) == pytest.approx(step)


def test_decode_benchmark_smoke_run_gives_no_steady_step_and_no_measurement_bug(capsys):
    """A smoke run of 4 tokens (2 steps between the full and the half decode) does not read a steady step from the
    difference (noise: it once came out under the floor and exited 1); it says so, and no MEASUREMENT BUG is printed."""
    import bench_decode_graph

    bench_decode_graph.main(["--shape", "tiny", "--rows", "2", "--tokens", "4", "--prompt", "6", "--reps", "2"])
    out = capsys.readouterr().out
    assert "steady replayed graph not measured (under 16 steps between the two decodes)" in out, out
    assert "MEASUREMENT BUG" not in out


def test_decode_benchmark_profiles_a_warm_graph_decode_on_request(capsys):
    """`--profile` (for the GPU check that finds where a replayed step's time goes) prints the profiler's table of
    one more static-graph decode after the timing, by host time on a CPU (by device time too on CUDA), and the
    timing lines stay as they were; without it no table is printed."""
    import bench_decode_graph

    args = ["--shape", "tiny", "--rows", "2", "--tokens", "4", "--prompt", "6", "--reps", "1"]
    bench_decode_graph.main(args)
    plain = capsys.readouterr().out
    assert "2 rows, 4 tokens: a token step decode" in plain and "profile of" not in plain
    bench_decode_graph.main([*args, "--profile"])
    profiled = capsys.readouterr().out
    assert "2 rows, 4 tokens: a token step decode" in profiled
    assert "profile of one static-graph decode (2 rows, 4 tokens), by host time:" in profiled
    assert "Self CPU time total" in profiled


def test_decode_benchmark_prints_the_capture_cost_and_runs_the_counter_sampler(capsys, monkeypatch):
    """Issue 58 item 2: `--sampler counter` (the draw recorded inside the step) runs, its graph's tokens equal the eager
    fixed-shape path's, and each line ends with the capture's cost: on a CPU nothing is recorded, and with a stand-in
    recorder registered for the CPU (it runs the step once at capture, as CUDA's warm-up does) each graph arm's
    first repetition records one graph, timed; later repetitions record none (kept)."""
    import bench_decode_graph

    import gtpo.decoding.graph as graph_decode

    args = ["--shape", "tiny", "--rows", "2", "--tokens", "8", "--prompt", "6", "--reps", "2", "--sampler", "counter"]
    bench_decode_graph.main(args)
    plain = capsys.readouterr().out
    assert "sampler counter" in plain and "graph tokens == eager static tokens: True (expected)" in plain
    assert plain.rstrip().endswith("graph capture: nothing recorded (no recorder on this device)")

    class OnceAtCapture:
        def __init__(self, forward):
            forward()
            self.forward = forward

        def __call__(self):
            return self.forward()

    monkeypatch.setitem(graph_decode.RECORDERS, "cpu", OnceAtCapture)
    bench_decode_graph.main(args)
    recorded = capsys.readouterr().out
    assert "graph tokens == eager static tokens: True" in recorded
    assert re.search(r"graph capture static-graph \d+\.\d ms \(1 graph\), static-graph-half \d+\.\d ms \(1 graph\)$",
                     recorded.rstrip()), recorded  # fmt: skip
    two = bench_decode_graph.capture_text({"static-graph": (2, 0.0123)})
    assert two == "graph capture static-graph 12.3 ms (2 graphs)"


def test_step_benchmark_scratch_folder_takes_an_arm_named_by_a_path():
    """--baseline-src DIR names its arm gtpo@DIR; the trainer's temporary folder must still be one fresh folder under
    the temporary directory (a '/' in mkdtemp's prefix made it fail with FileNotFoundError before any timing)."""
    import tempfile

    import bench_loss_step

    for arm in ("gtpo", "gtpo@54800c5", "gtpo@.whl-gpu/base-54800c5", "gtpo@/abs/path with space"):
        folder = Path(bench_loss_step.scratch_dir(arm))
        assert folder.is_dir() and folder.parent == Path(tempfile.gettempdir()), arm
        assert folder.name.startswith("bench-loss-gtpo"), folder.name
        folder.rmdir()


def test_step_benchmark_rotates_the_arms_turns_so_each_runs_in_every_position():
    """bench_loss_step's arms take turns in an order rotated by one each repetition: over any len(arms) consecutive
    repetitions each arm runs once in each position (a fixed order let a position's bias pass for a layout's cost),
    and every repetition still runs every arm once, so the per-repetition pairing stays."""
    import collections

    import bench_loss_step

    arms = ["trl", "gtpo", "gtpo-padded"]
    orders = [bench_loss_step.turn_order(arms, rep) for rep in range(1, 31)]
    assert all(sorted(order) == sorted(arms) for order in orders)
    rotated = [["gtpo", "gtpo-padded", "trl"], ["gtpo-padded", "trl", "gtpo"], ["trl", "gtpo", "gtpo-padded"]]
    assert orders[:3] == rotated
    positions = collections.Counter((arm, order.index(arm)) for order in orders for arm in order)
    assert set(positions.values()) == {10}  # 30 repetitions: each arm 10 times in each of the 3 positions
    assert bench_loss_step.turn_order(["only"], 7) == ["only"]


def test_decode_benchmark_compiled_arm_decodes_through_the_compiled_model(capsys):
    """`--compile BACKEND` (the GPU check of whether fusing the step's kernels brings the replayed step under 3x its
    floor) adds the arm compiled-graph, decoded through torch.compile'd forward, and says whether its tokens equal
    the uncompiled graph's. Backend "eager" here: dynamo traces the fixed cache's step (what the GPU's inductor
    needs) without a C++ compile; float32 on a CPU gives the same tokens."""
    import bench_decode_graph

    try:
        bench_decode_graph.main(["--shape", "tiny", "--rows", "2", "--tokens", "4", "--prompt", "6", "--reps", "2",
                                 "--compile", "eager"])  # fmt: skip
    finally:
        torch._dynamo.reset()  # no compiled code or guards left for the tests after this one
    out = capsys.readouterr().out
    assert re.search(r"compiled-graph [\d.]+ ms", out), out
    assert "compiled graph tokens == graph tokens: True" in out


# ------------------------------------------------------------------------------------- the generation profile


def test_step_benchmark_profiles_only_the_first_generation_of_the_last_step():
    """`bench_step.py --profile-generation` profiles one generation: the first call in the last step (global_step
    max_steps - 1; an earlier call, GTPO's initial-entropy pass at step 0 or a second call in that step, runs plain),
    returns what the wrapped method returns, and its table names the ops the call ran; the timed children never
    take the flag (parse_args default False)."""
    from types import SimpleNamespace

    import bench_step

    calls = []

    def generate(ids):
        calls.append(ids)
        return torch.ones(4, 4) @ torch.full((4, 4), float(ids))

    trainer = SimpleNamespace(_generate_single_turn=generate, state=SimpleNamespace(global_step=0),
                              args=SimpleNamespace(max_steps=3))  # fmt: skip
    out = bench_step._profile_last_generation(trainer, SimpleNamespace(device="cpu"))
    seen = []
    for step, ids in ((0, 1), (1, 2), (2, 3), (2, 4)):
        trainer.state.global_step = step
        assert torch.equal(trainer._generate_single_turn(ids), torch.full((4, 4), 4.0 * ids))
        assert ("table" in out) == (step == 2), step
        seen.append(dict(out))
    assert calls == [1, 2, 3, 4] and out["seconds"] > 0
    assert seen[3] == seen[2]  # the second call of the last step left the profile as the first made it
    assert "aten::mm" in out["table"] and "Self CPU" in out["table"]
    assert bench_step.parse_args(["--model", "smollm2"]).profile_generation is False


def test_a_paired_worker_that_fails_reports_it_and_releases_the_other_arm(monkeypatch):
    """bench_step's paired run has one worker process per arm taking turns; if one fails before or while training, it
    must say why (its error's text on the queue, which run_paired turns into a one-line exit) and release the other:
    mark itself done, hand over the turn, and break the start barrier, so the other neither waits for a turn that
    never comes nor for a partner that never starts. Run here in-process with thread primitives."""
    import queue
    import threading
    from types import SimpleNamespace

    import bench_step

    def broken_model(name, device):
        raise RuntimeError("no such model here")

    monkeypatch.setattr(bench_step, "_build_model", broken_model)
    condition, turn, done = threading.Condition(), SimpleNamespace(value=0), [0, 0]
    out, ready = queue.Queue(), threading.Barrier(2)
    options = SimpleNamespace(threads=None, model="tiny", device="cpu", warmup=0, steps=1)
    bench_step._paired_worker(options, "gtpo", condition, turn, done, out, ready)
    assert out.get_nowait() == ("gtpo", "RuntimeError: no such model here")
    assert done == [1, 0] and turn.value == 1 and ready.broken
