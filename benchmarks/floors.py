"""What a benchmark's figure is measured against, and the check that it does not beat it (issue 47, item 1).

A floor is the time no implementation can go under on this device: reading the model's weights once (a decoding
step reads each weight at least once) at the device's measured read bandwidth, or a step's needed FLOPs at its
measured matmul rate. A figure below its floor is a measurement bug (an untimed asynchronous launch, a cold
read timed as the floor, a wrong byte count), never a fast kernel: :func:`ratio_to_floor` refuses to give such
a ratio and :func:`floor_ratio_text` prints the bug instead, loudly.

    bandwidth = read_bandwidth(device, parameter_bytes(model))
    floor = weight_read_seconds(parameter_bytes(model), bandwidth)
    print(floor_ratio_text("graph step", step_seconds, floor, "the weights' read"))

Timing: CUDA events on a GPU (the device's own clock, so no host launch jitter), the wall clock on a CPU
(:class:`Stopwatch`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

# Beyond the caches the read rate of DRAM/HBM is flat: a buffer of 1 GiB measures it on every device here (an
# H100's L2 is 50 MB, a Xeon's L3 a few hundred MB at most) without doubling a large model's memory.
MAX_PROBE_BYTES = 1 << 30
# Below this a probe's time is a few microseconds on a GPU, all launch: no rate is read from it.
MIN_PROBE_BYTES = 1 << 20


class BelowFloorError(ValueError):
    """A measured time under its floor: the measurement, not the code, is wrong."""


class Stopwatch:
    """Marks on the device's timeline: CUDA events on CUDA (elapsed GPU time between two marks), the host's
    `time.perf_counter` elsewhere.

    Args:
        device: "cuda" or "cpu" (a torch.device's type).
    """

    def __init__(self, device: str):
        self.cuda = str(device).startswith("cuda")

    def mark(self):
        """A point in time: a recorded ``torch.cuda.Event`` on CUDA, a float of seconds elsewhere."""
        if self.cuda:
            import torch

            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def seconds(self, start, end) -> float:
        """Seconds from mark ``start`` to mark ``end`` (waits for ``end`` to be reached on CUDA)."""
        if self.cuda:
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        return end - start

    def sync(self) -> None:
        """Wait for the device's queued work (so the next mark starts with an idle device)."""
        if self.cuda:
            import torch

            torch.cuda.synchronize()


def profile_ops(run: Callable[[], object], device: str):
    """One call of ``run`` under torch.profiler (host ops, and the device's kernels on CUDA, waited for), as
    ``key_averages()``: the table a benchmark's ``--profile`` prints, sorted as it needs."""
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if str(device).startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profiler:
        run()
        Stopwatch(device).sync()
    return profiler.key_averages()


def best_seconds(run: Callable[[], object], device: str, reps: int = 5, warmup: int = 2) -> float:
    """The fastest of ``reps`` timed calls of ``run`` after ``warmup`` untimed ones (the fastest, because a floor
    must not be raised by a disturbed repetition).

    Args:
        run: the work, called with no arguments.
        device: where it runs ("cuda" or "cpu").
        reps, warmup: timed and untimed calls.

    Returns:
        Seconds of the fastest timed call.
    """
    watch = Stopwatch(device)
    for _ in range(warmup):
        run()
    watch.sync()
    best = float("inf")
    for _ in range(reps):
        start = watch.mark()
        run()
        end = watch.mark()
        best = min(best, watch.seconds(start, end))
    return best


def probe_bytes(weight_bytes: int) -> int:
    """The size of the buffer that measures the read bandwidth a model's weights see: the weights' own size
    (a small model's weights sit in a cache, and so does a probe of their size), clamped to
    [MIN_PROBE_BYTES, MAX_PROBE_BYTES]."""
    if weight_bytes <= 0:
        raise ValueError(f"weight_bytes must be positive, got {weight_bytes}: pass parameter_bytes(model)")
    return max(MIN_PROBE_BYTES, min(int(weight_bytes), MAX_PROBE_BYTES))


def read_bandwidth(device: str, nbytes: int, dtype=None, reps: int = 5) -> float:
    """The device's read bandwidth in bytes a second: the faster of a warm reduction over an ``nbytes`` buffer
    (reads each byte once) and a warm copy of it (reads each byte once and writes it once: 2 x nbytes moved).
    The faster, because a floor must be the lowest time the device allows.

    Args:
        device: "cuda" or "cpu".
        nbytes: the buffer's size (see :func:`probe_bytes`).
        dtype: the buffer's dtype (default bfloat16 on CUDA, float32 elsewhere).
        reps: timed repetitions of each; the fastest counts.

    Returns:
        Bytes per second.
    """
    import torch

    if dtype is None:
        dtype = torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    itemsize = torch.empty((), dtype=dtype).element_size()
    source = torch.ones(max(1, nbytes // itemsize), device=device, dtype=dtype)
    target = torch.empty_like(source)
    moved = source.numel() * itemsize
    with torch.no_grad():
        reduce = best_seconds(lambda: source.sum(), device, reps)
        copy = best_seconds(lambda: target.copy_(source), device, reps)
    return max(moved / reduce, 2 * moved / copy)


def matmul_rate(device: str, dtype, size: int | None = None, reps: int = 5) -> float:
    """FLOP/s of a warm square matmul in ``dtype``, the fastest of ``reps`` (default size 8192 on CUDA, where
    2048 leaves an H100 at a third of its rate, and 2048 on a CPU).

    Returns:
        FLOPs per second (2 x size^3 a matmul).
    """
    import torch

    if size is None:
        size = 8192 if str(device).startswith("cuda") else 2048
    a = torch.randn(size, size, device=device, dtype=dtype)
    with torch.no_grad():
        best = best_seconds(lambda: a @ a, device, reps)
    return 2 * size**3 / best


def parameter_bytes(model) -> int:
    """Bytes of the model's parameters, each counted once (a tied embedding and head is one tensor)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def weight_read_seconds(weight_bytes: int, bandwidth: float) -> float:
    """The time to read ``weight_bytes`` once at ``bandwidth`` bytes a second: a decoding step's floor."""
    if bandwidth <= 0:
        raise ValueError(f"bandwidth must be positive bytes/s, got {bandwidth}")
    return weight_bytes / bandwidth


def flop_seconds(flops: float, rate: float) -> float:
    """The time to compute ``flops`` at ``rate`` FLOP/s: a compute-bound step's floor."""
    if rate <= 0:
        raise ValueError(f"rate must be positive FLOP/s, got {rate}")
    return flops / rate


def ratio_to_floor(measured: float, floor: float) -> float:
    """``measured / floor``, at least 1 for any true measurement.

    Raises:
        BelowFloorError: when ``measured < floor``: the figure is a measurement bug, not a result.
    """
    if floor <= 0:
        raise ValueError(f"a floor must be positive, got {floor}")
    if measured < floor:
        raise BelowFloorError(f"{measured * 1e3:.4g} ms is below its floor of {floor * 1e3:.4g} ms")
    return measured / floor


def floor_ratio_text(what: str, measured: float, floor: float, floor_name: str) -> str:
    """``"<what> = 2.31x <floor_name>"``, or, for a figure below its floor, a line that starts with
    ``MEASUREMENT BUG`` and gives both times instead of the ratio (callers exit non-zero after printing it:
    see :func:`any_bug`)."""
    try:
        return f"{what} = {ratio_to_floor(measured, floor):.2f}x {floor_name}"
    except BelowFloorError as error:
        return f"MEASUREMENT BUG: {what}: {error}, under {floor_name}; this figure cannot be right, do not quote it"


def any_bug(lines: list[str]) -> bool:
    """Whether any of the printed lines reports a figure below its floor."""
    return any("MEASUREMENT BUG" in line for line in lines)
