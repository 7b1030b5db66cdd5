# The two commands: `make demo` (whole portal on an embedded cluster) and `make test`.
PY := /opt/dsportal/env/bin/python
export PATH := /opt/dsportal/env/bin:$(PATH)
# The checkout's config is the one admins edit (the installed package carries a copy).
export DSPORTAL_CONFIG ?= $(CURDIR)/config/portal.yaml

.PHONY: deps demo stop clean test check bench

deps:
	bash scripts/install-deps.sh

demo: deps
	/opt/dsportal/env/bin/dsportal demo up

stop:
	@if [ -x $(PY) ]; then /opt/dsportal/env/bin/dsportal demo down; fi

check:
	/opt/dsportal/env/bin/dsportal check

# Stops everything and deletes the demo state (jobs, LDAP data, hub database).
clean: stop
	rm -rf $${DSPORTAL_DEMO_DIR:-/var/lib/dsportal-demo}

test: deps
	$(PY) -m pytest -p no:cacheprovider $(PYTEST_ARGS)

# Spawn latency, stop, concurrent spawns and dead-job detection: dsportal against stock
# batchspawner on the demo cluster, in the same run (bench/spawn_bench.py); the last line sums up.
bench: demo
	$(PY) bench/spawn_bench.py $(BENCH_ARGS)
