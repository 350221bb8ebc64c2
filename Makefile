# Everything a fresh machine needs: Python 3.11+ (and, for the Spark connector, Java 17).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint bench clean

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

lint: install
	$(BIN)/ruff check magnetar tests bench scripts
	$(BIN)/ruff format --check magnetar tests bench scripts
	$(BIN)/mypy

bench: install
	$(BIN)/python bench/instance_throughput.py

clean:
	rm -rf $(VENV) build bench/results .pytest_cache .mypy_cache .ruff_cache .hypothesis
