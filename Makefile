# Two commands: `make demo` and `make test`. Each creates .venv (Python 3.11) when missing.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast bench clean

$(STAMP): setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python scripts/demo.py

test: $(STAMP)
	$(BIN)/python -m pytest -q tests --durations=25

# pure-logic tests only (no msrun), milliseconds each
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q tests -m "not msrun"

bench: $(STAMP)
	$(BIN)/python bench/comm.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache build dist
