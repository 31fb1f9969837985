# Two entry points: `make demo` (main job end to end) and `make test` (whole suite).
# Each creates .venv and installs what it needs on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck bench clean venv browser nginx

venv: $(STAMP)

# pip byte-compiles the venv's ~19,000 modules one by one (about 55 s on one core);
# compileall does it on every core instead. Compiled here, not on first import: with
# PYTHONDONTWRITEBYTECODE set (as on CI) nothing imported is ever written, and every
# interpreter of the suite compiled transformers again (1,272 s instead of 808 s). Its
# exit status is ignored as pip ignores it: a few test files of torch are Python 3.12.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-compile -e '.[dev]'
	$(PY) -m compileall -q -j 0 $(VENV)/lib > /dev/null 2>&1 || true
	touch $(STAMP)

demo: $(STAMP)
	$(PY) tools/demo.py

# Three workers (the suite's servers bind free 127.0.0.1 ports and tmp folders only); a
# test file stays on one worker, so its module-scoped servers start once. The project's
# own modules are compiled first: the suite starts a thousand or so interpreters that
# import cmh (cmh serve, the CLI), and where PYTHONDONTWRITEBYTECODE is set none of them
# writes what it compiled (0.1 s of CPU each, 0.4 s instead of 0.3 s to import).
test: $(STAMP) browser nginx
	$(PY) -m compileall -q -j 0 cmh hub cli tests > /dev/null
	$(PY) -m pytest -q -n 3 --dist loadfile

# Debian packages the suite drives for real, installed with apt when missing (as root, or
# with passwordless sudo); if that fails the tests that need them skip and say why.
#   $(call apt_install,CHECK-COMMAND,PACKAGES,WHAT-SKIPS)
APT = $$( [ "$$(id -u)" = 0 ] || echo sudo -n )
define apt_install
	@if $(1); then :; \
	elif ( $(APT) apt-get update -qq && \
	       DEBIAN_FRONTEND=noninteractive $(APT) apt-get install -y -qq $(2) ) >/dev/null 2>&1; then \
	  echo "installed $(2)"; \
	else echo "warning: cannot apt-get install $(2): $(3) will be skipped"; fi
endef

# Headless Chromium for the web-page tests (Selenium never downloads a browser).
browser:
	$(call apt_install,[ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ],chromium chromium-driver,browser tests)

# nginx in front of `cmh serve --blob-delivery x-accel` (tests/hub/test_mirror_xaccel.py).
nginx:
	$(call apt_install,command -v nginx >/dev/null || [ -x /usr/sbin/nginx ],nginx-light,x-accel tests)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) tools/lint_imports.py

typecheck: $(STAMP)
	$(PY) tools/typecheck.py

# Every benchmark; each prints ratios against a baseline measured in the same run.
BENCHES := fingerprint verify_cli load mirror delta download prune semantic web scaleout pullthrough
bench: $(STAMP)
	@for b in $(BENCHES); do echo "== bench/$$b.py"; $(PY) bench/$$b.py || exit 1; done

clean:
	rm -rf $(VENV) build .typecheck demo-work bench-work
