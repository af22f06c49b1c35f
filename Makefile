# Two commands: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/geomx launch topologies/demo.yaml -- $(BIN)/python examples/cnn.py --epochs 8

# byte-compiled first: the tests start hundreds of processes, and where PYTHONDONTWRITEBYTECODE is set (CI
# machines) each would compile every module it imports again (~0.4 CPU-s per worker)
test: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/python -m compileall -q src tests
	$(BIN)/python -m pytest -q tests

bench: $(STAMP)
	$(BIN)/geomx bench

clean:
	rm -rf $(VENV) runs
