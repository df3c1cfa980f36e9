# The make targets are the interface; see README.md.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
ARGS ?=
# What each target needs installed (scripts/install.sh: the locked dependencies, under a lock).
RUNTIME := $(VENV)/.installed-runtime-$(shell cat pyproject.toml requirements/runtime.txt | cksum | cut -d' ' -f1)
STAMP := $(VENV)/.installed-dev-$(shell cat pyproject.toml requirements/dev.txt | cksum | cut -d' ' -f1)

.PHONY: run test lint fmt proto docs demo bench load soak fuzz attack mutants image-test compat lock clean system

$(RUNTIME): pyproject.toml requirements/runtime.txt
	@PYTHON=$(PYTHON) sh scripts/install.sh runtime

$(STAMP): pyproject.toml requirements/dev.txt
	@PYTHON=$(PYTHON) sh scripts/install.sh dev

UPGRADE ?= --upgrade
lock:  ## the locked dependency sets (requirements/*.txt, with hashes) from pyproject.toml, newest allowed (UPGRADE="--upgrade-package NAME": that one only)
	@test -x .tools/piptools/bin/pip-compile || { $(PYTHON) -m venv .tools/piptools && .tools/piptools/bin/pip install --quiet pip-tools==7.6.2; }
	.tools/piptools/bin/pip-compile --quiet --generate-hashes --strip-extras --allow-unsafe --no-emit-index-url --no-emit-find-links $(UPGRADE) --extra postgres -o requirements/runtime.txt pyproject.toml
	.tools/piptools/bin/pip-compile --quiet --generate-hashes --strip-extras --allow-unsafe --no-emit-index-url --no-emit-find-links $(UPGRADE) --extra postgres --extra dev -o requirements/dev.txt pyproject.toml

system:  ## the host's programs: bubblewrap and socat (the sandbox), git (snapshots)
	@sh scripts/ensure_system.sh

run: $(RUNTIME) system  ## start the service (the offline scripted model unless a model credential is set)
	$(VENV)/bin/agent-rewind serve $(ARGS)

# Test workers (pytest-xdist): the integration tests mostly wait on the CLI and server processes
# they start, so two keep two cores busy. JOBS=0: one process, no workers.
JOBS ?= 2
test: $(STAMP) system  ## unit and integration tests, against the real Claude Code CLI (JOBS workers, default 2)
	$(PY) -m pytest -n $(JOBS) --dist worksteal $(ARGS)

lint: $(STAMP)  ## ruff, mypy --strict, proto lint
	$(VENV)/bin/ruff check src tests scripts benchmarks docs/examples
	$(VENV)/bin/ruff format --check src tests scripts benchmarks docs/examples
	$(VENV)/bin/mypy
	$(PY) scripts/lint_protos.py

fmt: $(STAMP)
	$(VENV)/bin/ruff format src tests scripts benchmarks docs/examples
	$(VENV)/bin/ruff check --fix src tests scripts benchmarks docs/examples

proto: $(STAMP)  ## regenerate src/agent_rewind/api/v1 and the Node client's copy (clients/node/protos) from protos/
	$(PY) scripts/gen_protos.py

docs: $(STAMP)  ## regenerate what the docs show as the code's output (flag table, --help)
	$(PY) scripts/gen_docs.py

demo: $(RUNTIME)  ## walk through the product against a running `make run`
	$(PY) scripts/demo.py $(ARGS)

bench: $(STAMP) system  ## speed targets, medians side by side
	$(PY) -m benchmarks $(ARGS)

fuzz: $(STAMP) system  ## every hostile-input property and RPC fuzz with at least 10,000 examples each, and the workspace watch's model with 3,000 (tens of minutes)
	AGENT_REWIND_FUZZ=1 AGENT_REWIND_WATCH_EXAMPLES=3000 $(PY) -m pytest tests/unit/test_hostile_input.py \
		tests/integration/test_fuzz.py tests/unit/snapshots/test_watch.py \
		-p no:cacheprovider --hypothesis-show-statistics -q $(ARGS)

attack: $(STAMP) system  ## the tenant-isolation attacks at full strength: a path swapped for a link during 5,000 file-tool calls of the real CLI (minutes)
	AGENT_REWIND_RACE_ROUNDS=1000 $(PY) -m pytest tests/integration/test_isolation.py -k swapped -p no:cacheprovider -q $(ARGS)

image-test: $(STAMP) system  ## build the image from the Dockerfile and run it as the pod does (minutes; root, buildah, podman)
	$(PY) scripts/image_test.py $(ARGS)

compat: $(STAMP) system  ## the integration suite against the newest claude-agent-sdk, in a venv of its own (minutes)
	$(PY) scripts/compat.py $(ARGS)

mutants: $(STAMP) system  ## mutation testing of the modules where a silent bug costs most (about three hours; ARGS="--only NAME" for one group)
	$(PY) scripts/mutants.py $(ARGS)

load: $(STAMP) system  ## many tenants at once: 200 sessions of 20 principals, 50 watchers, a mix of every RPC, per-RPC rates and latencies, every session checked against a model (a few minutes; ARGS="--replicas 2", "--scaling")
	$(PY) -m benchmarks.load $(ARGS)

soak: $(STAMP) system  ## random prompts, rewinds, interrupts and server SIGKILLs against a model (a few minutes)
	$(PY) scripts/soak.py $(ARGS)

clean:
	rm -rf $(VENV) $(VENV).lock var .pytest_cache .mypy_cache .ruff_cache .mutants coverage .compat
