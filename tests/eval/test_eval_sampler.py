"""`gtpo eval --sampler` (issue 58, item 2): the counter-based sampler is an option; per-row stays the default.

Invariants: without the flag nothing changes (the backend gets no sampler option, run.json records no sampler, so
folders written before the flag resume); with ``--sampler counter`` the transformers backend draws with
`gtpo.decoding.counter`, every sample gets the same completion on the decode path, the fixed-shape path with its draw
recorded inside the step (the CPU stand-in recorder) and `model.generate` (``fast=False``), run.json records the
sampler and a resume with the other sampler is refused; vLLM refuses the counter sampler in one line.
"""

from __future__ import annotations

import json

import pytest

import gtpo.decoding.graph as graph_decode
import gtpo.eval.backends as backends
from gtpo.cli.eval import parse_eval_args, run_eval_from_args
from gtpo.errors import InvalidInput, UsageError
from gtpo.eval.backends import SamplingSettings, TransformersBackend
from gtpo.eval.runner import EvalConfig, LazyBackend, load_problems, unit_seed
from test_graph_decode import CountingRunTwice  # the CPU stand-in of a CUDA graph, counting its captures


def test_the_flag_defaults_to_per_row_and_reaches_the_backend_only_when_set():
    assert parse_eval_args(["--model", "tiny"]).sampler == "per-row"
    assert parse_eval_args(["--model", "tiny", "--sampler", "counter"]).sampler == "counter"
    with pytest.raises(UsageError, match="invalid choice: 'philox'"):
        parse_eval_args(["--model", "tiny", "--sampler", "philox"])
    assert EvalConfig(model="tiny", output_dir="x").sampler == "per-row"
    with pytest.raises(InvalidInput, match="unknown sampler 'philox'"):
        EvalConfig(model="tiny", output_dir="x", sampler="philox")
    assert LazyBackend("tiny", "transformers")._options == {}
    assert LazyBackend("tiny", "transformers", sampler="counter")._options == {"sampler": "counter"}
    assert LazyBackend("tiny", "transformers", graphs=False, sampler="counter")._options == {
        "graphs": False, "sampler": "counter",
    }  # fmt: skip


def test_vllm_refuses_the_counter_sampler():
    with pytest.raises(InvalidInput, match="--sampler counter needs --backend transformers"):
        backends._make_vllm("m", None, 3, sampler="counter")


def test_every_path_gives_a_sample_the_same_counter_draws(shared_data, monkeypatch):
    """Temperature 0.7 with top-k and top-p: `decode` (ended rows dropped), the fixed-shape path with the draw inside
    the recorded step (each recorded step run twice), and `model.generate` give every sample the same completion;
    a sample's completion follows its seed in another batch; the per-row sampler draws other completions."""
    problems = load_problems("gsm8k", "test", str(shared_data / "gsm8k" / "test.jsonl"), limit=2)
    prompts = [p.prompt for p in problems for _ in range(4)]
    seeds = [unit_seed(3, p.id, s) for p in problems for s in range(4)]
    sampling = SamplingSettings(temperature=0.7, top_p=0.95, top_k=40, max_new_tokens=16)
    eager, plain = (
        TransformersBackend("tiny", sampler="counter"),
        TransformersBackend("tiny", fast=False, sampler="counter"),
    )
    monkeypatch.setitem(graph_decode.RECORDERS, "cpu", CountingRunTwice)
    graphs = TransformersBackend("tiny", sampler="counter")
    assert eager.recorder is None and graphs.recorder is CountingRunTwice
    stop = eager.tokenizer(eager.generate(prompts, seeds, sampling)[0].text, add_special_tokens=False)["input_ids"][3]
    for backend in (eager, plain, graphs):
        backend.eos_ids = [*backend.eos_ids, stop]  # rows end at different steps
    CountingRunTwice.captures = 0
    expected = eager.generate(prompts, seeds, sampling)
    assert graphs.generate(prompts, seeds, sampling) == expected and CountingRunTwice.captures == 1
    assert plain.generate(prompts, seeds, sampling) == expected
    assert eager.generate(prompts[::-1], seeds[::-1], sampling)[::-1] == expected
    assert any(not c.truncated for c in expected) and any(c.truncated for c in expected)
    per_row = TransformersBackend("tiny").generate(prompts, seeds, sampling)
    assert per_row != expected


def test_greedy_decoding_builds_no_sampler_on_either_path(shared_data, monkeypatch):
    """At temperature 0 both paths decode greedily: neither sampler is built (the counter sampler's seeds and warpers
    would go unused), and the counter and per-row backends give the same greedy tokens."""

    def refuse(*args, **kwargs):
        raise AssertionError("a sampler was built for greedy decoding")

    prompts = [load_problems("gsm8k", "test", str(shared_data / "gsm8k" / "test.jsonl"), limit=1)[0].prompt] * 2
    greedy = SamplingSettings(temperature=0, max_new_tokens=6)
    expected = TransformersBackend("tiny", fast=False).generate(prompts, [1, 2], greedy)
    monkeypatch.setattr(backends, "counter_sampler", refuse)
    monkeypatch.setattr(backends, "per_row_sampler", refuse)
    for fast in (True, False):
        backend = TransformersBackend("tiny", fast=fast, sampler="counter")
        assert backend.generate(prompts, [1, 2], greedy) == expected


def _eval(tmp_path, shared_data, *flags):
    argv = ["--model", "tiny", "--task", "gsm8k", "--source", str(shared_data / "gsm8k" / "test.jsonl"),
            "--limit", "1", "-n", "2", "--max_new_tokens", "6", "--backend", "transformers", "--seed", "5",
            "--output_dir", str(tmp_path / "run"), "--no_progress", *flags]  # fmt: skip
    run_eval_from_args(parse_eval_args(argv))
    return json.loads((tmp_path / "run" / "gsm8k" / "run.json").read_text())


def test_run_json_records_the_counter_sampler_and_a_resume_must_keep_it(tmp_path, shared_data):
    recorded = _eval(tmp_path / "per-row", shared_data)
    assert "sampler" not in recorded  # the default: written as before the flag
    recorded = _eval(tmp_path / "counter", shared_data, "--sampler", "counter")
    assert recorded["sampler"] == "counter"
    with pytest.raises(InvalidInput, match="sampler: recorded 'counter', now None"):
        _eval(tmp_path / "counter", shared_data, "--limit", "2")
    _eval(tmp_path / "counter", shared_data, "--limit", "2", "--sampler", "counter")  # resumes with its sampler
