"""The evaluation runner end to end: tiny model on real GSM8K test problems, resume, recount, bad input."""

import importlib.util
import json
import math
import re
import sys
import types
from pathlib import Path

import pytest

from gtpo.eval.backends import Completion, SamplingSettings, TransformersBackend, VLLMBackend
from gtpo.eval.metrics import group_answers, maj_at_k_from_classes
from gtpo.eval.runner import (
    RESULTS_FILE,
    RUN_FILE,
    SAMPLES_FILE,
    EvalConfig,
    evaluate,
    load_problems,
    read_records,
    unit_seed,
)

N = 4  # samples per problem
LIMIT = 3  # GSM8K test problems
RECORD_FIELDS = {"problem_id", "sample_index", "text", "answer", "correct", "length", "truncated", "gold"}


@pytest.fixture(scope="module")
def gsm8k_source(shared_data) -> str:
    return str(shared_data / "gsm8k" / "test.jsonl")


@pytest.fixture(scope="module")
def problems(gsm8k_source):
    return load_problems("gsm8k", "test", gsm8k_source, LIMIT)


def make_config(tmp_path, source, **changes) -> EvalConfig:
    settings = dict(
        model="tiny",
        output_dir=tmp_path / "run",
        task="gsm8k",
        split="test",
        source=source,
        num_samples=N,
        limit=LIMIT,
        sampling=SamplingSettings(max_new_tokens=6),
        seed=0,
        batch_size=4,  # one problem (N samples) a batch
        progress=False,
    )
    settings.update(changes)
    return EvalConfig(**settings)


class ScriptedBackend:
    """Returns a chosen completion per (problem, sample), found back from the per-sample seed."""

    name = "scripted"

    def __init__(self, problems, script, seed=0, fail_after_calls=None):
        self.by_seed = {unit_seed(seed, p.id, s): (p, s) for p in problems for s in range(N)}
        self.script = script
        self.calls: list[list[tuple]] = []
        self.fail_after_calls = fail_after_calls

    def generate(self, prompts, seeds, sampling):
        if self.fail_after_calls is not None and len(self.calls) >= self.fail_after_calls:
            raise KeyboardInterrupt("simulated interrupt")
        units = [self.by_seed[s] for s in seeds]
        assert [p.prompt for p, _ in units] == list(prompts)
        self.calls.append([(p.id, s) for p, s in units])
        return [Completion(self.script(p, s), 5, False) for p, s in units]


def scripted_answers(problem, sample):
    """Per problem: two right answers (one spelled differently), one wrong, one without an answer tag."""
    gold = problem.gold
    return [
        f"<answer>{gold}</answer>",
        f"<reasoning>so</reasoning><answer>{gold}.00</answer>",
        "<answer>-1</answer>",
        "I do not know",
    ][sample]


def recount(records, problems, n):
    """pass@k and maj@k straight from the JSONL, with the binomial formula written out."""
    by_problem = {
        str(p.id): sorted((r for r in records if str(r["problem_id"]) == str(p.id)), key=lambda r: r["sample_index"])
        for p in problems
    }
    out = {"pass@k": {}, "maj@k": {}}
    for k in (1, 2, 4):
        passes, majs = [], []
        for p in problems:
            rows = by_problem[str(p.id)]
            assert [r["sample_index"] for r in rows] == list(range(n))
            c = sum(r["correct"] for r in rows)
            passes.append(1 - math.comb(n - c, k) / math.comb(n, k))
            classes = group_answers([r["answer"] for r in rows], rows[0]["gold"])
            majs.append(maj_at_k_from_classes(classes.counts, classes.correct, n, k))
        out["pass@k"][str(k)] = sum(passes) / len(passes)
        out["maj@k"][str(k)] = sum(majs) / len(majs)
    return out


def test_problems_come_from_real_gsm8k_with_the_paper_prompt(problems):
    assert len(problems) == LIMIT
    assert problems[0].gold == "18"  # Janet's ducks
    assert problems[0].prompt[0]["role"] == "system" and "<answer>" in problems[0].prompt[0]["content"]
    assert "Janet" in problems[0].prompt[-1]["content"]


def test_tiny_model_end_to_end_writes_records_and_results_that_match_a_recount(tmp_path, gsm8k_source, problems):
    config = make_config(tmp_path, gsm8k_source)
    results = evaluate(config)
    run_dir = Path(config.output_dir)
    records = read_records(run_dir / SAMPLES_FILE)
    assert len(records) == LIMIT * N
    assert all(set(r) == RECORD_FIELDS for r in records)
    assert {(str(r["problem_id"]), r["sample_index"]) for r in records} == {
        (str(p.id), s) for p in problems for s in range(N)
    }
    assert all(1 <= r["length"] <= 6 for r in records)
    on_disk = json.loads((run_dir / RESULTS_FILE).read_text())
    assert on_disk["ks"] == [1, 2, 4] and on_disk["num_problems"] == LIMIT
    for key in ("model", "task", "split", "source", "seed", "sampling", "num_samples", "backend", "label"):
        assert key in on_disk, key
    assert on_disk["backend"] == "transformers" and on_disk["sampling"]["temperature"] == 1.0
    expected = recount(records, problems, N)
    for metric in ("pass@k", "maj@k"):
        assert on_disk[metric] == pytest.approx(expected[metric])
        assert results[metric] == on_disk[metric]


def test_scripted_completions_are_graded_and_counted(tmp_path, gsm8k_source, problems):
    backend = ScriptedBackend(problems, scripted_answers)
    results = evaluate(make_config(tmp_path, gsm8k_source), backend=backend)
    records = read_records(tmp_path / "run" / SAMPLES_FILE)
    by_sample = {r["sample_index"]: r for r in records if r["problem_id"] == problems[0].id}
    assert [by_sample[s]["correct"] for s in range(N)] == [True, True, False, False]
    assert by_sample[1]["answer"] == "18.00" and by_sample[3]["answer"] is None
    # c = 2 of n = 4 for every problem; "18" and "18.00" pool into one class of 2 votes against 1.
    assert results["pass@k"] == pytest.approx({"1": 0.5, "2": 1 - 1 / 6, "4": 1.0})
    # maj@2 over the 6 pairs: {R,R'} 1, {R,W} and {R',W} ties 1/2 each, {R,-} and {R',-} 1, {W,-} 0
    # -> 4/6. maj@4: the pooled class has 2 votes against 1.
    assert results["maj@k"] == pytest.approx({"1": 0.5, "2": 4 / 6, "4": 1.0})
    expected = recount(records, problems, N)
    assert results["pass@k"] == pytest.approx(expected["pass@k"])
    assert results["maj@k"] == pytest.approx(expected["maj@k"])


def test_resume_skips_done_samples_and_matches_uninterrupted_run(tmp_path, gsm8k_source, problems):
    full = ScriptedBackend(problems, lambda p, s: f"<answer>{s}</answer>")
    evaluate(make_config(tmp_path / "a", gsm8k_source), backend=full)
    uninterrupted = read_records(tmp_path / "a" / "run" / SAMPLES_FILE)

    config = make_config(tmp_path / "b", gsm8k_source)
    interrupted = ScriptedBackend(problems, lambda p, s: f"<answer>{s}</answer>", fail_after_calls=1)
    with pytest.raises(KeyboardInterrupt):
        evaluate(config, backend=interrupted)
    samples = Path(config.output_dir) / SAMPLES_FILE
    assert len(read_records(samples)) == config.batch_size  # the finished batch is on disk
    assert not (Path(config.output_dir) / RESULTS_FILE).exists()
    with open(samples, "a") as f:  # a write torn by the interrupt: dropped, not parsed
        f.write('{"problem_id": "torn", "sample_in')

    resumed = ScriptedBackend(problems, lambda p, s: f"<answer>{s}</answer>")
    results = evaluate(config, backend=resumed)
    generated = [unit for call in resumed.calls for unit in call]
    assert len(generated) == LIMIT * N - config.batch_size  # only what was missing
    assert set(generated).isdisjoint({(r["problem_id"], r["sample_index"]) for r in uninterrupted[: config.batch_size]})
    records = read_records(samples)
    key = lambda r: (str(r["problem_id"]), r["sample_index"])  # noqa: E731
    assert sorted(records, key=key) == sorted(uninterrupted, key=key)
    assert results["pass@k"] == recount(records, problems, N)["pass@k"]
    # run.json shows the resume: when, and how many samples were recorded before it (not the first invocation)
    run = json.loads((Path(config.output_dir) / RUN_FILE).read_text())
    assert "resumes" not in json.loads((tmp_path / "a" / "run" / RUN_FILE).read_text())
    [resume] = run["resumes"]
    assert resume["samples_done"] == config.batch_size and resume["samples_total"] == LIMIT * N
    assert (resume["dtype"], resume["batch_size"]) == (config.dtype, config.batch_size)
    assert resume["at"] >= run["created"]

    again = ScriptedBackend(problems, lambda p, s: "unused")
    evaluate(config, backend=again)
    assert again.calls == []  # complete: nothing sampled, nothing loaded
    assert json.loads((Path(config.output_dir) / RUN_FILE).read_text())["resumes"] == [resume]  # not a resume


def test_tiny_model_resume_reproduces_the_interrupted_batches(tmp_path, gsm8k_source, problems, monkeypatch):
    # Same batches and seeds => the same completions from the real model after an interrupt.
    reference = evaluate(make_config(tmp_path / "a", gsm8k_source, limit=2, batch_size=4))
    config = make_config(tmp_path / "b", gsm8k_source, limit=2, batch_size=4)
    original = TransformersBackend.generate
    calls = {"n": 0}

    def flaky(self, prompts, seeds, sampling):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return original(self, prompts, seeds, sampling)

    monkeypatch.setattr(TransformersBackend, "generate", flaky)
    with pytest.raises(KeyboardInterrupt):
        evaluate(config)
    monkeypatch.setattr(TransformersBackend, "generate", original)
    resumed = evaluate(config)
    a = read_records(tmp_path / "a" / "run" / SAMPLES_FILE)
    b = read_records(tmp_path / "b" / "run" / SAMPLES_FILE)
    assert [r["text"] for r in a] == [r["text"] for r in b]
    assert resumed["pass@k"] == reference["pass@k"]


@pytest.mark.parametrize(
    "change,field",
    [
        ({"sampling": SamplingSettings(temperature=0.7, max_new_tokens=6)}, "sampling"),
        ({"num_samples": 2}, "num_samples"),
        ({"model": "smollm2"}, "model"),
        ({"seed": 1}, "seed"),
        ({"few_shot": 1}, "few_shot"),
    ],
)
def test_settings_mismatch_with_an_existing_run_folder_is_an_error(tmp_path, gsm8k_source, problems, change, field):
    evaluate(make_config(tmp_path, gsm8k_source), backend=ScriptedBackend(problems, scripted_answers))
    changed = make_config(tmp_path, gsm8k_source, **change)
    with pytest.raises(ValueError, match=rf"different settings.*{field}: recorded"):
        evaluate(changed, backend=ScriptedBackend(problems, scripted_answers))


def test_more_problems_can_be_added_to_a_run_folder_keeping_the_recorded_samples(tmp_path, gsm8k_source, problems):
    evaluate(make_config(tmp_path, gsm8k_source, limit=1), backend=ScriptedBackend(problems, scripted_answers))
    before = read_records(tmp_path / "run" / SAMPLES_FILE)
    # A different script now: a regenerated copy of an old sample must not replace its record.
    backend = ScriptedBackend(problems, lambda p, s: "<answer>999</answer>")
    results = evaluate(make_config(tmp_path, gsm8k_source, limit=LIMIT), backend=backend)
    assert {pid for call in backend.calls for pid, _ in call} >= {p.id for p in problems[1:]}
    after = read_records(tmp_path / "run" / SAMPLES_FILE)
    assert after[: len(before)] == before
    assert sorted((str(r["problem_id"]), r["sample_index"]) for r in after) == sorted(
        (str(p.id), s) for p in problems for s in range(N)
    )  # each sample exactly once
    assert results["num_problems"] == LIMIT


def test_unknown_task_error_names_the_valid_tasks(tmp_path):
    with pytest.raises(ValueError, match=r"unknown task 'gsm9k'; valid tasks: \[.*'gsm8k'.*'math500'"):
        evaluate(make_config(tmp_path, None, task="gsm9k"))


def test_missing_model_path_error_names_the_valid_choices(tmp_path, gsm8k_source):
    with pytest.raises(ValueError, match=r"does not exist.*'tiny'"):
        evaluate(make_config(tmp_path, gsm8k_source, model=str(tmp_path / "no-such-checkpoint")))
    assert not (tmp_path / "run").exists()


def test_unknown_backend_error_names_the_valid_backends(tmp_path, gsm8k_source):
    with pytest.raises(ValueError, match=r"unknown backend 'tpu'.*'transformers', 'vllm'"):
        evaluate(make_config(tmp_path, gsm8k_source, backend="tpu"))


def test_batched_greedy_generation_with_left_padding_matches_one_prompt_at_a_time(problems):
    backend = TransformersBackend("tiny")
    greedy = SamplingSettings(temperature=0, max_new_tokens=6)
    prompts = [problems[0].prompt, [{"role": "user", "content": "What is 2 + 3?"}]]  # very different lengths
    batched = backend.generate(prompts, [0, 0], greedy)
    alone = [backend.generate([p], [0], greedy)[0] for p in prompts]
    assert batched == alone


def test_vllm_backend_wiring_with_a_stand_in_module(monkeypatch, tmp_path, tiny_model_path, gsm8k_source):
    """No vLLM here: a stand-in module checks the engine and sampling arguments we pass, LoRA included, and that
    an evaluation hands vLLM every sample in one generate call (its continuous batching, not 16-sample slices)."""
    created, requests = {}, []

    class LLM:
        def __init__(self, **kwargs):
            created.update(kwargs)

        def get_tokenizer(self):
            from gtpo.models import load_tokenizer

            return load_tokenizer(tiny_model_path)

        def generate(self, prompts, params, lora_request=None, use_tqdm=True):
            requests.append((prompts, params, lora_request))
            out = types.SimpleNamespace(text="<answer>5</answer>", token_ids=[1, 2, 3], finish_reason="stop")
            return [types.SimpleNamespace(outputs=[out]) for _ in prompts]

    class SamplingParams:
        def __init__(self, **kwargs):
            self.kwargs = kwargs

    class LoRARequest:
        def __init__(self, name, id_, path):
            self.path = path

    vllm = types.ModuleType("vllm")
    vllm.LLM, vllm.SamplingParams = LLM, SamplingParams
    lora = types.ModuleType("vllm.lora")
    lora_request = types.ModuleType("vllm.lora.request")
    lora_request.LoRARequest = LoRARequest
    vllm.lora = lora
    lora.request = lora_request
    for name, module in {"vllm": vllm, "vllm.lora": lora, "vllm.lora.request": lora_request}.items():
        monkeypatch.setitem(sys.modules, name, module)
    from gtpo.models import load_tokenizer

    load_tokenizer(tiny_model_path)  # transformers' lazy imports ask find_spec: done before the stand-in answers
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: object() if name == "vllm" else None)

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": tiny_model_path, "r": 64}))
    backend = VLLMBackend(str(adapter), seed=3)
    assert created["model"] == tiny_model_path and created["enable_lora"] and created["max_lora_rank"] == 64
    out = backend.generate([[{"role": "user", "content": "2+3?"}]] * 2, [11, 12], SamplingSettings(max_new_tokens=9))
    assert out == [Completion("<answer>5</answer>", 3, False)] * 2
    prompts, params, lora_used = requests[0]
    assert prompts[0].endswith("<|im_start|>assistant\n") and lora_used.path == str(adapter)
    assert [p.kwargs["seed"] for p in params] == [11, 12]
    assert params[0].kwargs | {"seed": 0} == dict(
        n=1,
        temperature=1.0,
        top_p=1.0,
        top_k=-1,
        repetition_penalty=1.0,
        max_tokens=9,
        seed=0,
        skip_special_tokens=False,
    )
    requests.clear()
    monkeypatch.setattr("importlib.util.find_spec", real_find_spec)  # the stand-in answers "vllm" only
    evaluate(make_config(tmp_path / "one-call", gsm8k_source, batch_size=5), backend=backend)
    assert len(requests) == 1 and len(requests[0][0]) == LIMIT * N


def test_lora_adapter_dir_and_full_checkpoint_both_load(tmp_path, tiny_model_path, problems):
    from peft import LoraConfig, get_peft_model

    from gtpo.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(tiny_model_path)
    full = tmp_path / "checkpoint-full"
    model.save_pretrained(full)
    tokenizer.save_pretrained(full)
    adapter = tmp_path / "checkpoint-lora"
    # Default LoRA init (B = 0): merged onto the base, the adapter leaves the model unchanged.
    get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).save_pretrained(adapter)
    assert (adapter / "adapter_config.json").is_file()

    greedy = SamplingSettings(temperature=0, max_new_tokens=4)
    prompts = [problems[0].prompt]
    outputs = [TransformersBackend(path).generate(prompts, [0], greedy) for path in (tiny_model_path, full, adapter)]
    assert outputs[0] == outputs[1] == outputs[2]


# ------------------------------------------------------------------------------ records and per-sample seeds

GOOD = {
    "problem_id": "p",
    "sample_index": 0,
    "text": "t",
    "answer": None,
    "correct": False,
    "length": 1,
    "truncated": False,
    "gold": "1",
}


def _line(**changes) -> str:
    return json.dumps({**GOOD, **changes})


def test_a_complete_last_record_without_its_newline_is_kept_and_the_newline_added(tmp_path):
    path = tmp_path / SAMPLES_FILE
    path.write_text(_line(sample_index=0) + "\n" + _line(sample_index=1), encoding="utf-8")
    assert [r["sample_index"] for r in read_records(path)] == [0, 1]
    assert path.read_text(encoding="utf-8") == _line(sample_index=0) + "\n" + _line(sample_index=1) + "\n"


@pytest.mark.parametrize(
    "tail",
    ['{"problem_id": "p", "sample_in', "\0\0\0\0", '{"problem_id": "p"}', "[1, 2]"],
    ids=["torn json", "zeros after a crash", "not a full record", "an array"],
)
def test_an_invalid_last_line_is_cut_and_the_records_before_it_kept(tmp_path, tail):
    path = tmp_path / SAMPLES_FILE
    path.write_text(_line() + "\n" + tail, encoding="utf-8")
    assert read_records(path) == [GOOD]
    assert path.read_text(encoding="utf-8") == _line() + "\n"


@pytest.mark.parametrize(
    "bad,what",
    [
        ("[1, 2]", "must be a JSON object, got list"),
        ("{oops", "not a JSON record"),
        ('{"problem_id": 1}', "lacks ['sample_index', 'answer', 'correct', 'length', 'truncated']"),
    ],
)
def test_a_bad_line_before_the_last_is_an_error_naming_the_file_and_line(tmp_path, bad, what):
    path = tmp_path / SAMPLES_FILE
    path.write_text(_line() + "\n" + bad + "\n" + _line(sample_index=1) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"{path}:2: .*{re.escape(what)}"):
        read_records(path)


def test_a_records_file_with_a_utf8_bom_is_read(tmp_path):
    path = tmp_path / SAMPLES_FILE
    path.write_bytes(b"\xef\xbb\xbf" + _line().encode() + b"\n")
    assert read_records(path) == [GOOD]


def test_a_sampled_row_is_the_same_alone_and_in_any_batch(problems):
    # Per-row generators: which batch a (problem, sample) falls in must not change its completion.
    backend = TransformersBackend("tiny")
    sampling = SamplingSettings(max_new_tokens=6)
    prompts = [problems[0].prompt, [{"role": "user", "content": "What is 2 + 3?"}], problems[0].prompt]
    seeds = [11, 12, 13]
    batched = backend.generate(prompts, seeds, sampling)
    alone = [backend.generate([p], [s], sampling)[0] for p, s in zip(prompts, seeds, strict=False)]
    reordered = backend.generate(prompts[::-1], seeds[::-1], sampling)[::-1]
    assert batched == alone == reordered
    assert batched[0] != batched[2]  # same prompt, different seed: different draws (6 tokens at T=1)


def test_per_row_sampler_draws_from_the_softmax_restricted_to_the_nucleus():
    import torch

    from gtpo.eval.backends import per_row_sampler

    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, -8.0])
    probs = torch.softmax(logits, -1)
    rows = 4000
    draws = []
    for top_p in (1.0, 0.8):
        sampler = per_row_sampler(range(rows), SamplingSettings(top_p=top_p), "cpu")
        out = sampler(torch.zeros(rows, 1, dtype=torch.long), logits.repeat(rows, 1))
        assert ((out == 0).sum(-1) == 1).all()  # exactly one token left per row
        draws.append(torch.bincount(out.argmax(-1), minlength=5).float() / rows)
    full, nucleus = draws
    # 4000 draws: standard error <= 0.008 per frequency; 0.03 is ~4 sigma.
    assert torch.allclose(full, probs, atol=0.03)
    # top-p 0.8: the smallest set of tokens with mass >= 0.8 is {0, 1} (0.64 + 0.24), renormalized.
    kept = probs[:2] / probs[:2].sum()
    assert torch.allclose(nucleus[:2], kept, atol=0.03) and nucleus[2:].sum() == 0


def test_backends_refuse_a_seed_count_that_differs_from_the_prompt_count():
    # Sample i is drawn with seeds[i] (per-sample seeds): a missing or extra seed would silently shift them.
    # Both backends inherit the check from SeededBackend; a stand-in that records what reaches its _sample.
    from gtpo.eval.backends import SamplingSettings, SeededBackend, TransformersBackend, VLLMBackend

    class Recording(SeededBackend):
        def _sample(self, prompts, seeds, sampling):
            self.seen = seeds
            return ["done"] * len(prompts)

    assert issubclass(TransformersBackend, SeededBackend) and issubclass(VLLMBackend, SeededBackend)
    backend, prompt = Recording(), [{"role": "user", "content": "1+1?"}]
    assert backend.generate([prompt], [7], SamplingSettings()) == ["done"] and backend.seen == [7]
    assert backend.generate([], [], SamplingSettings()) == []
    with pytest.raises(ValueError, match="1 prompts and 2 seeds"):
        backend.generate([prompt], [7, 8], SamplingSettings())


def test_model_paths_are_recorded_relative_to_the_working_directory_when_inside_it(tmp_path, monkeypatch):
    """A study's eval run.json must name no machine's folders (issue 18): a model under the working directory is
    recorded relative to it, whichever spelling was given; one outside it stays absolute; a hub id is kept."""
    from gtpo.eval.runner import _normalise_path

    inside = tmp_path / "repo" / "studies" / "s" / "model"
    inside.mkdir(parents=True)
    outside = tmp_path / "elsewhere" / "model"
    outside.mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "repo")
    assert _normalise_path(str(inside)) == _normalise_path("studies/s/model") == "studies/s/model"
    assert _normalise_path("./studies/s/../s/model") == "studies/s/model"
    assert _normalise_path(str(outside)) == str(outside.resolve())
    assert _normalise_path("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_grading_of_a_batch_overlaps_the_generation_of_the_next(tmp_path, gsm8k_source, problems, monkeypatch):
    """Issue 22: grading does not wait on the main thread. Grading the first batch waits (up to 10 s) until the
    backend has started generating the second batch; graded one after the other it would time out instead.
    The records still go to disk in unit order, and each batch's records are graded off the main thread."""
    import threading

    from gtpo.eval import runner

    backend = ScriptedBackend(problems, scripted_answers)
    second_batch_started = threading.Event()
    generate = backend.generate

    def generate_and_signal(prompts, seeds, sampling):
        if backend.calls:
            second_batch_started.set()
        return generate(prompts, seeds, sampling)

    backend.generate = generate_and_signal
    seen, count, lock = [], [0], threading.Lock()
    real_grade = runner.grade

    def grade(text, gold, extract_answer, is_equivalent):
        with lock:
            first_batch = count[0] < 4  # batch_size 4; batches are submitted in order
            count[0] += 1
        if first_batch:
            seen.append((second_batch_started.wait(timeout=10), threading.current_thread().name))
        return real_grade(text, gold, extract_answer, is_equivalent)

    monkeypatch.setattr(runner, "grade", grade)
    evaluate(make_config(tmp_path, gsm8k_source), backend=backend)
    assert len(seen) == 4 and all(overlapped for overlapped, _ in seen)
    assert all(name.startswith("gtpo-grade") for _, name in seen)
    records = read_records(tmp_path / "run" / SAMPLES_FILE)
    units = [(p.id, s) for p in problems for s in range(N)]
    assert [(r["problem_id"], r["sample_index"]) for r in records] == units
