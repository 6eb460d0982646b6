"""Rendering for ``gtpo inspect``: the JSON record, the terminal view coloured by λ, and the PNG figure.

Everything here works from the plain record (lists and numbers), so a saved ``group.json`` can be
re-rendered without the model.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# λ values of Eq. (5)/(21): 0 (negative completion, in a span), 1 (outside spans), 2 (positive, in a
# span), 4 (positive, in both spans, `product` only). ANSI background colours and figure colours.
ANSI = {0.0: "\x1b[41;97m", 2.0: "\x1b[42;30m", 4.0: "\x1b[45;97m"}
ANSI_RESET = "\x1b[0m"
COLORS = {0.0: "#d62728", 1.0: "#e8e8e8", 2.0: "#2ca02c", 4.0: "#9467bd"}
PAD_COLOR = "#ffffff"


def printable(token: str) -> str:
    """A token as it can be shown in one terminal line or figure cell: newlines and tabs as symbols,
    other control characters escaped (a raw ESC or BEL would act on the terminal)."""
    token = token.replace("\n", "⏎").replace("\t", "⇥")
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in token)


def use_color(mode: str = "auto", stream=None) -> bool:
    """ANSI colour: ``always``/``never``, or for ``auto`` only on a terminal and when NO_COLOR is unset
    (https://no-color.org)."""
    if mode != "auto":
        return mode == "always"
    stream = stream or sys.stdout
    return "NO_COLOR" not in os.environ and hasattr(stream, "isatty") and stream.isatty()


def _values(t, n=None):
    values = t.tolist() if hasattr(t, "tolist") else list(t)
    return values if n is None else values[:n]


def to_record(analysis, prompt, texts: list[str], tokens: list[list[str]], parts: dict, settings: dict) -> dict:
    """The JSON record of one inspected group: settings, prompt, and per completion every quantity shown."""
    rows = []
    for i, text in enumerate(texts):
        n = len(tokens[i])
        row = {
            "text": text,
            "tokens": tokens[i],
            "reward": float(analysis.rewards[i]),
            "rewards": {name: values[i] for name, values in parts.items()},
            "advantage": float(analysis.advantages[i]),
            "forward_span_len": int(analysis.forward[i].sum()),
            "backward_span_len": int(analysis.backward[i].sum()),
            "lambda_union": _values(analysis.lambda_union[i], n),
            "lambda_product": _values(analysis.lambda_product[i], n),
            "lambda_guard": _values(analysis.lambda_guard[i], n),
        }
        if analysis.token_entropy is not None:
            row |= {
                "token_entropy": [round(h, 6) for h in _values(analysis.token_entropy[i], n)],
                "mean_entropy": float(analysis.mean_entropy[i]),
                "delta": int(analysis.delta[i]),
                "shifted_advantage": float(analysis.shifted[i]),
            }
        rows.append(row)
    return {
        "settings": {k: settings[k] for k in sorted(settings)},
        "initial_entropy": analysis.initial_entropy,
        "initial_entropy_given": settings.get("initial_entropy") is not None,
        "prompt": prompt,
        "completions": rows,
    }


def _summary(i: int, row: dict) -> str:
    parts = ", ".join(f"{k} {v:g}" for k, v in row["rewards"].items())
    line = f"#{i}  R={row['reward']:g}" + (f" ({parts})" if parts else "") + f"  A={row['advantage']:+.3f}"
    if "mean_entropy" in row:
        line += f"  ⟨H⟩={row['mean_entropy']:.3f}  δ={row['delta']}  A'={row['shifted_advantage']:+.3f}"
    return line + f"  spans fw={row['forward_span_len']} bw={row['backward_span_len']}"


def _token_line(row: dict, combine: str, color: bool) -> str:
    """The completion token by token; spans in ⟦ ⟧ (forward) and ⟪ ⟫ (backward), tokens coloured by λ."""
    lam = row[f"lambda_{combine}"]
    n = len(row["tokens"])
    fw, bw = row["forward_span_len"], row["backward_span_len"]
    out = []
    for t, token in enumerate(row["tokens"]):
        shown = printable(token)
        if t == 0 and fw:
            out.append("⟦")
        if t == n - bw and bw:
            out.append("⟪")
        code = ANSI.get(float(lam[t])) if color else None
        out.append(f"{code}{shown}{ANSI_RESET}" if code else shown)
        if t == fw - 1:
            out.append("⟧")
        if t == n - 1 and bw:
            out.append("⟫")
    return "    " + "".join(out)


def terminal_text(record: dict, combine: str = "union", color: bool = False) -> str:
    """One summary line per completion (reward, A, ⟨H⟩_i, δ_i, A'_i, span lengths), then its tokens."""
    meanings = ((0.0, "negative in a span"), (2.0, "positive in a span"), (4.0, "positive in both (product)"))
    if combine == "guard":  # conflict_guard: 0 where the sharers' advantages sum below 0, either sign
        meanings = ((0.0, "contested span token (either sign; conflict_guard)"),)
    legend = "λ: " + " ".join(
        (f"{ANSI[v]} {v:g} {ANSI_RESET}" if color else f"{v:g}") + f" {what}" for v, what in meanings
    )
    lines = [
        f"gtpo inspect: {len(record['completions'])} completions; λ by {combine}; "
        f"spans ⟦forward⟧ ⟪backward⟫; {legend}; 1 elsewhere"
    ]
    if record.get("note"):
        lines.append(record["note"])
    if record.get("initial_entropy") is not None:
        source = (
            ""
            if record.get("initial_entropy_given")
            else ": this group's mean ⟨H⟩, a stand-in (give --initial_entropy)"
        )
        lines.append(
            f"⟨H⟩_ini = {record['initial_entropy']:.3f} nats{source}; "
            f"δ by Eq. 6, mode {record['settings'].get('entropy_filter')}"
        )
    for i, row in enumerate(record["completions"]):
        lines.append(_summary(i, row))
        lines.append(_token_line(row, combine, color))
    return "\n".join(lines)


def plot_group(record: dict, path: str | Path, combine: str = "union") -> Path:
    """A figure of the group: λ per token (left) and entropy per token (right), one row per completion."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap

    rows = record["completions"]
    width = max(len(r["tokens"]) for r in rows)
    levels = [0.0, 1.0, 2.0, 4.0]
    lam = np.full((len(rows), width), np.nan)
    ent = np.full((len(rows), width), np.nan)
    for i, r in enumerate(rows):
        n = len(r["tokens"])
        # λ takes other values under the ablation flags (conflict_positive_weight 1.5, ...): each is shown in the
        # colour of the nearest of the paper's levels
        lam[i, :n] = [min(range(len(levels)), key=lambda k: abs(levels[k] - float(v))) for v in r[f"lambda_{combine}"]]
        if "token_entropy" in r:
            ent[i, :n] = r["token_entropy"]
    fig, axes = plt.subplots(2, 1, figsize=(min(20, 4 + 0.2 * width), 1.5 + 0.7 * len(rows)), squeeze=False)
    axes = axes.T  # (1, 2): λ on top, entropy below
    cmap = ListedColormap([COLORS[v] for v in levels]).with_extremes(bad=PAD_COLOR)
    axes[0, 0].imshow(np.ma.masked_invalid(lam), cmap=cmap, vmin=-0.5, vmax=3.5, aspect="auto", interpolation="nearest")
    axes[0, 0].set_title(f"λ ({combine}): red 0, grey 1, green 2, purple 4")
    image = axes[0, 1].imshow(np.ma.masked_invalid(ent), cmap="viridis", aspect="auto", interpolation="nearest")
    axes[0, 1].set_title("token entropy H (nats, temperature 1)")
    fig.colorbar(image, ax=axes[0, 1], fraction=0.03)
    labels = [
        f"R={r['reward']:g} A={r['advantage']:+.2f}"
        + (f" ⟨H⟩={r['mean_entropy']:.2f} δ={r['delta']}" if "mean_entropy" in r else "")
        for r in rows
    ]
    for ax in axes[0]:
        ax.set_yticks(range(len(rows)), labels, fontsize=7)
        ax.set_xlabel("token position")
    if width <= 80:  # token text in the cells when it can be read
        for i, r in enumerate(rows):
            for t, token in enumerate(r["tokens"]):
                axes[0, 0].text(t, i, printable(token.strip())[:5] or "·", ha="center", va="center", fontsize=5)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
