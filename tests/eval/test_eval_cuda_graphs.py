"""`gtpo eval --cuda_graphs false` (issue 58, item 3): the flag reaches the backend, and the default is unchanged.

Invariants: without the flag the transformers backend gets ``graphs=True`` and records its decoding steps wherever
the device has a recorder (a CUDA graph on CUDA; here the CPU stand-in of `tests/test_graph_decode.py`); with
``--cuda_graphs false`` (or ``--no_cuda_graphs``, or ``cuda_graphs: false`` in a ``--config`` file) it gets
``graphs=False`` and decodes eagerly, with the same samples; vLLM gets its own switch, ``enforce_eager=True``.
"""

from __future__ import annotations

import json

import pytest

import gtpo.decoding.graph as graph_decode
import gtpo.eval.backends as backends
from gtpo.cli.eval import parse_eval_args, run_eval_from_args
from gtpo.eval.runner import EvalConfig, LazyBackend
from test_graph_decode import CountingRunTwice  # the CPU stand-in of a CUDA graph, counting its captures


@pytest.fixture
def made(monkeypatch):
    """Every backend `make_backend` builds, with the ``graphs`` each factory was given; a CPU with a recorder."""
    built = []

    def factory(model, dtype, seed, graphs=True):
        built.append((graphs, backends.TransformersBackend(model, dtype=dtype, graphs=graphs)))
        return built[-1][1]

    monkeypatch.setitem(backends.BACKENDS, "transformers", factory)
    monkeypatch.setitem(graph_decode.RECORDERS, "cpu", CountingRunTwice)
    return built


@pytest.mark.parametrize(
    "flags, expected",
    [([], True), (["--cuda_graphs", "false"], False), (["--cuda-graphs", "false"], False),
     (["--no_cuda_graphs"], False), (["--cuda_graphs", "true"], True)],
)  # fmt: skip
def test_the_flag_parses_and_defaults_to_graphs(flags, expected):
    args = parse_eval_args(["--model", "tiny", *flags])
    assert args.cuda_graphs is expected


def test_the_flag_is_read_from_a_config_file(tmp_path):
    config = tmp_path / "eval.yaml"
    config.write_text("model: tiny\ncuda_graphs: false\n")
    assert parse_eval_args(["--config", str(config)]).cuda_graphs is False
    assert parse_eval_args(["--config", str(config), "--cuda_graphs", "true"]).cuda_graphs is True


def test_defaults_of_the_python_entry_points_are_graphs_on():
    assert EvalConfig(model="tiny", output_dir="x").cuda_graphs is True
    assert LazyBackend("tiny", "transformers")._options == {}
    assert LazyBackend("tiny", "transformers", graphs=False)._options == {"graphs": False}


def _eval(tmp_path, shared_data, name, *flags):
    argv = ["--model", "tiny", "--task", "gsm8k", "--source", str(shared_data / "gsm8k" / "test.jsonl"),
            "--limit", "2", "-n", "2", "--max_new_tokens", "8", "--backend", "transformers", "--seed", "5",
            "--output_dir", str(tmp_path / name), "--no_progress", *flags]  # fmt: skip
    run_eval_from_args(parse_eval_args(argv))
    return [json.loads(line) for line in (tmp_path / name / "gsm8k" / "samples.jsonl").read_text().splitlines()]


def test_the_flag_reaches_the_backend_and_the_samples_are_the_same(tmp_path, shared_data, made):
    """A whole `gtpo eval` job: by default the backend is built with graphs and records its steps (the stand-in
    recorder captures); with --cuda_graphs false it is built without, captures nothing, and records the very
    samples the graph path recorded."""
    CountingRunTwice.captures = 0
    with_graphs = _eval(tmp_path, shared_data, "graphs")
    assert [graphs for graphs, _ in made] == [True]
    assert made[0][1].recorder is CountingRunTwice and CountingRunTwice.captures > 0

    CountingRunTwice.captures = 0
    without = _eval(tmp_path, shared_data, "eager", "--cuda_graphs", "false")
    assert [graphs for graphs, _ in made] == [True, False]
    assert made[1][1].recorder is None and CountingRunTwice.captures == 0

    def key(record):
        return record["problem_id"], record["sample_index"]

    assert sorted(with_graphs, key=key) == sorted(without, key=key) and len(without) == 4


def test_vllm_is_told_enforce_eager_only_when_graphs_are_off(monkeypatch):
    """The vLLM factory maps ``graphs=False`` to vLLM's ``enforce_eager=True`` and passes nothing by default (vLLM's
    own default, graphs on a GPU); `make_backend` hands its options to the factory, and passes none by default, so a
    factory with the older (model, dtype, seed) signature keeps working there."""
    seen = []
    monkeypatch.setattr(backends, "VLLMBackend", lambda model, **kwargs: seen.append(kwargs))
    backends._make_vllm("m", None, 3)
    backends._make_vllm("m", None, 3, graphs=False)
    assert seen == [dict(dtype=None, seed=3), dict(dtype=None, seed=3, enforce_eager=True)]

    calls = []
    monkeypatch.setitem(backends.BACKENDS, "transformers", lambda *args, **kwargs: calls.append((args, kwargs)))
    backends.make_backend("tiny", "transformers")
    backends.make_backend("tiny", "transformers", graphs=False)
    assert calls == [(("tiny", None, 0), {}), (("tiny", None, 0), {"graphs": False})]
