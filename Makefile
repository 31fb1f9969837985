# Two entry points: `make demo` (main job end to end) and `make test` (whole suite).
# Each creates .venv and installs what it needs on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck bench clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) tools/demo.py

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(PY) tools/typecheck.py

# Every benchmark; each prints ratios against a baseline measured in the same run.
BENCHES := fingerprint verify_cli mirror delta download prune semantic
bench: $(STAMP)
	@for b in $(BENCHES); do echo "== bench/$$b.py"; $(PY) bench/$$b.py || exit 1; done

clean:
	rm -rf $(VENV) build .typecheck demo-work bench-work
