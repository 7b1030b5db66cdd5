# The two commands: `make demo` (whole portal on an embedded cluster) and `make test`; `make lint` before a commit.
PY := /opt/dsportal/env/bin/python
export PATH := /opt/dsportal/env/bin:$(PATH)
# This Makefile is the demo's: its targets (demo, test, check, bench ...) run dsportal's production commands
# (`dsportal check`, `dsportal hub`, `dsportal images ...`) against the demo's own settings, which those commands
# refuse elsewhere (docs/reference/cli.md). A site's hub reads /etc/dsportal/portal.yaml, never this.
export DSPORTAL_CONFIG ?= $(CURDIR)/config/portal.yaml
export DSPORTAL_DEMO := 1
# The Slurm release of the demo and the suite: SLURM=24.11 or 26.05 (scripts/build-slurm.sh installs it into
# /opt/dsportal-slurm/RELEASE), SLURM=22.05 Debian's own; unset, the release the demo runs now (Debian's on a
# fresh machine). Switching releases starts Slurm's state afresh; another release than Debian's runs configless, on
# the portal.yaml the demo derives from config/portal.yaml (docs/reference/compatibility.md).
DEMO_DIR := $(or $(DSPORTAL_DEMO_DIR),/var/lib/dsportal-demo)
ifeq ($(origin SLURM),undefined)
SLURM := $(shell cat $(DEMO_DIR)/slurm/release 2>/dev/null)
endif
ifneq ($(filter-out 22.05,$(SLURM)),)
ifeq ($(shell echo '$(SLURM)' | grep -xE '[0-9]{2}\.[0-9]{2}'),)
$(error SLURM=$(SLURM): a Slurm release is YY.MM, e.g. 24.11)
endif
export DSPORTAL_SLURM := $(SLURM)
export PATH := /opt/dsportal-slurm/$(SLURM)/bin:$(PATH)
export DSPORTAL_CONFIG := $(DEMO_DIR)/config/portal-$(SLURM).yaml
else
export DSPORTAL_SLURM := 22.05
endif

.PHONY: deps slurm lock upgrade-check lint demo demo-log stop clean test quick check bench screenshots dist

# The environment, from requirements.lock (every package's version and hashes).
deps:
	bash scripts/install-deps.sh

# requirements.lock anew from pyproject.toml's ranges, keeping each pin that still fits; a release is
# taken with UV_ARGS="--upgrade-package NAME" (docs/how-to/take-a-security-release.md).
lock:
	bash scripts/uv.sh pip compile -q pyproject.toml --extra test --generate-hashes --python-version 3.11 \
	  --custom-compile-command "make lock" -o requirements.lock $(UV_ARGS)

# The newest versions the ranges allow, tried in a scratch environment: pip check, the patch checks
# (tests/test_upstream.py), and what would change. Changes nothing here.
upgrade-check:
	bash scripts/upgrade-check.sh $(UV_ARGS)

# ruff at this version (its rules: pyproject.toml's [tool.ruff]), run by scripts/uv.sh's uv from uv's
# cache: nothing goes into the portal's environment, and it needs neither root nor `make deps`.
RUFF := ruff==0.17.6
lint:
	bash scripts/uv.sh tool run --from $(RUFF) ruff check $(RUFF_ARGS)

# The demo cluster (democluster/, not installed) runs from this checkout with the portal's environment.
# The portal serves first; PyTorch, Horovod and the container images follow in the background
# (scripts/build-extras.sh; `make demo-log` follows it).
demo: deps slurm
	@bash scripts/build-extras.sh --background
	cd $(CURDIR) && $(PY) -m democluster up --images-later

# The release SLURM names, built once (about 4 min), and the demo's portal.yaml for it ($(DSPORTAL_CONFIG), which
# build-extras.sh reads before the demo is up): nothing for Debian's own.
slurm:
	@if [ "$(DSPORTAL_SLURM)" != 22.05 ]; then bash scripts/build-slurm.sh $(SLURM) && cd $(CURDIR) && \
	  $(PY) -c 'import sys, pathlib, democluster.base as b; b.release_config(pathlib.Path(sys.argv[1]))' config/portal.yaml; fi

demo-log:
	tail -n 20 -f $(DEMO_DIR)/log/extras.log

stop:
	@if [ -x $(PY) ]; then cd $(CURDIR) && $(PY) -m democluster down; fi

check:
	/opt/dsportal/env/bin/dsportal check

# Stops everything and deletes the demo state (jobs, LDAP data, hub database).
clean: stop
	rm -rf $(DEMO_DIR)

test: deps slurm
	bash scripts/build-extras.sh
	$(PY) -m pytest -p no:cacheprovider $(PYTEST_ARGS)

# The tests that need no cluster (marked quick): the checkout's code in the installed environment, nothing
# installed or started.
quick:
	@[ -x $(PY) ] || { echo "make quick runs in $(PY), which make deps (as root) installs" >&2; exit 1; }
	$(PY) -m pytest -p no:cacheprovider -m quick $(PYTEST_ARGS)

# A release: the sdist, then the wheel built from it (so the sdist is known to hold everything), into dist/
# (DIST=folder: there instead); the version is pyproject.toml's. With the environment's `build` where it has one,
# else setuptools' own sdist and pip's wheel; the environment's setuptools either way (no isolated build
# environment: nothing fetched). tests/test_release.py installs the wheel into a fresh environment.
DIST ?= dist
dist:
	@[ -x $(PY) ] || { echo "make dist builds with $(PY), which make deps (as root) installs" >&2; exit 1; }
	mkdir -p $(DIST) && rm -f $(DIST)/dsportal-*.whl $(DIST)/dsportal-*.tar.gz
	if (cd / && $(PY) -c 'import build.__main__') 2>/dev/null; then \
	  $(PY) -m build --no-isolation --outdir $(DIST) .; \
	else \
	  $(PY) -c 'import sys; from setuptools import build_meta; build_meta.build_sdist(sys.argv[1])' $(DIST) >/dev/null && \
	  $(PY) -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation --wheel-dir $(DIST) $(DIST)/*.tar.gz; \
	fi
	@ls -l $(DIST)

# Spawn latency, stop, concurrent spawns and dead-job detection: dsportal against stock
# batchspawner on the demo cluster, in the same run (bench/spawn_bench.py); the last line sums up.
# Its department is 2,000 strong (users.yaml's bench_students: the clicks' curve), its demo made so first.
bench: export DSPORTAL_DEMO_BENCH = 1
bench: demo
	bash scripts/build-extras.sh
	bash scripts/install-bench.sh
	$(PY) bench/spawn_bench.py $(BENCH_ARGS)

# The README's and the docs' screenshots, from the running demo (alice's form, the Jobs panel with a grid and a
# schedule, a shared session from both sides): scripts/screenshots.py, a real browser, nothing left behind.
screenshots:
	$(PY) scripts/screenshots.py
