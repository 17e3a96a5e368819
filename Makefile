# fixlab: the README's two commands are `make eval` and `make test`; both build .venv when needed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.fixlab-installed
ARGS ?=
UI_PORT ?= 5000

.PHONY: setup setup-test toolchains eval test test-quick ui nightly nightly-now clean-runs docker-image

setup: $(STAMP)

# The job's own needs: the venv with the engine's extra and bubblewrap (the sandbox's jail). The other extras (llama.cpp,
# E2B, Dask, PostgreSQL) and the test tools, the tests' system packages (Chromium, PostgreSQL, Docker) and the other
# languages' toolchains come with `make test` (setup-test); a job that needs a missing extra says which in one line
# (agents/extras.py), and a job in another language installs its toolchain itself on first use (sandboxes/toolchains.py).
EVAL_EXTRAS ?= local
$(STAMP): pyproject.toml
	@command -v bwrap >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		(apt-get install -y -q bubblewrap >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q bubblewrap >/dev/null 2>&1)) \
		&& echo "setup: installed bubblewrap" ; } || echo "setup: bubblewrap not installed (sandbox falls back to rlimits only)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(call install,.[$(EVAL_EXTRAS)])
	@touch $(STAMP)

# pip unpacks one wheel after another; uv (from PyPI, into the venv) installs the same pins several at a time, so a
# fresh machine's setup waits less (benchmarks/first_use.py). uv reads no pip settings: PIP_FIND_LINKS (a folder of
# local wheels, such as a CPU torch) is passed on. Where uv cannot be had or fails, pip installs it all.
# --compile-bytecode: pip writes every module's .pyc as it installs, uv does not; where PYTHONDONTWRITEBYTECODE is set
# no import writes them either, so every process would compile torch, transformers and the rest from source again.
install = { $(PY) -m pip install -q uv >/dev/null 2>&1 && $(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) \
	$$(for l in $$PIP_FIND_LINKS; do printf -- '--find-links %s ' "$$l"; done) -e '$(1)' 2>$(VENV)/.uv-said ; } || \
	{ echo "setup: uv did not install $(1) ($$(tail -n 1 $(VENV)/.uv-said 2>/dev/null || echo no uv)); pip does" ; \
	$(PY) -m pip install -q --upgrade pip && $(PY) -m pip install -q -e '$(1)' ; }

# What only the tests use, installed where apt works (as root; never fails): Docker (sandbox=docker), Chromium (the UI
# test), PostgreSQL (the MLflow-on-PostgreSQL test); then every language's toolchain, prepared once.
TEST_STAMP := $(VENV)/.fixlab-test-installed
apt_install = { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	(apt-get install -y -q $(1) >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q $(1) >/dev/null 2>&1)) \
	&& echo "setup: installed $(1) ($(2))" ; } || echo "setup: $(1) not installed ($(2): its tests skip)"
setup-test: $(TEST_STAMP)

TEST_EXTRAS := all,test
$(TEST_STAMP): $(STAMP)
	$(call install,.[$(TEST_EXTRAS)])
	@command -v dockerd >/dev/null 2>&1 || $(call apt_install,docker.io,sandbox=docker; build its image with make docker-image)
	@command -v chromium >/dev/null 2>&1 || $(call apt_install,chromium,the UI test)
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || $(call apt_install,postgresql,the MLflow-on-PostgreSQL test)
	$(MAKE) toolchains
	@touch $(TEST_STAMP)

# The five other languages' compilers and runtimes (Debian packages, as root), prepared once: make toolchains LANGS="go rust"
LANGS ?=
toolchains: setup
	$(PY) -m sandboxes.toolchains install $(LANGS)

# Main job: full HumanEvalFix on the embedded default (conf/config.yaml). Quick look: make eval ARGS="dataset.limit=10"
eval: setup
	$(PY) -m flows.evaluate $(ARGS)

# Three workers, whole files each (module fixtures load a model once), longest files first; one thread per model
# (tests/conftest.py). Much of the suite waits on subprocesses, servers and sandboxes: with two workers a core sat idle a
# quarter of the time, and a third fills it (the suite's time on 2 and 3 workers: issue #52's closing note).
TEST_WORKERS ?= 3
test: setup-test
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=15 $(ARGS)

# The suite without the tests marked slow (those that need a real model pack: download, conversion, real decoding)
test-quick: setup-test
	$(PY) -m pytest -q -m "not slow" $(ARGS)

# The Docker sandbox's image (sandboxes/image/build.sh): the Dockerfile online, a Debian rootfs offline.
# IMAGE_FROM=auto|dockerfile|rootfs, FORCE=1 rebuilds; starts dockerd (as root) when it is not running.
DOCKER_IMAGE ?= fixlab-sandbox:latest
IMAGE_FROM ?= auto
docker-image: setup
	IMAGE="$(DOCKER_IMAGE)" FROM="$(IMAGE_FROM)" FORCE="$(FORCE)" \
		PACKAGES="$$($(PY) -m sandboxes.toolchains packages 2>/dev/null)" sandboxes/image/build.sh

# MLflow UI on http://127.0.0.1:$(UI_PORT): one web worker and no job runner start in ~10 s and 0.5 GB
# (the default starts a 10-process job runner: 20-40 s, 1.9 GB). The store is made first under fixlab's store lock
# (flows/tracking.py), so the server never migrates a fresh store while a job started beside it does the same.
ui: setup
	@mkdir -p mlruns/artifacts
	@$(PY) -m flows.tracking init-store sqlite:///$(CURDIR)/mlruns/mlflow.db
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false DO_NOT_TRACK=true MLFLOW_DISABLE_TELEMETRY=true \
		$(VENV)/bin/mlflow server --workers 1 \
		--backend-store-uri sqlite:///$(CURDIR)/mlruns/mlflow.db \
		--default-artifact-root $(CURDIR)/mlruns/artifacts \
		--host 127.0.0.1 --port $(UI_PORT)

# Nightly regression (flows/nightly.py, conf/nightly.yaml): a real Prefect server (the temporary one runs no
# scheduler) on NIGHTLY_PORT, started unless one answers there, and the deployment served on its cron.
# Stop with Ctrl-C. `make nightly-now` (another shell) triggers one run at once; ARGS=--wait waits for it.
NIGHTLY_PORT ?= 4200
NIGHTLY_ENV = PREFECT_SERVER_API_HOST=127.0.0.1 PREFECT_SERVER_API_PORT=$(NIGHTLY_PORT) \
	PREFECT_API_URL=http://127.0.0.1:$(NIGHTLY_PORT)/api
nightly: setup
	$(NIGHTLY_ENV) $(PY) -m flows.nightly serve --start-server $(ARGS)

nightly-now: setup
	$(NIGHTLY_ENV) $(PY) -m flows.nightly now $(ARGS)

clean-runs:
	rm -rf mlruns/mlflow.db mlruns/mlflow.db.lock mlruns/artifacts mlruns/state outputs multirun
