# The two commands that set up a fresh machine and run something: `make train` and `make test`.
.PHONY: setup train test bench

setup:
	bash scripts/setup.sh

train: setup
	.venv/bin/gtpo train

test: setup
	.venv/bin/python -m pytest -q

bench: setup
	.venv/bin/python benchmarks/bench_conflict.py
