"""The completion record of a run: ``completions/completions_{step:05d}.parquet``, one file per logged step.

TRL 1.16's convention (``GRPOConfig.log_completions``): a parquet table per logging step in the output folder, one
row per completion, with TRL's columns ``step``, ``prompt``, ``completion``, one column per reward function and
``advantage`` (A_i of Eq. 8). gtpo writes the same file with its own columns beside TRL's (:data:`GTPO_COLUMNS`),
and the settings that explain them in the file's metadata (:data:`METADATA_KEY`), so that a recorded step can be
read back and rendered (``gtpo inspect --run RUN --step N``) without the model or its tokenizer.

A step's file is replaced whole (written beside, then renamed), so a run killed while writing leaves the previous
version or none, never half a file; a resumed run that trains step N again writes step N's file again, so each
step is recorded once, by the trajectory the run kept.

>>> from gtpo.runs.completions import read_step, recorded_steps
>>> recorded_steps("runs/demo"), read_step("runs/demo", 3)["metadata"]["group_size"]  # doctest: +SKIP
([1, 2, 3], 8)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from gtpo.errors import InvalidInput

RECORD_DIR = "completions"  # TRL's folder name (GRPOTrainer.log)
METADATA_KEY = b"gtpo"  # parquet schema metadata: JSON of the settings below

# gtpo's columns, beside TRL's (step, prompt, completion, <reward functions>, advantage); each is one value per
# completion. λ is stored compactly: the positions where it is not 1 and its value there.
GTPO_COLUMNS = {
    "group": "index of the completion's group (prompt) within the step's recorded rows, from 0",
    "reward": "R_i, the weighted sum of the reward functions (TRL's reward_weights)",
    "completion_ids": "the completion's token ids (its valid tokens, EOS included when it ended)",
    "completion_tokens": "each of those tokens decoded on its own (what `gtpo inspect` shows)",
    "mean_entropy": "⟨H⟩_i in nats: GTPO's (entropy_temperature) with algorithm='gtpo', TRL's entropy with 'grpo'",
    "entropy_filtered": "δ_i = 0: the entropy filter (Eq. 6) dropped the completion (always False for grpo)",
    "advantage_used": "the advantage the loss weighted: A'_i = δ_i(A_i − γ⟨H⟩_i) for gtpo (Eq. 7), A_i for grpo",
    "forward_span": "|M^fw_i|, the leading conflict span's length in tokens (Sec. 5.1)",
    "backward_span": "|M^bw_i|, the trailing conflict span's length in tokens",
    "lambda_positions": "token positions where λ_{i,t} (Eq. 5) is not 1",
    "lambda_values": "λ_{i,t} at those positions (0: negative in a span; 2: positive; 4: both spans, 'product')",
}
# The file's metadata: what explains the columns (how λ was formed, whether the loss applied it).
METADATA_FIELDS = (
    "algorithm", "group_size", "groups_in_step", "reward_funcs", "lambda_applied", "conflict_combine",
    "conflict_positive_weight", "entropy_filter", "entropy_threshold", "entropy_gamma", "initial_entropy",
)  # fmt: skip


def record_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / RECORD_DIR


def record_path(run_dir: str | Path, step: int) -> Path:
    """TRL's file name for a logged step: ``completions/completions_00012.parquet``."""
    return record_dir(run_dir) / f"completions_{step:05d}.parquet"


def write_step(run_dir: str | Path, step: int, columns: dict[str, list], metadata: dict) -> Path:
    """Write one step's table (``columns``: name -> one value per completion) with ``metadata``, atomically.

    Returns:
        The file's path.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    lengths = {name: len(values) for name, values in columns.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"completion record of step {step}: columns of different lengths {lengths}")
    missing = [k for k in METADATA_FIELDS if k not in metadata]
    if missing:
        raise ValueError(f"completion record of step {step}: metadata lacks {missing}")
    try:
        table = pa.table(columns)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        # Values arrow cannot type as one column (chat messages whose content is text in one row and a list of parts
        # in another, ...): those columns are stored as JSON text, and `read_step` decodes them.
        encoded = [name for name, values in columns.items() if not _arrow_typable(values)]
        columns = {n: [json.dumps(v, default=str) for v in vs] if n in encoded else vs for n, vs in columns.items()}
        metadata = {**metadata, "json_columns": encoded}
        table = pa.table(columns)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), METADATA_KEY: json.dumps(metadata)})
    path = record_path(run_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")  # not *.parquet: TRL's hub upload skips it
    # zstd and no column statistics (nothing filters on them): a step of 8 short completions takes 7.8 KB, not 9.9.
    pq.write_table(table, partial, compression="zstd", write_statistics=False)
    os.replace(partial, path)
    return path


def _arrow_typable(values: list) -> bool:
    import pyarrow as pa

    try:
        pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return False
    return True


def recorded_steps(run_dir: str | Path) -> list[int]:
    """The steps whose record is in ``run_dir``, in order."""
    folder = record_dir(run_dir)
    if not folder.is_dir():
        return []
    steps = []
    for path in folder.glob("completions_*.parquet"):
        number = path.stem.removeprefix("completions_")
        if number.isdigit():
            steps.append(int(number))
    return sorted(steps)


def drop_after(run_dir: str | Path, step: int) -> list[int]:
    """Remove the records of steps after ``step`` (a resume from checkpoint ``step``: those steps run again, and a
    step the resumed run does not reach again must not keep the abandoned trajectory's record). Returns them."""
    dropped = [s for s in recorded_steps(run_dir) if s > step]
    for s in dropped:
        record_path(run_dir, s).unlink(missing_ok=True)
    return dropped


def read_step(run_dir: str | Path, step: int) -> dict:
    """One recorded step: ``{"columns": {name: [values]}, "metadata": {...}}``; a one-line error names the fix."""
    import pyarrow.parquet as pq

    path = record_path(run_dir, step)
    if not path.is_file():
        steps = recorded_steps(run_dir)
        have = f"it has steps {steps[0]}..{steps[-1]} ({len(steps)} files)" if steps else "it has no record"
        raise InvalidInput(
            f"{path} not found: {have}; record completions with log_completions=true (gtpo train's default)"
        )
    try:
        table = pq.read_table(path)
    except Exception as err:  # pyarrow raises several types for a damaged file
        raise InvalidInput(f"{path}: not a readable parquet file ({err})") from None
    raw = (table.schema.metadata or {}).get(METADATA_KEY)
    if raw is None:
        raise InvalidInput(f"{path} has no gtpo columns (written by TRL's GRPOTrainer?): record it with gtpo train")
    metadata, columns = json.loads(raw), table.to_pydict()
    for name in metadata.get("json_columns", ()):
        columns[name] = [json.loads(v) for v in columns[name]]
    return {"columns": columns, "metadata": metadata}


def lambda_row(positions: list[int], values: list[float], length: int) -> list[float]:
    """λ of one completion over its ``length`` tokens, from the record's compact form (1 elsewhere)."""
    lam = [1.0] * length
    for p, v in zip(positions, values, strict=True):
        lam[p] = float(v)
    return lam
