# The two commands: `make run` and `make test`. Both work from a fresh clone.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 8501
# Test processes (pytest-xdist): the browser tests mostly wait on their app's server, so two
# share two cores well; each worker serves its own app on its own ports (tests/browser/harness.py).
TEST_WORKERS ?= 2
# The Triton interpreter leans on numpy; on a small CPU, one BLAS thread is fastest.
export OPENBLAS_NUM_THREADS ?= 1

.PHONY: run test install install-test chromium nginx bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# Reinstall only when a requirements file changed (stamp files live inside .venv).
$(VENV)/.stamp-run: requirements.txt requirements-nodeps.txt | $(PY)
	$(PY) -m pip install -r requirements.txt
	$(PY) -m pip install --no-deps -r requirements-nodeps.txt
	touch $@

$(VENV)/.stamp-test: requirements-test.txt $(VENV)/.stamp-run
	$(PY) -m pip install -r requirements-test.txt
	touch $@

install: $(VENV)/.stamp-run
install-test: $(VENV)/.stamp-test chromium nginx

# Debian's chromium for the browser tests: installed with apt-get when we are root and it is
# missing. Never a Playwright browser download.
chromium:
	@if [ ! -x /usr/bin/chromium ]; then \
	  if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; \
	  else \
	    echo "chromium not found and not root: browser tests will be skipped"; \
	  fi; \
	fi

# Debian's nginx for the deployment test (tests/test_deploy.py), the same way: installed with
# apt-get when we are root and it is missing; otherwise that test skips. The test runs its own
# nginx instance (deploy/lab.sh) and leaves the package's system service as Debian set it up.
nginx:
	@if [ ! -x /usr/sbin/nginx ] && ! command -v nginx >/dev/null; then \
	  if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nginx; \
	  else \
	    echo "nginx not found and not root: the deployment test will be skipped"; \
	  fi; \
	fi

run: install
	$(PY) -m ui.serve --server.port $(PORT) --server.headless true --browser.gatherUsageStats false

test: install-test
	$(PY) -m pytest -n $(TEST_WORKERS)

bench: install
	$(PY) bench/allocator.py
	$(PY) bench/kernel.py
	$(PY) bench/scheduler.py
	$(PY) bench/model.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
