"""studies/tools/commit_study_run.sh, the hook studies/tools/run_study.sh gives `gtpo compare --after_run`: after each
finished run it commits exactly that run's small files (run.json, metrics.jsonl, eval/ where the study evaluates) with
the refreshed summary, never checkpoints or weights. Study B evaluates nothing: its first run's hook once failed on
the missing eval/ and left the run uncommitted (issue 18). Run here in a throwaway git repository, with a stand-in
for the pinned interpreter that writes the summary files the real aggregation would."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "studies" / "tools" / "commit_study_run.sh"

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path):
    repo = tmp_path / "repo"
    (repo / "studies" / "tools").mkdir(parents=True)
    shutil.copy(HOOK, repo / "studies" / "tools" / HOOK.name)
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@example.com")
    _git(repo, "config", "user.name", "t")
    _git(repo, "commit", "-q", "--allow-empty", "-m", "start")
    study = repo / "studies" / "s"
    study.mkdir(parents=True)
    (study / "compare.json").write_text("{}")
    (study / "code-commit").write_text("0" * 40 + "\n")
    # Stands in for the pinned python: checks it is asked to aggregate, writes what aggregation writes.
    fake = tmp_path / "python"
    fake.write_text(
        "#!/bin/sh\n"
        'case "$*" in *"-m gtpo.cli compare --output-dir studies/s --aggregate-only"*) ;; *) exit 3 ;; esac\n'
        "mkdir -p studies/s/figures && echo summary > studies/s/summary.md && echo {} > studies/s/summary.json\n"
        "echo png > studies/s/figures/reward.png\n"
    )
    fake.chmod(0o755)
    return repo, fake


def _finished_run(repo: Path, arm: str, with_eval: bool) -> str:
    run = repo / "studies" / "s" / "runs" / arm / "seed0"
    (run / "checkpoint-5").mkdir(parents=True)
    (run / "checkpoint-5" / "adapter_model.safetensors").write_bytes(b"weights")
    (run / "model").mkdir()
    (run / "model" / "adapter_model.safetensors").write_bytes(b"weights")
    (run / "train.log").write_text("log\n")
    (run / "run.json").write_text(json.dumps({"status": "finished"}))
    (run / "metrics.jsonl").write_text('{"step": 1, "reward": 1.0}\n')
    if with_eval:
        (run / "eval" / "synthetic").mkdir(parents=True)
        (run / "eval" / "synthetic" / "results.json").write_text("{}")
    return str(run.relative_to(repo))


def _hook(repo: Path, fake: Path, run: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["studies/tools/commit_study_run.sh", "studies/s", str(fake)],
        cwd=repo,
        env={**os.environ, "GTPO_RUN_DIR": run, **env},
        capture_output=True,
        text=True,
    )


@pytest.mark.parametrize("with_eval", [False, True], ids=["no-eval (study B)", "eval (study A)"])
def test_hook_commits_the_runs_small_files_and_the_summary_only(repo, with_eval):
    repo, fake = repo
    run = _finished_run(repo, "grpo", with_eval)
    result = _hook(repo, fake, run)
    assert result.returncode == 0, result.stderr
    assert _git(repo, "log", "-1", "--format=%s").strip() == "study s: grpo/seed0 finished"
    committed = set(_git(repo, "show", "--name-only", "--format=", "HEAD").split())
    expected = {
        f"{run}/run.json",
        f"{run}/metrics.jsonl",
        "studies/s/compare.json",
        "studies/s/code-commit",
        "studies/s/summary.md",
        "studies/s/summary.json",
        "studies/s/figures/reward.png",
        f"{run}/train-log.txt",  # the launch log, paths made relative; never train.log itself
    }
    if with_eval:
        expected.add(f"{run}/eval/synthetic/results.json")
    assert committed == expected  # no checkpoint, model or raw log


def test_hook_commits_the_launch_log_without_this_machines_paths(repo, tmp_path):
    """A run's train.log backs a study's "one launch and no resume", but names the checkout's absolute path (the
    pinned interpreter) and the home folder (the model cache): the committed copy, train-log.txt, has neither, and
    keeps every line (issue 48, item 1)."""
    repo, fake = repo
    run = _finished_run(repo, "gtpo", with_eval=False)
    root = str(repo.resolve())
    home = str(tmp_path / "home")
    lines = [
        f"$ {root}/.study/code-abc/.venv/bin/python -m gtpo.cli train --seed 0",
        f"INFO gtpo.models: wrote SmolLM2 to {home}/.cache/gtpo/smollm2",
        "step 1 done",
    ]
    (repo / run / "train.log").write_text("\n".join(lines) + "\n")
    assert _hook(repo, fake, run, HOME=home).returncode == 0
    committed = _git(repo, "show", f"HEAD:{run}/train-log.txt").splitlines()
    assert committed == [
        "$ ./.study/code-abc/.venv/bin/python -m gtpo.cli train --seed 0",
        "INFO gtpo.models: wrote SmolLM2 to ~/.cache/gtpo/smollm2",
        "step 1 done",
    ]
    assert f"{run}/train.log" not in _git(repo, "show", "--name-only", "--format=", "HEAD").split()


def test_hook_commits_a_pinned_recipe_and_only_aggregates_when_asked_not_to_commit(repo):
    repo, fake = repo
    (repo / "studies" / "s" / "recipe.yaml").write_text("learning_rate: 1e-3\n")
    run = _finished_run(repo, "gtpo", with_eval=False)
    head = _git(repo, "rev-parse", "HEAD")
    assert _hook(repo, fake, run, GTPO_STUDY_NO_COMMIT="1").returncode == 0
    assert _git(repo, "rev-parse", "HEAD") == head and (repo / "studies/s/summary.md").is_file()
    assert _hook(repo, fake, run).returncode == 0
    assert "studies/s/recipe.yaml" in _git(repo, "show", "--name-only", "--format=", "HEAD").split()


def test_hook_fails_when_aggregation_fails(repo):
    """A failing aggregation must not commit a run beside a stale summary."""
    repo, fake = repo
    fake.write_text("#!/bin/sh\nexit 1\n")
    run = _finished_run(repo, "gtpo", with_eval=False)
    head = _git(repo, "rev-parse", "HEAD")
    assert _hook(repo, fake, run).returncode != 0
    assert _git(repo, "rev-parse", "HEAD") == head


def test_hook_commits_the_completions_record_and_a_summary_without_figures(repo):
    """Training records its completions in RUN/completions/completions_NNNNN.parquet (TRL's convention): the hook
    commits them with the run. An incomplete pre-registered study's aggregation draws no figures (no interim look,
    issue 38 item 6): the hook then commits the summary alone instead of failing on the missing folder."""
    repo, fake = repo
    fake.write_text(
        "#!/bin/sh\n"
        'case "$*" in *"-m gtpo.cli compare --output-dir studies/s --aggregate-only"*) ;; *) exit 3 ;; esac\n'
        "echo withheld > studies/s/summary.md && echo {} > studies/s/summary.json\n"
    )
    (repo / "studies" / "s" / "PREREGISTRATION.md").write_text("# registered\n")
    _git(repo, "add", "studies/s/PREREGISTRATION.md")
    _git(repo, "commit", "-q", "-m", "register")
    run = _finished_run(repo, "gtpo", with_eval=False)
    (repo / run / "completions").mkdir()
    for step in (1, 2):
        (repo / run / "completions" / f"completions_{step:05d}.parquet").write_bytes(b"PAR1")
    result = _hook(repo, fake, run)
    assert result.returncode == 0, result.stderr
    committed = set(_git(repo, "show", "--name-only", "--format=", "HEAD").split())
    assert committed == {
        f"{run}/run.json",
        f"{run}/metrics.jsonl",
        f"{run}/completions/completions_00001.parquet",
        f"{run}/completions/completions_00002.parquet",
        f"{run}/train-log.txt",
        "studies/s/compare.json",
        "studies/s/code-commit",
        "studies/s/summary.md",
        "studies/s/summary.json",
    }


def test_gitignore_keeps_a_runs_completions_record_in_the_commit():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    for folder in ("studies/x/runs/gtpo/seed1", "studies/x/post-hoc/v/seed1"):
        path = f"{folder}/completions/completions_00001.parquet"
        ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT, check=False)
        assert ignored.returncode == 1, path  # 1: not ignored


def _variants(words: list[str]) -> list[str]:
    """The NAME:FLAGS values of a study's --variant words, in order."""
    return [words[i + 1] for i, w in enumerate(words) if w == "--variant"]


def _seeds(words: list[str]) -> list[int]:
    """The seeds a study's words list between --seeds and --save-steps."""
    return [int(s) for s in words[words.index("--seeds") + 1 : words.index("--save-steps")]]


def _study_arguments(name: str) -> list[str]:
    """The `args=(...)` words run_study.sh gives `gtpo compare` for study NAME, as bash would split them."""
    import re
    import shlex

    text = (ROOT / "studies" / "tools" / "run_study.sh").read_text()
    case = text[text.index(f"    {name})") :]
    case = case[: case.index(";;")]
    body = case[case.index("args=(") + len("args=(") : case.rindex(")")]
    return shlex.split(re.sub(r"#[^\n]*", "", body).replace("\\\n", " "))


@pytest.mark.parametrize("name", ["smollm2-synthetic-lr2e-4", "smollm2-synthetic-lr1e-3"])
def test_run_study_gives_the_pinned_compare_the_arms_and_flags_of_the_committed_spec(name):
    """The pinned code refuses a rerun whose arms or flags differ from compare.json (and, at commit ef70603, one that
    adds an arm), so run_study.sh's variants, seeds and common flags must be the committed spec's, in its order."""
    words = _study_arguments(name)
    spec = json.loads((ROOT / "studies" / name / "compare.json").read_text())
    variants = [words[i + 1] for i, w in enumerate(words) if w == "--variant"]
    assert [v.partition(":")[0] for v in variants] == [arm["name"] for arm in spec["arms"]]
    assert [v.partition(":")[2].split() for v in variants] == [arm["args"] for arm in spec["arms"]]
    seeds = words[words.index("--seeds") + 1 : words.index("--save-steps")]
    assert [int(s) for s in seeds] == spec["seeds"]
    assert words[words.index("--save-steps") + 1] == str(spec["save_steps"])
    assert words[words.index("--") + 1 :] == spec["common"]


@pytest.mark.parametrize("name", ["smollm2-synthetic-lr1e-3-c", "smollm2-synthetic-lr2e-4-d"])
def test_run_study_runs_the_preregistered_studies_as_registered(name):
    """Studies C and D start from run_study.sh: its arms, seeds, learning rate, checkpoints and (for D) evaluation
    must be the ones their PREREGISTRATION.md fixes, and the recipe the pinned copy in the study folder."""
    words = _study_arguments(name)
    text = (ROOT / "studies" / name / "PREREGISTRATION.md").read_text()
    assert [words[i + 1] for i, w in enumerate(words) if w == "--variant"] == ["gtpo:", "grpo:--algorithm grpo"]
    seeds = [int(s) for s in words[words.index("--seeds") + 1 : words.index("--save-steps")]]
    assert seeds == list(range(100, 112)) and "100–111, 12" in text
    assert words[words.index("--save-steps") + 1] == "5" and words[words.index("--recipe") + 1] == "$recipe"
    common = words[words.index("--") + 1 :]
    assert common[common.index("--max_steps") + 1] == "40" and common[common.index("--dtype") + 1] == "$dtype_cd"
    script = (ROOT / "studies" / "tools" / "run_study.sh").read_text()
    assert "\ndtype_cd=float32\n" in script and "--dtype float32" in text
    case = script[script.index(f"    {name})") :]
    assert case[: case.index(";;")].count("recipe=$pinned_recipe") == 1
    if name.endswith("-c"):
        assert common[common.index("--learning_rate") + 1] == "1e-3" and "--eval" not in words
    else:
        assert "--learning_rate" not in common  # the recipe's 2e-4
        evaluation = words[words.index("--eval") : words.index("--")]
        assert evaluation[:7] == ["--eval", "--eval-n", "8", "--eval-limit", "100", "--eval-batch-size", "200"]
        assert evaluation[7:] == ["--eval-dtype", "float32"] and int(evaluation[6]) % 8 == 0
        assert "--eval-batch-size 200 --eval-dtype float32" in text


def test_the_ablation_study_runs_c_stalled_seeds_with_one_flag_each(tmp_path):
    """The exploratory ablations (issue 38, item 3): study C's stalled GTPO seeds (as the registered stall rule finds
    them in C's committed runs) at C's learning rate for 15 steps, GTPO as shipped plus one arm per flag; each arm's
    flags build a GTPOConfig, and each sets the λ it is named for (λ of Eq. 5 on a hand-built group)."""
    import torch

    from cli_helpers import load_script
    from gtpo import GTPOConfig
    from gtpo.core import conflict_weights

    words = _study_arguments("smollm2-synthetic-lr1e-3-ablations")
    seeds = [int(s) for s in words[words.index("--seeds") + 1 : words.index("--save-steps")]]
    c = load_script("analyze_preregistered").study_e(
        ROOT / "studies" / "smollm2-synthetic-lr1e-3-c", arms=("gtpo", "grpo")
    )
    assert seeds == c["stalled"]["gtpo"]
    common = words[words.index("--") + 1 :]
    assert common == ["--learning_rate", "1e-3", "--max_steps", "15", "--dtype", "float32"]
    variants = dict(v.partition(":")[::2] for v in (words[i + 1] for i, w in enumerate(words) if w == "--variant"))
    assert variants["gtpo"] == "" and len(variants) == 7
    fw = torch.tensor([[True, False, False], [True, False, False]])
    bw = torch.tensor([[False, False, True], [False, False, True]])
    adv = torch.tensor([1.0, -1.0])
    expected = {
        "gtpo": [[2, 1, 2], [0, 1, 0]],
        "forward-only": [[2, 1, 1], [0, 1, 1]],
        "backward-only": [[1, 1, 2], [1, 1, 0]],
        "no-doubling": [[1, 1, 1], [0, 1, 0]],
        "no-protection": [[2, 1, 2], [1, 1, 1]],
        "protect-only": [[0, 1, 0], [0, 1, 0]],
    }
    for name, flags in variants.items():
        pairs = dict(zip(flags.split()[::2], flags.split()[1::2], strict=True))
        kwargs = {key.removeprefix("--"): value for key, value in pairs.items()}
        typed = {k: (v == "true") if v in ("true", "false") else (float(v) if k.endswith("weight") else v)
                 for k, v in kwargs.items()}  # fmt: skip
        config = GTPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], **typed)
        if name == "authors-code":
            assert config.authors_code and config.conflict_count == "max"
            continue
        lam = conflict_weights(
            fw, bw, adv, config.conflict_positive_weight, negative_weight=config.conflict_negative_weight,
            sides=config.conflict_span_sides,
        )  # fmt: skip
        assert lam.tolist() == [[float(x) for x in row] for row in expected[name]], name


def test_the_guard_screen_runs_c_stalled_seeds_with_the_guard_beside_its_controls(tmp_path):
    """The exploratory guard screen (issue 38, item 4): study C's stalled GTPO seeds at C's learning rate for 15 steps
    (E's stall window), GTPO as shipped and with the guard; each arm's flags build the GTPOConfig they are named for."""
    from cli_helpers import load_script
    from gtpo import GTPOConfig

    words = _study_arguments("smollm2-synthetic-lr1e-3-guard")
    seeds = _seeds(words)
    c = load_script("analyze_preregistered").study_e(
        ROOT / "studies" / "smollm2-synthetic-lr1e-3-c", arms=("gtpo", "grpo")
    )
    assert seeds == c["stalled"]["gtpo"]
    assert words[words.index("--") + 1 :] == ["--learning_rate", "1e-3", "--max_steps", "15", "--dtype", "float32"]
    variants = dict(v.partition(":")[::2] for v in _variants(words))
    assert variants == {"gtpo": "", "gtpo-guard": "--conflict_guard true"}
    guard = GTPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], conflict_guard=True)
    assert guard.conflict_guard and guard.conflict_correction


def test_the_d_rerun_runs_ds_failed_gtpo_seeds_at_ds_settings():
    """Exploratory (issue 38, item 3): D's gtpo seeds 105 (stalled) and 110 (accuracy lost) at D's settings, recorded,
    GTPO as shipped and with the guard."""
    words = _study_arguments("smollm2-synthetic-lr2e-4-d-rerun")
    d = _study_arguments("smollm2-synthetic-lr2e-4-d")
    assert _seeds(words) == [105, 110]
    assert _variants(words) == ["gtpo:", "gtpo-guard:--conflict_guard true"]
    assert words[words.index("--") + 1 :] == ["--max_steps", "40", "--dtype", "float32"]
    assert d[d.index("--") + 1 :] == ["--max_steps", "40", "--dtype", "$dtype_cd"] and "--eval" not in words


def test_the_guard_gamma_screen_runs_fs_runaway_seeds_at_fs_settings_and_code():
    """Exploratory (after study F): F's two runaway gtpo-guard seeds at F's settings and code commit, the guard as in
    F (the control) and with γ = 0, training only."""
    words = _study_arguments("smollm2-synthetic-lr2e-4-guard-gamma")
    f = _study_arguments("smollm2-synthetic-lr2e-4-f")
    assert _seeds(words) == [309, 314] and set(_seeds(words)) <= set(_seeds(f))
    assert _variants(words) == ["guard-nogamma:--conflict_guard true --entropy_gamma 0", _variants(f)[0]]
    assert words[words.index("--") + 1 :] == f[f.index("--") + 1 :] and "--eval" not in words
    study = ROOT / "studies"
    code = (study / "smollm2-synthetic-lr2e-4-guard-gamma" / "code-commit").read_text()
    assert code == (study / "smollm2-synthetic-lr2e-4-f" / "code-commit").read_text()


@pytest.mark.parametrize("letter,name", [("G", "smollm2-two-step-g"), ("H", "smollm2-two-step-h")])
@pytest.mark.parametrize("registration", [None, "# Study\n\n> DRAFT, not registered: ...\n"], ids=["missing", "draft"])
def test_run_study_refuses_a_preregistered_study_before_its_registration(tmp_path, registration, letter, name):
    """Studies G and H are pre-registered: run_study.sh must not start a first run from a draft (the line '> DRAFT' at
    the top) or without the file, so no run can precede the registration's commit (issue 48 item 5, issue 56 item 5)."""
    (tmp_path / "studies" / "tools").mkdir(parents=True)
    shutil.copy(ROOT / "studies" / "tools" / "run_study.sh", tmp_path / "studies" / "tools" / "run_study.sh")
    study = tmp_path / "studies" / name
    study.mkdir(parents=True)
    if registration is not None:
        (study / "PREREGISTRATION.md").write_text(registration)
    result = subprocess.run(
        ["bash", str(tmp_path / "studies" / "tools" / "run_study.sh"), name],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert f"is a draft or missing: register study {letter} before its first run" in result.stderr
    assert not (study / "code-commit").exists()  # nothing pinned, no worktree, no run


def test_study_h_runs_its_arms_in_hs_order_on_fresh_seeds_at_gs_settings():
    """Study H (issue 56, item 5): the paper's gtpo, the chosen variant and grpo, in analyze_preregistered's H_ARMS
    order (the analysis reads the same names), consecutive fresh seeds from 500 in a number h_pairs may give, and G's
    settings and held-out evaluation from --save-steps on, the two-step recipe pinned."""
    words = _study_arguments("smollm2-two-step-h")
    g = _study_arguments("smollm2-two-step-g")
    from cli_helpers import load_script

    analysis = load_script("analyze_preregistered")
    assert [v.partition(":")[0] for v in _variants(words)] == list(analysis.H_ARMS)
    assert _variants(words)[0] == "gtpo:" and _variants(words)[-1] == "grpo:--algorithm grpo"
    seeds = _seeds(words)
    assert seeds == list(range(500, 500 + len(seeds))) and len(seeds) in analysis.H_PAIRS_CHOICES
    assert words[words.index("--save-steps") :] == g[g.index("--save-steps") :]
    script = (ROOT / "studies" / "tools" / "run_study.sh").read_text()
    assert "pinned_from=recipes/smollm2/two-step/gtpo.yaml" in script[script.index("    smollm2-two-step-h)") :]


def test_the_parts_screen_runs_gs_low_seeds_with_one_part_of_gtpo_off_at_the_screens_code():
    """Exploratory (after the common-prefix screen): G's seven low seeds (GTPO held-out pass@1 below 11 %, the
    screen's order), one arm per part of GTPO turned off (the filter, Eq. 5, γ), G's settings and evaluation, at the
    screen's code commit (where G's runs repeated), so G's and the screen's runs are the comparison."""
    words = _study_arguments("smollm2-two-step-h-parts")
    screen = _study_arguments("smollm2-two-step-h-screen")
    assert _variants(words) == [
        "no-filter:--entropy_filter never",
        "no-correction:--conflict_correction false",
        "no-entropy-term:--entropy_gamma 0",
    ]
    low = [s for s in _seeds(screen) if s in (400, 404, 405, 407, 410, 417, 418)]
    assert _seeds(words) == low == [404, 417, 407, 410, 418, 400, 405]
    assert words[words.index("--save-steps") :] == screen[screen.index("--save-steps") :]  # settings, evaluation
    study = ROOT / "studies"
    code = (study / "smollm2-two-step-h-parts" / "code-commit").read_text()
    assert code == (study / "smollm2-two-step-h-screen" / "code-commit").read_text()


def test_the_chosen_part_arm_runs_at_the_screens_six_other_seeds_at_its_code():
    """Exploratory (after the parts screen): the arm its rule chose (analyze_preregistered.h_parts_choice) at the
    common-prefix screen's six seeds that are not G's low seeds, the parts screen's flags, settings, evaluation and code
    commit, so G's runs at those seeds are the comparison and h-screen --with joins the two folders into 13 seeds."""
    words = _study_arguments("smollm2-two-step-h-parts-others")
    parts = _study_arguments("smollm2-two-step-h-parts")
    screen = _study_arguments("smollm2-two-step-h-screen")
    assert _variants(words) == ["no-filter:--entropy_filter never"] and _variants(words)[0] in _variants(parts)
    others = [s for s in _seeds(screen) if s not in _seeds(parts)]
    assert _seeds(words) == others == [401, 402, 403, 406, 408, 409]
    assert words[words.index("--save-steps") :] == parts[parts.index("--save-steps") :]
    study = ROOT / "studies"
    code = (study / "smollm2-two-step-h-parts-others" / "code-commit").read_text()
    assert code == (study / "smollm2-two-step-h-parts" / "code-commit").read_text()
