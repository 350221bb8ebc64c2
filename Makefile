# Everything a fresh machine needs: Python 3.11+ (and, for the Spark connector, Java 17).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-docker lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "Magnetar needs Python 3.11 or newer (found: $$($(PYTHON) --version))"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: install
	$(BIN)/python scripts/demo.py

test: install
	$(BIN)/python -m pytest

# The suite against a real Apache Pulsar in Docker (testcontainers); fails if no engine answers.
test-docker: install
	MAGNETAR_REQUIRE_DOCKER=1 $(BIN)/python -m pytest tests/docker -m docker

lint: install
	$(BIN)/ruff check magnetar tests bench scripts
	$(BIN)/ruff format --check magnetar tests bench scripts
	$(BIN)/mypy

# Every benchmark; each writes JSON under bench/results and prints its comparison.
BENCHES := instance_throughput cluster_latency metadata_replay scheduler_scale state_throughput \
	state_materialize state_query js_throughput spark_read_throughput broker_heal chaos

bench: install
	@for b in $(BENCHES); do echo "== bench/$$b.py"; $(BIN)/python bench/$$b.py || exit 1; done

clean:
	rm -rf $(VENV) build bench/results .pytest_cache .mypy_cache .ruff_cache .hypothesis
