#!/bin/bash
# make bench's own needs, outside make deps (a demo or a test run does without them).
set -euo pipefail
PREFIX=${DSPORTAL_PREFIX:-/opt/dsportal}
say() { echo "[bench] $*"; }
# make bench's load generator (locust: 300 people clicking through the hub while a class starts), in an
# environment of its own: its gevent and Flask stay out of the hub's and the sessions' environment.
BENCH_ENV=$PREFIX/bench-env
LOCUST=locust==2.47.0
if [ "$(cat "$BENCH_ENV/.dsportal-locust" 2>/dev/null)" != "$LOCUST" ]; then
  say "$LOCUST for make bench ($BENCH_ENV)"
  [ -x "$BENCH_ENV/bin/python" ] || /usr/bin/python3 -m venv "$BENCH_ENV"
  "$BENCH_ENV/bin/pip" install -q --disable-pip-version-check "$LOCUST"
  echo "$LOCUST" > "$BENCH_ENV/.dsportal-locust"
fi
