# Two entry points: `make demo` (main job end to end) and `make test` (whole suite).
# Each creates .venv and installs what it needs on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck bench clean venv browser

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) tools/demo.py

test: $(STAMP) browser
	$(PY) -m pytest -q

# Headless Chromium for the web-page tests (Debian packages; Selenium never downloads a browser).
# Installed with apt when missing; if that fails the browser tests skip and say why.
browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then :; \
	elif ( $$( [ "$$(id -u)" = 0 ] || echo sudo -n ) apt-get update -qq && \
	       DEBIAN_FRONTEND=noninteractive $$( [ "$$(id -u)" = 0 ] || echo sudo -n ) \
	       apt-get install -y -qq chromium chromium-driver ) >/dev/null 2>&1; then \
	  echo "installed chromium and chromium-driver"; \
	else echo "warning: cannot apt-get install chromium chromium-driver: browser tests will be skipped"; fi

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(PY) tools/typecheck.py

# Every benchmark; each prints ratios against a baseline measured in the same run.
BENCHES := fingerprint verify_cli mirror delta download prune semantic web scaleout pullthrough
bench: $(STAMP)
	@for b in $(BENCHES); do echo "== bench/$$b.py"; $(PY) bench/$$b.py || exit 1; done

clean:
	rm -rf $(VENV) build .typecheck demo-work bench-work
