"""A group of a run's completion record (`gtpo.runs.completions`) as `gtpo inspect` shows it, without the model.

The record holds what training computed (ids, tokens, rewards, A_i, ⟨H⟩_i, δ_i, A'_i, span lengths, λ), so the view
is the one the step's loss saw, not a re-tokenised or re-sampled approximation; only the per-token entropies are not
recorded (the figure's entropy panel stays empty).
"""

from __future__ import annotations

from gtpo.errors import InvalidInput
from gtpo.runs import completions as record_files


def _text(message) -> str:
    if isinstance(message, list):  # TRL's conversational completion: [{"role": "assistant", "content": ...}]
        return "".join(str(m.get("content", "")) for m in message if isinstance(m, dict))
    return str(message)


def recorded_group(run_dir: str, step: int | None, group: int) -> tuple[dict, str]:
    """The render record (`gtpo.inspection.render.to_record`'s form) of one recorded group, and its λ combine.

    Args:
        run_dir: the run folder (holds ``completions/``).
        step: the logged step; None for the newest recorded one.
        group: the group's index within the step's record (0 for the first prompt).

    Returns:
        (record, combine): the record `render.terminal_text` and `render.plot_group` take, and the run's
        ``conflict_combine`` (the λ shown; ``guard`` for a run with ``conflict_guard``).
    """
    if step is None:
        steps = record_files.recorded_steps(run_dir)
        if not steps:
            raise InvalidInput(f"{run_dir} has no completion record ({record_files.RECORD_DIR}/ is missing or empty)")
        step = steps[-1]
    step_record = record_files.read_step(run_dir, step)
    columns, meta = step_record["columns"], step_record["metadata"]
    groups = sorted(set(columns["group"]))
    if group not in groups:
        raise InvalidInput(f"--index {group}: step {step} of {run_dir} recorded groups {groups[0]}..{groups[-1]}")
    combine = "guard" if meta.get("conflict_guard") else meta["conflict_combine"]  # older records: no such key
    rows = []
    for i in (i for i, g in enumerate(columns["group"]) if g == group):
        tokens = columns["completion_tokens"][i]
        lam = record_files.lambda_row(columns["lambda_positions"][i], columns["lambda_values"][i], len(tokens))
        row = {
            "text": _text(columns["completion"][i]),
            "tokens": tokens,
            "reward": float(columns["reward"][i]),
            "rewards": {name: columns[name][i] for name in meta["reward_funcs"]},
            "advantage": float(columns["advantage"][i]),
            "forward_span_len": int(columns["forward_span"][i]),
            "backward_span_len": int(columns["backward_span"][i]),
            f"lambda_{combine}": lam,
        }
        if columns["mean_entropy"][i] is not None:
            row |= {
                "mean_entropy": float(columns["mean_entropy"][i]),
                "delta": int(not columns["entropy_filtered"][i]),
                "shifted_advantage": float(columns["advantage_used"][i]),
            }
        rows.append(row)
    applied = "applied by the loss" if meta["lambda_applied"] else "computed for the record only (not applied)"
    members = [i for i, g in enumerate(columns["group"]) if g == group]
    push = push_against_group(columns, members, int(meta["group_size"]))
    record = {
        "settings": {**meta, "step": step, "group": group},
        "initial_entropy": meta["initial_entropy"],
        "initial_entropy_given": True,
        "prompt": columns["prompt"][columns["group"].index(group)],
        "completions": rows,
        "note": f"recorded step {step}, group {group} of {meta['groups_in_step']} ({meta['algorithm']}); λ {applied}; "
        f"push against the group {push:.3f} (gtpo/push_against_group: the share of λ's push up on shared tokens "
        "whose sharers' advantages sum below 0; docs/metrics.md)",
    }
    return record, combine


def push_against_group(columns: dict, rows: list[int], group_size: int) -> float:
    """`gtpo.core.push_against_group` of one recorded group, from its ids, A_i, span lengths and recorded λ."""
    import torch

    from gtpo import core

    ids = [columns["completion_ids"][i] for i in rows]
    t = max(1, max(len(r) for r in ids))
    tokens = torch.tensor([r + [0] * (t - len(r)) for r in ids])  # (G, T)
    mask = torch.tensor([[True] * len(r) + [False] * (t - len(r)) for r in ids])  # (G, T)
    pos, lengths = torch.arange(t), mask.sum(-1, keepdim=True)
    forward = pos < torch.tensor([columns["forward_span"][i] for i in rows]).unsqueeze(-1)  # (G, T)
    backward = (pos >= lengths - torch.tensor([columns["backward_span"][i] for i in rows]).unsqueeze(-1)) & mask
    lam = torch.tensor(
        [record_files.lambda_row(columns["lambda_positions"][i], columns["lambda_values"][i], t) for i in rows]
    )  # (G, T) the recorded λ
    advantages = torch.tensor([float(columns["advantage"][i]) for i in rows])  # (G,)
    return float(core.push_against_group(tokens, mask, advantages, group_size, forward, backward, lam))
