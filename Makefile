# fixlab: the README's two commands are `make eval` and `make test`; both build .venv when needed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fixlab-installed
ARGS ?=
UI_PORT ?= 5000

.PHONY: setup eval test test-fast ui nightly nightly-now bench clean-runs

setup: $(STAMP)

$(STAMP): pyproject.toml
	@command -v bwrap >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		(apt-get install -y -q bubblewrap >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q bubblewrap >/dev/null 2>&1)) \
		&& echo "setup: installed bubblewrap" ; } || echo "setup: bubblewrap not installed (sandbox falls back to rlimits only)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	@touch $(STAMP)

# Main job: full HumanEvalFix on the embedded default (conf/config.yaml). Quick look: make eval ARGS="dataset.limit=10"
eval: setup
	$(PY) -m flows.evaluate $(ARGS)

test: setup
	$(PY) -m pytest -q $(ARGS)

ui: setup
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false $(VENV)/bin/mlflow server --workers 1 \
		--backend-store-uri sqlite:///$(CURDIR)/mlruns/mlflow.db \
		--default-artifact-root $(CURDIR)/mlruns/artifacts \
		--host 127.0.0.1 --port $(UI_PORT)

clean-runs:
	rm -rf mlruns/mlflow.db mlruns/artifacts mlruns/state outputs multirun
