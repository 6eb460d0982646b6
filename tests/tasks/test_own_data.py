"""Your own data from the command line (issue 20, point 6): a file whose columns are named otherwise loads with
--column_map in `gtpo train`, `gtpo eval` and `gtpo inspect`, and every data error names the file and the line."""

from __future__ import annotations

import gzip
import json

import pytest

from gtpo import cli
from gtpo.cli import arguments, run_setup
from gtpo.tasks import load_task, parse_column_map, read_records

ROWS = [{"problem_text": f"What is {i} + 1?", "final": str(i + 1), "uid": f"q{i}"} for i in range(4)]


@pytest.fixture
def renamed_file(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


def test_column_map_parses_from_a_flag_or_a_recipe_mapping():
    assert parse_column_map("question=problem_text, answer=final") == {"question": "problem_text", "answer": "final"}
    assert parse_column_map({"question": "problem_text"}) == {"question": "problem_text"}
    assert parse_column_map(None) == {} and parse_column_map("") == {}
    with pytest.raises(ValueError, match="FIELD=COLUMN"):
        parse_column_map("question")
    with pytest.raises(ValueError, match=r"fields \['questoin'\] are not task fields"):
        parse_column_map("questoin=problem_text")


def test_a_renamed_file_fails_with_the_flag_to_use_then_loads_with_it(renamed_file):
    with pytest.raises(ValueError) as info:
        load_task("gsm8k", "test", source=str(renamed_file))
    message = str(info.value)
    assert str(renamed_file) in message and "--column_map question=<column>" in message
    rows = load_task(
        "gsm8k",
        "test",
        source=str(renamed_file),
        column_map=parse_column_map("question=problem_text,answer=final,id=uid"),
    )
    assert rows["question"] == [r["problem_text"] for r in ROWS] and rows["answer"] == [r["final"] for r in ROWS]
    assert rows["id"][0] == "gsm8k/test/q0"


def test_gtpo_train_takes_column_map_as_a_flag(renamed_file):
    (script_args, _, _), _ = arguments.train_parser().parse(
        [
            "--task",
            "gsm8k",
            "--split",
            "test",
            "--source",
            str(renamed_file),
            "--column_map",
            "question=problem_text,answer=final",
        ]
    )
    dataset = run_setup.load_dataset_for(script_args)
    assert len(dataset) == 4 and dataset[0]["answer"] == "1"


def test_gtpo_eval_takes_column_map_and_records_it(renamed_file, tmp_path, monkeypatch):
    from gtpo.eval.backends import Completion

    class RightAnswers:
        name = "scripted"

        def generate(self, prompts, seeds, sampling):
            return [Completion("<answer>1</answer>", 3, False) for _ in prompts]

    monkeypatch.setattr("gtpo.eval.runner.make_backend", lambda *args: RightAnswers())
    out = tmp_path / "eval"
    argv = ["eval", "--model", "tiny", "--task", "gsm8k", "--source", str(renamed_file), "-n", "1", "--output-dir",
            str(out), "--no-progress", "--column_map", "question=problem_text,answer=final"]  # fmt: skip
    assert cli.main(argv) == 0
    results = json.loads((out / "gsm8k" / "results.json").read_text())
    assert results["pass@k"]["1"] == pytest.approx(0.25)  # "1" is right for "What is 0 + 1?" only
    assert json.loads((out / "gsm8k" / "run.json").read_text())["column_map"] == {
        "question": "problem_text",
        "answer": "final",
    }


def test_gtpo_inspect_takes_column_map(renamed_file, tmp_path, tiny_model_path, capsys):
    argv = ["inspect", "--model", tiny_model_path, "--task", "gsm8k", "--split", "test", "--source", str(renamed_file),
            "--column_map", "question=problem_text,answer=final", "-G", "2", "--max-completion-length", "4",
            "-o", str(tmp_path / "i"), "--color", "never"]  # fmt: skip
    assert cli.main(argv) == 0
    assert json.loads((tmp_path / "i" / "group.json").read_text())["prompt"]


@pytest.mark.parametrize("name", ["bad.jsonl", "bad.json", "bad.jsonl.gz"])
def test_a_byte_that_is_not_utf8_names_the_file_line_and_column(tmp_path, name):
    # Line 2's 18th byte is the Latin-1 é: 17 bytes `{"question": "caf` come before it.
    data = b'{"question": "a", "answer": "1"}\n{"question": "caf\xe9", "answer": "2"}\n'
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    with pytest.raises(ValueError) as info:
        read_records(path)
    assert str(info.value) == f"{path}:2: byte 0xe9 at column 18 is not UTF-8; save the file as UTF-8"


def test_bad_json_and_a_bad_parquet_name_the_file(tmp_path):
    lines = tmp_path / "rows.jsonl"
    lines.write_text('{"question": "a", "answer": "1"}\n{"question": oops}\n')
    with pytest.raises(ValueError, match=rf"{lines}:2: not valid JSON"):
        read_records(lines)
    parquet = tmp_path / "rows.parquet"
    parquet.write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match=rf"{parquet}: not a readable Parquet file"):
        read_records(parquet)
