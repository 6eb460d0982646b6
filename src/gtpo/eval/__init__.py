"""Evaluation as in the paper (Sec. 6): pass@k and maj@k from n sampled completions per problem.

- `gtpo.eval.metrics`: the estimators, pure (`pass_at_k`, `maj_at_k`, `group_answers`, `maj_at_k_from_classes`).
- `gtpo.eval.runner`: `EvalConfig` + `evaluate`: sample, grade with `gtpo.grading`, write records and results.
- `gtpo.eval.backends`: transformers `generate` (any machine) or vLLM (GPU, optional).
- `gtpo.eval.plots`: pass@k / maj@k against k from results files; `gtpo.cli.eval`: `gtpo eval`, `gtpo eval-plot`.

See docs/evaluation.md.
"""

from gtpo.eval.metrics import group_answers, maj_at_k, maj_at_k_from_classes, pass_at_k

__all__ = ["group_answers", "maj_at_k", "maj_at_k_from_classes", "pass_at_k"]
