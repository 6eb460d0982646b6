# The two commands that set up a fresh machine and run something: `make train` and `make test`.
.PHONY: setup train test lint bench

setup:
	bash scripts/setup.sh

train: setup
	.venv/bin/gtpo train

test: setup lint
	.venv/bin/python -m pytest -q

# ruff (pyproject.toml [tool.ruff]): the lint rules and the formatting, on everything Python in the repository.
lint: setup
	.venv/bin/ruff check src tests benchmarks scripts
	.venv/bin/ruff format --check src tests benchmarks scripts

bench: setup
	.venv/bin/python benchmarks/bench_conflict.py
