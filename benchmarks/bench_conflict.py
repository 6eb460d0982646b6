"""Conflict-span detection: `gtpo.core.conflict_spans` against the paper's bincount algorithm.

Run by hand (not in CI):  .venv/bin/python benchmarks/bench_conflict.py  [--quick] [--skip-paper] [--threads N]

1. Side by side at the paper's shape (G=12 completions, T=1500 tokens, V=151,936, Qwen's vocabulary):
   time and peak extra memory of `conflict_spans` and of the paper's algorithm (App. 16, Listing 2:
   presence maps over vocabulary×length bins built with `torch.bincount`), their ratios, and a check
   that both return the same spans.
2. Our cost for G ∈ {8, 12, 16, 64} and T ∈ {512, 1500, 4096, 16384}, one group per call, with the
   O(G²·T) pairwise-comparison alternative measured beside it; on CUDA too when a GPU is present.
3. Our cost at three vocabulary sizes, to show it does not depend on V.

Inputs look like rollouts: ragged lengths in [T/2, T], a shared 12-token head (a formatting tag) and a
shared 6-token tail before each completion's end, random tokens in between, right padding with a pad id,
advantages of both signs plus a zero.

How memory is measured. `tracemalloc` does not see torch's allocations, so two methods are used:
- allocator peak (the figure the ratios use): the run is repeated under `torch.profiler` with
  `profile_memory=True`; every allocation and free made through torch's CPU allocator is recorded as a
  "[memory]" event with its size; the peak of their running sum is the most memory the call held at
  once above what existed before it (inputs excluded, outputs and temporaries included). On CUDA,
  `torch.cuda.max_memory_allocated()` minus the allocation before the call.
- RSS peak (cross-check, head-to-head only): a fresh child process builds the inputs, reads its resident
  set size, makes one cold call and reads `ru_maxrss` (the process's peak RSS). This counts pages the
  OS really handed out, including allocator slack, so it is coarse (pages, malloc arenas) for small
  calls and exact enough for gigabyte ones.
Times are wall-clock `time.perf_counter()`: the median of repeated calls after a warm-up for our code, a
single cold call for the paper's algorithm (a second call would take as long and double the run time).
The machine's other load shows up in the times (the load average is printed); ratios are taken within
one run. CPU runs use one torch thread by default: on a small shared machine two OpenMP threads spend
most of their time waiting for each other whenever the other core is busy (we measured 1.4 ms with one
thread and 200 ms with two for the same 12x1500 call under a load average of 10).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from gtpo.core import conflict_spans

PAPER_SHAPE = dict(group_size=12, length=1500, vocab=151_936)
TABLE_G = (8, 12, 16, 64)
TABLE_T = (512, 1500, 4096, 16384)
HEAD, TAIL = 12, 6  # shared formatting tokens at the start and before the end of every completion


# --------------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------------


def make_groups(group_size: int, length: int, vocab: int, n_groups: int = 1, seed: int = 0, device="cpu"):
    """Rollout-like right-padded groups: ids (N, T), mask (N, T) bool, advantages (N,)."""
    g = torch.Generator().manual_seed(seed)
    n = n_groups * group_size
    ids = torch.randint(0, vocab, (n, length), generator=g)  # (N, T)
    lengths = torch.randint(length // 2, length + 1, (n,), generator=g)  # (N,)
    lengths[0] = length
    head = torch.randint(0, vocab, (HEAD,), generator=g)
    tail = torch.randint(0, vocab, (TAIL,), generator=g)
    ids[:, :HEAD] = head
    tail_pos = lengths.unsqueeze(-1) - TAIL + torch.arange(TAIL)  # (N, TAIL)
    ids.scatter_(1, tail_pos, tail.expand(n, TAIL))
    mask = torch.arange(length) < lengths.unsqueeze(-1)  # (N, T)
    ids[~mask] = vocab - 1  # a pad id that is also a real token
    adv = torch.randn(n, generator=g)  # (N,)
    adv[0::group_size], adv[1::group_size], adv[2::group_size] = 1.0, -1.0, 0.0  # both signs and a zero
    return ids.to(device), mask.to(device), adv.to(device)


# --------------------------------------------------------------------------------------------------
# The paper's algorithm (written for this benchmark)
# --------------------------------------------------------------------------------------------------


def paper_bincount_spans(ids, mask, advantages, vocab_size):
    """The paper's conflict detection for one group (App. 16, Listing 2), written from its description.

    Each (position, token) pair gets its own bin ``t·V + v``; `torch.bincount` over the positive and the
    negative completions' keys builds two presence maps of V·L bins each, and a key conflicts when both
    maps hold it. Backward alignment flips and rotates each row so its last valid token comes first.
    Spans are the `cumprod` runs. Fixed here: validity comes from the mask (the listing compared ids
    with a pad id) and the stray `torch.ones()` is gone. Tensors stay alive to the end of the function,
    as in the listing, which is where its peak memory comes from.
    """
    g, length = ids.shape
    device = ids.device
    valid = mask.bool()  # (G, L)
    pos_flags, neg_flags = advantages > 0, advantages < 0  # (G,)
    step_idx = torch.arange(length, device=device).unsqueeze(0)  # (1, L)

    # Forward: presence maps over V·L (position, token) bins.
    keys = (step_idx * vocab_size + ids).view(-1)  # (G·L,)
    rpt_pos = (pos_flags.unsqueeze(1) & valid).view(-1)  # (G·L,)
    rpt_neg = (neg_flags.unsqueeze(1) & valid).view(-1)  # (G·L,)
    freq_pos = torch.bincount(keys[rpt_pos], minlength=vocab_size * length).clamp_max(1)  # (V·L,)
    freq_neg = torch.bincount(keys[rpt_neg], minlength=vocab_size * length).clamp_max(1)  # (V·L,)
    conflict_raw = (freq_pos.bool() & freq_neg.bool())[keys].view(g, length)  # (G, L)
    conflict_raw = conflict_raw & valid & (pos_flags | neg_flags).unsqueeze(1)
    conflict_fwd = torch.cumprod(conflict_raw.to(torch.int), dim=1).bool()  # (G, L)

    # Backward: flip, rotate the padding away, same maps, rotate back.
    seq_len = valid.sum(-1)  # (G,)
    pad_len = length - seq_len  # (G,)
    ids_rev = ids.flip(-1).gather(1, (step_idx + pad_len.unsqueeze(1)) % length)  # (G, L)
    valid_rev = step_idx < seq_len.unsqueeze(1)  # (G, L)
    keys_rev = (step_idx * vocab_size + ids_rev).view(-1)  # (G·L,)
    rpt_pos_r = (pos_flags.unsqueeze(1) & valid_rev).view(-1)
    rpt_neg_r = (neg_flags.unsqueeze(1) & valid_rev).view(-1)
    freq_pos_r = torch.bincount(keys_rev[rpt_pos_r], minlength=vocab_size * length).clamp_max(1)  # (V·L,)
    freq_neg_r = torch.bincount(keys_rev[rpt_neg_r], minlength=vocab_size * length).clamp_max(1)  # (V·L,)
    conflict_raw_rev = (freq_pos_r.bool() & freq_neg_r.bool())[keys_rev].view(g, length)  # (G, L)
    conflict_raw_rev = conflict_raw_rev & valid_rev & (pos_flags | neg_flags).unsqueeze(1)
    conflict_rev = torch.cumprod(conflict_raw_rev.to(torch.int), dim=1).bool()  # (G, L)
    conflict_bwd = conflict_rev.gather(1, (step_idx - pad_len.unsqueeze(1)) % length).flip(-1)  # (G, L)
    return conflict_fwd, conflict_bwd & valid


# --------------------------------------------------------------------------------------------------
# Measurement
# --------------------------------------------------------------------------------------------------


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def median_time(fn, device, budget_s=0.4, min_reps=3, max_reps=200):
    """Median wall time of fn() in seconds, after one warm-up call."""
    fn()
    sync(device)
    times = []
    start = time.perf_counter()
    while len(times) < min_reps or (time.perf_counter() - start < budget_s and len(times) < max_reps):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def profiled_call(fn, device="cpu"):
    """Run fn() once; return (its result, seconds, allocator peak bytes above the start; see docstring)."""
    if torch.device(device).type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        return out, time.perf_counter() - t0, torch.cuda.max_memory_allocated() - before
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        t0 = time.perf_counter()
        out = fn()
        elapsed = time.perf_counter() - t0
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    finally:
        os.remove(path)
    mem = sorted(
        (e for e in events if e.get("name") == "[memory]"), key=lambda e: (e["ts"], e["args"].get("Ev Idx", 0))
    )
    held = peak = 0
    for e in mem:  # running sum of allocations (+) and frees (-) made during the call
        held += e["args"]["Bytes"]
        peak = max(peak, held)
    return out, elapsed, peak


def allocator_peak_bytes(fn, device="cpu") -> int:
    return profiled_call(fn, device)[2]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(algo: str, group_size: int, length: int, vocab: int, threads: int) -> dict:
    """In a fresh process, one cold call: time, allocator peak, and peak-RSS increase (ru_maxrss, KiB).

    The paper's algorithm runs once only (it takes seconds and gigabytes); its spans are compared with
    ours here.
    """
    torch.set_num_threads(threads)
    ids, mask, adv = make_groups(group_size, length, vocab)
    torch.zeros(1).add_(1)  # load torch's kernels before the baseline
    before = max(rss_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    if algo == "paper":
        (fw, bw), elapsed, alloc = profiled_call(lambda: paper_bincount_spans(ids, mask, adv, vocab))
    else:
        t0 = time.perf_counter()
        fw, bw = conflict_spans(ids, mask, adv, group_size)
        elapsed, alloc = time.perf_counter() - t0, None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    ours = conflict_spans(ids, mask, adv, group_size)
    same = torch.equal(fw, ours[0]) and torch.equal(bw, ours[1])
    return {"time_s": elapsed, "alloc_peak": alloc, "rss_peak_delta": max(0, peak - before), "same_spans": same}


def run_child(algo: str, group_size: int, length: int, vocab: int) -> dict:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        algo,
        str(group_size),
        str(length),
        str(vocab),
        str(torch.get_num_threads()),
    ]
    out = subprocess.run(
        cmd, capture_output=True, text=True, check=True, env={**os.environ, "PYTHONWARNINGS": "ignore"}
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def fmt_bytes(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_time(s: float) -> str:
    return f"{s:.2f} s" if s >= 1 else f"{s * 1e3:.3f} ms"


# --------------------------------------------------------------------------------------------------
# Sections
# --------------------------------------------------------------------------------------------------


def head_to_head(skip_paper: bool) -> None:
    g, t, v = PAPER_SHAPE["group_size"], PAPER_SHAPE["length"], PAPER_SHAPE["vocab"]
    print(f"== 1. Side by side, one group: G={g}, T={t}, V={v:,} (CPU, {torch.get_num_threads()} threads) ==")
    ids, mask, adv = make_groups(g, t, v)
    ours_time = median_time(lambda: conflict_spans(ids, mask, adv, g), "cpu", budget_s=1.0)
    ours_alloc = allocator_peak_bytes(lambda: conflict_spans(ids, mask, adv, g))
    ours_rss = run_child("ours", g, t, v)
    fw, bw = conflict_spans(ids, mask, adv, g)
    print(f"spans found: forward {fw.sum(-1).tolist()}, backward {bw.sum(-1).tolist()} tokens per row")
    rows = [("gtpo.core.conflict_spans", ours_time, ours_alloc, ours_rss["rss_peak_delta"])]
    # GTPOTrainer checks its first batch in full and skips the O(N·T) checks afterwards (validate=False).
    unchecked = lambda: conflict_spans(ids, mask, adv, g, validate=False)  # noqa: E731
    trainer_time = median_time(unchecked, "cpu", budget_s=1.0)
    rows.append(
        (
            "  trainer steps (validate=False)",
            trainer_time,
            allocator_peak_bytes(unchecked),
            None,
        )
    )
    # Worst case for the window-by-window search: every row is one shared sequence cut at its own length,
    # so spans run to the end of each row and every window up to T is searched.
    same = torch.where(mask, ids[0:1].expand_as(ids), ids)  # (G, T)
    worst = lambda: conflict_spans(same, mask, adv, g)  # noqa: E731
    wf, _ = worst()
    rows.append(
        (
            f"  worst case (spans up to {int(wf.sum(-1).max())})",
            median_time(worst, "cpu", budget_s=1.0),
            allocator_peak_bytes(worst),
            None,
        )
    )
    if not skip_paper:
        paper = run_child("paper", g, t, v)  # one cold call in a fresh process
        rows.insert(0, ("paper (bincount, Listing 2)", paper["time_s"], paper["alloc_peak"], paper["rss_peak_delta"]))
    print(f"{'algorithm':<34}{'time':>10}{'extra memory (allocator peak)':>32}{'peak RSS increase':>20}")
    for name, s, alloc, rss in rows:
        rss_text = "" if rss is None else fmt_bytes(rss)
        print(f"{name:<34}{fmt_time(s):>10}{fmt_bytes(alloc):>32}{rss_text:>20}")
    print("(ours: median of repeated warm calls; paper: one cold call; RSS: one cold call each in a fresh process)")
    if not skip_paper:
        print(f"same spans from both: {paper['same_spans']}")
        print(
            f"ratio paper/ours: time {paper['time_s'] / ours_time:,.0f}x, "
            f"extra memory {paper['alloc_peak'] / max(ours_alloc, 1):,.0f}x (allocator), "
            f"{paper['rss_peak_delta'] / max(ours_rss['rss_peak_delta'], 4096):,.0f}x "
            "(RSS, ours floored at one 4 KiB page)"
        )
    print(
        f"target: about 0.3 ms per {g}x{t} group on the trainer's path -> {fmt_time(trainer_time)} "
        f"({'met' if trainer_time < 0.4e-3 else 'NOT met'}; times depend on the machine's load, see the docstring)"
    )
    print()


def cost_table(device: str, quick: bool) -> None:
    from gtpo.core import conflicts  # the two detection methods are selected through this switch

    print(f"== 2. Our cost per call, one group, V={PAPER_SHAPE['vocab']:,}, device={device} ==")
    print(f"   conflict_spans compares all row pairs for G <= {conflicts.PAIRWISE_MAX_GROUP} and sorts above;")
    print("   both methods are timed on every shape to show the crossover")
    print(f"{'G':>4}{'T':>7}{'time':>12}{'ns/token':>10}{'extra memory':>15}{'pairs only':>13}{'sorting only':>14}")
    lengths = TABLE_T[:2] if quick else TABLE_T
    default_max = conflicts.PAIRWISE_MAX_GROUP
    budget = 0.15 if quick else 0.25
    try:
        for g in TABLE_G:
            for t in lengths:
                ids, mask, adv = make_groups(g, t, PAPER_SHAPE["vocab"], device=device)
                call = lambda ids=ids, mask=mask, adv=adv, g=g: conflict_spans(ids, mask, adv, g)  # noqa: E731
                s = median_time(call, device, budget_s=budget)
                mem = allocator_peak_bytes(call, device)
                method_times = []
                for forced in (10**9, 0):  # pairs for every G, then sorting for every G
                    conflicts.PAIRWISE_MAX_GROUP = forced
                    method_times.append(median_time(call, device, budget_s=budget / 2))
                conflicts.PAIRWISE_MAX_GROUP = default_max
                print(
                    f"{g:>4}{t:>7}{fmt_time(s):>12}{s / (g * t) * 1e9:>10.1f}{fmt_bytes(mem):>15}"
                    f"{fmt_time(method_times[0]):>13}{fmt_time(method_times[1]):>14}"
                )
    finally:
        conflicts.PAIRWISE_MAX_GROUP = default_max
    ids, mask, adv = make_groups(12, 1500, PAPER_SHAPE["vocab"], n_groups=64, device=device)
    s = median_time(lambda: conflict_spans(ids, mask, adv, 12), device)
    print(f"batched: 64 groups of 12x1500 in one call: {fmt_time(s)} ({fmt_time(s / 64)} per group)")
    print()


def vocab_independence(device: str) -> None:
    print(f"== 3. Vocabulary independence, G=12, T=1500, device={device} ==")
    for v in (50, PAPER_SHAPE["vocab"], 2**40):
        ids, mask, adv = make_groups(12, 1500, v, device=device)

        def call(ids=ids, mask=mask, adv=adv):
            return conflict_spans(ids, mask, adv, 12)

        s = median_time(call, device)
        mem = allocator_peak_bytes(call, device)
        print(f"V={v:>16,}: {fmt_time(s):>10}, extra memory {fmt_bytes(mem)}")
    print()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        algo, g, t, v, threads = sys.argv[2], *map(int, sys.argv[3:7])
        print(json.dumps(child(algo, g, t, v, threads)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="T in {512, 1500} only")
    parser.add_argument("--skip-paper", action="store_true", help="skip the paper's algorithm (~9 GiB, ~10 s)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1, see docstring)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, Python {platform.python_version()}, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPU cores visible, {torch.get_num_threads()} torch threads"
    )
    cuda = torch.cuda.is_available()
    print(
        "CUDA: "
        + (torch.cuda.get_device_name() if cuda else "no CUDA device in this run: CPU figures only, no GPU numbers")
    )
    print("load average (1, 5, 15 min) at start: {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()))
    print()
    head_to_head(args.skip_paper)
    cost_table("cpu", args.quick)
    vocab_independence("cpu")
    if cuda:
        cost_table("cuda", args.quick)
        vocab_independence("cuda")
    print("load average (1, 5, 15 min) at end: {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
