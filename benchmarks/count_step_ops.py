"""What the training step's forward and backward dispatch, GTPO against stock TRL: operator calls and host reads.

    python benchmarks/count_step_ops.py                 # the tiny model, paper-vocab's batch (prompt 203, G = 8)
    python benchmarks/count_step_ops.py --temperatures 0.7

On a GPU a small model's step waits on the host (issue 39: at the paper-vocabulary shape an H100 runs GTPO's step
in 22 ms, of which GTPO's own loss and metrics took 2.2 ms, in small kernels). Each operator call that computes
is a kernel launch there, and each host read (``tolist``, ``item``, ``bool`` of a tensor) is a synchronisation;
neither depends on the machine, so they are counted here, on a CPU, with the arms of
`benchmarks/bench_loss_step.py` (`trl`, `gtpo`, `gtpo-padded`) scoring the same replayed completions.
"Computing calls" leaves out calls that only make views or empty tensors (no kernel). On a CPU the packed layout's
plan is made with CPU operators that a GPU run also makes on the host, so the GPU's launch count is lower than
the `gtpo` row says. Counts, not times: they hold on any machine with the same package versions.
"""

from __future__ import annotations

import argparse
import collections
import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Calls that make a view, an empty tensor or a scalar on the host: no kernel runs.
NO_KERNEL = frozenset(
    "aten." + name
    for name in (
        *("view", "_unsafe_view", "_reshape_alias", "reshape", "select", "slice", "unsqueeze", "squeeze", "detach"),
        *("alias", "as_strided", "t", "expand", "permute", "transpose", "split", "split_with_sizes", "unbind", "chunk"),
        *("narrow", "diagonal", "unfold", "lift_fresh", "empty", "empty_strided", "new_empty", "new_empty_strided"),
        *("scalar_tensor", "promote_types", "result_type", "sym_size", "sym_stride", "is_same_size"),
    )
)
HOST_READS = ("tolist", "item", "__bool__", "__int__", "__float__")


class CountCalls(TorchDispatchMode):
    """Counts the aten calls dispatched inside the block, by name (``calls``), and its host reads (``host_reads``)."""

    def __init__(self):
        super().__init__()
        self.calls: collections.Counter = collections.Counter()
        self.host_reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def computing(self) -> int:
        return sum(n for name, n in self.calls.items() if name not in NO_KERNEL)

    def __enter__(self):
        self._patches = contextlib.ExitStack()
        for name in HOST_READS:
            original = getattr(torch.Tensor, name)

            def counted(tensor, *args, _original=original, **kwargs):
                self.host_reads += 1
                return _original(tensor, *args, **kwargs)

            self._patches.enter_context(_patched(torch.Tensor, name, counted))
        return super().__enter__()

    def __exit__(self, *exc):
        self._patches.close()
        return super().__exit__(*exc)


@contextlib.contextmanager
def _patched(owner, name, value):
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


def main(argv=None) -> None:
    import bench_loss_step

    from gtpo.models import load_model, load_tokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.7, 1.0])
    parser.add_argument("--arms", nargs="+", default=["trl", "gtpo", "gtpo-padded"], choices=bench_loss_step.ARMS)
    options = parser.parse_args(argv)
    base, tokenizer = load_model("tiny", dtype=torch.float32), load_tokenizer("tiny")
    # paper-vocab's batch (bench_loss_step.py): a 203-token prompt, G = 8 completions of 128-256 random tokens.
    prompt = [{"role": "user", "content": "Add these: " + " ".join(f"w{i}" for i in range(60))}]
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(128, 257, (8,), generator=generator).tolist()
    completions = [torch.randint(3, 500, (n,), generator=generator).tolist() for n in lengths]
    print(f"tiny model, float32, CPU; prompt + G = 8 completions of {min(lengths)}-{max(lengths)} tokens; torch "
          f"{torch.__version__}")  # fmt: skip
    for temperature in options.temperatures:
        for arm in options.arms:
            trainer, batch = bench_loss_step._trainer(
                arm, base, tokenizer, prompt, completions, None, temperature, "cpu"
            )
            trainer.compute_loss(trainer.model, batch).backward()  # warm-up: lazy initialisations are not counted
            with CountCalls() as forward:
                loss = trainer.compute_loss(trainer.model, batch)
            with CountCalls() as backward:
                loss.backward()
            print(f"T = {temperature}: {arm:12s} forward {forward.computing:4d} computing calls, "
                  f"{forward.host_reads:2d} host reads; backward {backward.computing:4d} computing calls, "
                  f"{backward.host_reads:2d} host reads")  # fmt: skip


if __name__ == "__main__":
    main()
