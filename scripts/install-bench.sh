#!/bin/bash
# make bench's own needs, outside make deps (a demo or a test run does without them).
set -euo pipefail
PREFIX=${DSPORTAL_PREFIX:-/opt/dsportal}
say() { echo "[bench] $*"; }
# make bench's load generator (locust: people clicking through the hubs), its profiler (py-spy) and its
# plots (matplotlib), in an environment of its own from bench/requirements.lock (versions and hashes):
# locust's gevent and Flask stay out of the hub's and the sessions' environment.
BENCH_ENV=$PREFIX/bench-env
LOCK=$(dirname "$0")/../bench/requirements.lock
wanted=$(sha256sum "$LOCK" | cut -c1-16)
if [ "$(cat "$BENCH_ENV/.dsportal-bench-lock" 2>/dev/null)" != "$wanted" ]; then
  say "bench/requirements.lock into $BENCH_ENV"
  [ -x "$BENCH_ENV/bin/python" ] || /usr/bin/python3 -m venv "$BENCH_ENV"
  "$BENCH_ENV/bin/pip" install -q --disable-pip-version-check --require-hashes -r "$LOCK"
  echo "$wanted" > "$BENCH_ENV/.dsportal-bench-lock"
fi
