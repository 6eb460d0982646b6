"""`gtpo inspect`: the paper's Fig. 9 group by hand, rendering, and the command on the tiny model."""

import json
import math
from pathlib import Path

import pytest
import torch

from gtpo import cli
from gtpo.inspection.group import analyse_group, group_advantages
from gtpo.inspection.render import terminal_text, to_record, use_color

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# Fig. 9 ("What is 2+2?"): `<reasoning>` is several tokens ("<", "reason", "ing", ">"), shared at the
# start by positive and negative completions; `</answer>` shared at the end; "4" (positives) and "3"
# (the negative) sit at the same positions but are different tokens, so they are not conflicts.
FIG9 = [
    (20.0, "< reason ing > 2+2 = 4 </ reason ing > <answer> 4 </answer>"),  # ✓
    (10.0, "< reason ing > I think 3 </ reason ing > <answer> 3 </answer>"),  # ✗ (format only)
    (20.0, "< reason ing > 4 </ reason ing > <answer> 4 </answer>"),  # ✓ shorter: aligned from the end
]


def hand_group(rows):
    vocab = {}
    seqs = [[vocab.setdefault(tok, len(vocab) + 1) for tok in text.split()] for _, text in rows]
    t = max(map(len, seqs))
    ids = torch.tensor([s + [0] * (t - len(s)) for s in seqs])
    mask = torch.tensor([[1] * len(s) + [0] * (t - len(s)) for s in seqs]).bool()
    return ids, mask, torch.tensor([r for r, _ in rows]), [text.split() for _, text in rows]


def test_fig9_group_gives_the_papers_lambda():
    ids, mask, rewards, tokens = hand_group(FIG9)
    result = analyse_group(ids, mask, rewards)
    # Paper, Fig. 9b: the tokens of <reasoning> (forward span) and </answer> (backward span) get λ=2 in
    # positive completions and λ=0 in the negative one; every other token keeps λ=1.
    pos14 = [2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2]
    neg14 = [0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0]
    pos12 = [2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 2]
    for lam in (result.lambda_union, result.lambda_product):  # spans disjoint here: both combine the same
        assert lam[0].tolist() == pos14 and lam[1].tolist() == neg14 and lam[2, :12].tolist() == pos12
    assert result.forward.sum(1).tolist() == [4, 4, 4] and result.backward.sum(1).tolist() == [1, 1, 1]


def test_overlapping_spans_give_4_under_product_and_2_under_union():
    ids, mask, rewards, _ = hand_group([(1.0, "A B"), (0.0, "A B A B")])
    result = analyse_group(ids, mask, rewards)
    assert result.lambda_union[0, :2].tolist() == [2, 2] and result.lambda_product[0, :2].tolist() == [4, 4]
    assert result.lambda_union[1].tolist() == [0, 0, 0, 0] == result.lambda_product[1].tolist()


def test_guard_lambda_keeps_fig9s_tags_and_zeroes_an_opening_the_group_pushes_down(tmp_path):
    """The stall guard's view (conflict_guard). Fig. 9: the opening tag and the closing tag are held by all three
    completions, so their advantages sum to 0: not contested, λ = 1 (GRPO's update). A group where one positive shares
    its opening "Q =" with two negatives: S = a - 2a < 0, λ 0 there for all three; the other positive keeps λ = 1."""
    ids, mask, rewards, _ = hand_group(FIG9)
    assert analyse_group(ids, mask, rewards).lambda_guard.eq(1).all()
    ids, mask, rewards, _ = hand_group([(1.0, "Q = 5"), (0.0, "Q = 6"), (0.0, "Q = 7"), (1.0, "< r > 5")])
    result = analyse_group(ids, mask, rewards)
    assert result.lambda_union[0, :3].tolist() == [2, 2, 1] and result.lambda_union[1, :3].tolist() == [0, 0, 1]
    assert result.lambda_guard[:3, :2].eq(0).all() and result.lambda_guard[:3, 2].eq(1).all()
    assert result.lambda_guard[3].eq(1).all()
    record = to_record(result, "q", ["Q = 5", "Q = 6", "Q = 7", "< r > 5"], [["Q", "=", "5"], ["Q", "=", "6"],
                       ["Q", "=", "7"], ["<", "r", ">", "5"]], {}, {})  # fmt: skip
    assert record["completions"][0]["lambda_guard"] == [0.0, 0.0, 1.0]
    assert "0 contested span token" in terminal_text(record, combine="guard").splitlines()[0]
    # A recipe with conflict_guard: true shows the guard's λ unless another view is asked for.
    from gtpo.cli.inspect import parse_inspect_args, settings_from

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("conflict_guard: true\nlearning_rate: 1.0e-3\n")
    assert settings_from(parse_inspect_args(["--config", str(recipe)]))["combine"] == "guard"
    assert settings_from(parse_inspect_args(["--config", str(recipe), "--combine", "union"]))["combine"] == "union"
    assert settings_from(parse_inspect_args([]))["combine"] == "union"


def test_advantages_follow_trl_scale_rewards():
    rewards = torch.tensor([20.0, 10.0, 20.0])
    mean, std = 50 / 3, math.sqrt(((20 - 50 / 3) ** 2 * 2 + (10 - 50 / 3) ** 2) / 2)  # unbiased, as TRL's nanstd
    expected = [(r - mean) / (std + 1e-4) for r in (20.0, 10.0, 20.0)]
    assert group_advantages(rewards, "group").tolist() == pytest.approx(expected, rel=1e-6)
    assert group_advantages(rewards, "none").tolist() == pytest.approx([r - mean for r in (20.0, 10.0, 20.0)])
    with pytest.raises(ValueError, match="scale_rewards must be one of group, batch, none"):
        group_advantages(rewards, "std")


def test_entropy_delta_and_shift_match_eq6_and_eq7_by_hand():
    ids, mask, rewards, _ = hand_group(FIG9)
    h = torch.zeros(ids.shape)
    h[0, :14], h[1, :14], h[2, :12] = 0.2, 1.0, 0.5  # ⟨H⟩ = 0.2, 1.0, 0.5
    result = analyse_group(ids, mask, rewards, token_entropy=h, entropy_filter="always", gamma=0.1)
    assert result.mean_entropy.tolist() == pytest.approx([0.2, 1.0, 0.5])
    assert result.delta.tolist() == [True, False, True]  # ⟨H⟩_2 = 1.0 > ln 2 is dropped
    a = result.advantages
    assert result.shifted.tolist() == pytest.approx([float(a[0]) - 0.02, 0.0, float(a[2]) - 0.05], abs=1e-6)


def fig9_record(tmp_settings=None):
    ids, mask, rewards, tokens = hand_group(FIG9)
    result = analyse_group(ids, mask, rewards)
    return to_record(result, "What is 2+2?", [" ".join(t) for t in tokens], tokens, {}, tmp_settings or {"x": 1})


def test_terminal_view_marks_spans_and_colours_only_when_asked():
    plain = terminal_text(fig9_record(), color=False)
    assert "\x1b[" not in plain
    lines = plain.splitlines()
    summaries = [line for line in lines if line.startswith("#")]
    assert len(summaries) == 3 and "A=+" in summaries[0] and "A=-" in summaries[1] and "fw=4 bw=1" in summaries[1]
    assert lines[lines.index(summaries[0]) + 1].strip().startswith("⟦<reasoning>⟧")
    assert lines[lines.index(summaries[0]) + 1].strip().endswith("⟪</answer>⟫")
    coloured = terminal_text(fig9_record(), color=True)
    assert "\x1b[42;30m<\x1b[0m" in coloured  # λ=2 green on a positive's span token
    assert "\x1b[41;97m<\x1b[0m" in coloured  # λ=0 red on the negative's


class _Stream:
    def __init__(self, tty):
        self.tty = tty

    def isatty(self):
        return self.tty


def test_colour_only_on_a_terminal_without_no_color(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert use_color("auto", _Stream(True)) and not use_color("auto", _Stream(False))
    monkeypatch.setenv("NO_COLOR", "1")
    assert not use_color("auto", _Stream(True))
    assert use_color("always", _Stream(False)) and not use_color("never", _Stream(True))


# ---------------------------------------------------------------------------------------------- the command


def test_recorded_group_on_tiny_model_writes_terminal_png_json(tmp_path, tiny_model_path, capsys):
    group = {
        "prompt": "What is 2+2?",
        "completions": [
            "<reasoning>2+2=4</reasoning><answer>4</answer>",
            "<reasoning>2+2=3</reasoning><answer>3</answer>",
            "4",
        ],
        "rewards": [20, 5, 0],
    }
    path = tmp_path / "group.json"
    path.write_text(json.dumps(group))
    out = tmp_path / "out"
    assert (
        cli.main(["inspect", "--model", tiny_model_path, "--group", str(path), "-o", str(out), "--color", "never"]) == 0
    )
    text = capsys.readouterr().out
    assert "\x1b[" not in text and len([line for line in text.splitlines() if line.startswith("#")]) == 3
    assert (out / "group.png").read_bytes()[:8] == PNG_MAGIC
    record = json.loads((out / "group.json").read_text())
    rows = record["completions"]
    assert [r["reward"] for r in rows] == [20, 5, 0]
    # The two tagged completions share their first tokens: a forward span of λ=2 (first) and λ=0 (second).
    assert rows[0]["forward_span_len"] > 0 and rows[0]["lambda_union"][0] == 2 and rows[1]["lambda_union"][0] == 0

    # ⟨H⟩ of the first token, recomputed straight from the model: the prompt's last logits, temperature 1.
    from gtpo.models import load_model, load_tokenizer

    tok, model = load_tokenizer(tiny_model_path), load_model(tiny_model_path)
    with torch.no_grad():
        logp = torch.log_softmax(
            model(torch.tensor([tok(group["prompt"], add_special_tokens=False)["input_ids"]])).logits[0, -1], -1
        )
    assert rows[0]["token_entropy"][0] == pytest.approx(float(-(logp.exp() * logp).sum()), abs=1e-4)
    assert len(rows[0]["token_entropy"]) == len(rows[0]["tokens"]) == len(rows[0]["lambda_product"])


def test_sampled_group_on_tiny_model(tmp_path, tiny_model_path, capsys):
    out = tmp_path / "s"
    argv = ["inspect", "--model", tiny_model_path, "-G", "3", "--max-completion-length", "6", "-o", str(out)]
    assert cli.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len([line for line in lines if line.startswith("#")]) == 3 and "⟨H⟩=" in lines[2]
    record = json.loads((out / "group.json").read_text())
    assert record["settings"]["num_generations"] == 3 and all(0 < len(r["tokens"]) <= 6 for r in record["completions"])
    assert (out / "group.png").read_bytes()[:8] == PNG_MAGIC


@pytest.mark.parametrize(
    "content, expected",
    [
        ({"prompt": "q", "completions": ["a"]}, "missing key(s)"),
        ({"prompt": "q", "completions": ["a", "b"], "rewards": [1]}, "2 completions but rewards has 1"),
        ({"prompt": "q", "completions": ["a", "b"], "rewards": [1, "x"]}, "rewards[1] = 'x' is not a finite number"),
        ("not json", "not JSON"),
    ],
)
def test_bad_group_file_is_one_line_error_naming_the_file(tmp_path, capsys, content, expected):
    path = tmp_path / "g.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    assert cli.main(["inspect", "--model", "tiny", "--group", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gtpo: error: ") and str(path) in err[0] and expected in err[0]


def test_bad_flags_are_one_line_errors(capsys):
    for argv, expected in (
        (["inspect", "--model", "tiny", "-G", "1"], "-G must be at least 2"),
        (["inspect", "--model", "tiny", "--prompt", "What is 1+1?"], "needs --answer"),
        (["inspect", "--model", "tiny", "--index", "999999"], "--index 999999 is out of range"),
    ):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and expected in err[0], err


def test_completion_entropy_goes_through_the_training_head_and_equals_the_plain_logits_entropy(tiny_model_path):
    """`gtpo inspect`'s H is computed by the trainer's LM-head path (one entropy path, issue 32), and equals the
    entropy of the plain forward's temperature-1 logits (core.token_entropy, an independent computation)."""
    from unittest import mock

    from transformers import AutoModelForCausalLM

    from gtpo import core
    from gtpo.forward import lm_head
    from gtpo.inspection.group import completion_entropy

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    prompt = torch.tensor([5, 9, 17, 33])
    completion = torch.tensor([[40, 41, 42, 0], [50, 51, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]).bool()
    with torch.no_grad():
        expected = [core.token_entropy(model(torch.cat([prompt, c[:n]])[None]).logits[0, 3 : 3 + n]) for c, n in
                    zip(completion, (3, 2), strict=True)]  # fmt: skip
    with mock.patch.object(lm_head, "token_scores", wraps=lm_head.token_scores) as head:
        got = completion_entropy(model, prompt, completion, mask)
    assert head.call_count == 2  # one fused call per completion, through the single-pass head
    torch.testing.assert_close(got[0, :3], expected[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[1, :2], expected[1], atol=1e-5, rtol=1e-5)
    assert got[0, 3] == 0 and (got[1, 2:] == 0).all()


def test_the_figure_draws_lambda_values_other_than_the_papers(tmp_path):
    """Under the ablation flags λ can be 1.5 or 3 (conflict_positive_weight 1.5, product): the figure still draws,
    each value in the nearest level's colour (it raised ValueError on any value outside 0, 1, 2, 4)."""
    from gtpo.inspection import render

    row = {"tokens": ["a", "b", "c"], "reward": 1.0, "advantage": 1.0, "lambda_union": [1.5, 1.0, 3.0]}
    path = render.plot_group({"completions": [row]}, tmp_path / "g.png")
    assert path.is_file() and path.stat().st_size > 0


def test_a_recorded_group_shows_its_push_against_the_group(tmp_path):
    """`gtpo inspect --run` prints `gtpo/push_against_group` of the group, recomputed from the record by the definition
    (tests/core/test_common_prefix.py's brute-force scan). Study G's gtpo/seed417 at step 11, "What is 9 + 5 + 7?":
    all eight completions open "9 + 5 + 7 = 2", so those tokens have S = 0 (Eq. 8's advantages sum to 0) and are not
    counted, and every other shared token is held by more positive weight than negative: the line says 0.000. At
    step 2 some shared tokens lose: the value is the brute force's and is above 0."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
    from test_common_prefix import _brute_force_push_against_group

    from gtpo.inspection.recorded import recorded_group
    from gtpo.runs import completions as records

    run = str(Path(__file__).resolve().parents[2] / "studies" / "smollm2-two-step-g" / "runs" / "gtpo" / "seed417")
    record, _ = recorded_group(run, 11, 0)
    assert "push against the group 0.000" in record["note"]
    c = records.read_step(run, 2)["columns"]
    rows = c["completion_ids"]
    t = max(len(r) for r in rows)
    pos = torch.arange(t)
    lengths = torch.tensor([len(r) for r in rows]).unsqueeze(-1)
    fw = pos < torch.tensor(c["forward_span"]).unsqueeze(-1)
    bw = (pos >= lengths - torch.tensor(c["backward_span"]).unsqueeze(-1)) & (pos < lengths)
    lam = torch.tensor(
        [records.lambda_row(p, v, t) for p, v in zip(c["lambda_positions"], c["lambda_values"], strict=True)]
    )
    expected = _brute_force_push_against_group(rows, [float(a) for a in c["advantage"]], 8, fw, bw, lam)
    record, _ = recorded_group(run, 2, 0)
    assert expected > 0 and f"push against the group {expected:.3f}" in record["note"]
