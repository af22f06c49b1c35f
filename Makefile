# Two commands: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean

# pip byte-compiles what it installs one file at a time (~20 s of torch here); compileall does it on every core
# (~5 s). A few third-party files are for newer Pythons (torch's py312 test helpers) and do not compile on this one:
# pip skips those silently, and so does this (-qq, and its exit status is not the install's).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --no-compile -e '.[test]'
	$(BIN)/python -m compileall -qq -j 0 $(VENV)/lib || true
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/geomx launch topologies/demo.yaml -- $(BIN)/python examples/cnn.py --epochs 8

# Two test modules at a time (pytest-xdist; a module's tests stay together, so its fixtures' jobs run once): alone,
# the suite leaves a core idle a fifth of the time (processes waiting on each other, heartbeat timeouts).
# Byte-compiled first: the tests start hundreds of processes, and where PYTHONDONTWRITEBYTECODE is set (CI
# machines) each would compile every module it imports again (~0.4 CPU-s per worker)
test: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/ruff check src tests examples benchmarks scripts
	$(BIN)/python -m compileall -q src tests
	$(BIN)/python -m pytest -q -n 2 --dist loadscope tests

bench: $(STAMP)
	$(BIN)/geomx bench

clean:
	rm -rf $(VENV) runs
