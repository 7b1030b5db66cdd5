#!/bin/bash
# What the demo needs that takes minutes to build: PyTorch and Horovod for multi-node jobs
# (build-horovod.sh) and the demo's container images (`dsportal images build-demo`). `make demo` runs
# it with --background, so the portal serves first and these follow; `make test` runs it in the
# foreground before the tests. One build at a time per machine: a second waits for the first (or,
# in the background, leaves it to the first). While it runs the launcher shows each image
# "(being built, about N min)" (`dsportal images queue` and `heartbeat`, portal/core/images.py).
set -euo pipefail
[ "${1:-}" = --in-background ] || cd "$(dirname "$0")/.."
ENV=${DSPORTAL_PREFIX:-/opt/dsportal}/env
# The demo's images, from the demo's settings (dsportal's production commands refuse those elsewhere:
# DSPORTAL_DEMO says this is the demo; docs/reference/cli.md). make exports both already.
export DSPORTAL_DEMO=1
export DSPORTAL_CONFIG=${DSPORTAL_CONFIG:-${2:-$PWD}/config/portal.yaml}   # $2: the checkout, in the background
STATE=${DSPORTAL_DEMO_DIR:-/var/lib/dsportal-demo}
WHEELS=${DSPORTAL_WHEELS:-/var/cache/dsportal/wheels}
LOCK=$STATE/run/extras.lock LOG=$STATE/log/extras.log
HOROVOD_SECONDS=$WHEELS/.horovod-build-seconds   # how long the last Horovod build took here
say() { echo "[extras] $*"; }
mkdir -p "$STATE/run" "$STATE/log"

if [ "${1:-}" = --background ]; then
  # A copy of its own runs (a new file each time): bash reads a script as it goes, so a checkout
  # updated meanwhile (git pull), or a second make demo, would hand the running build other lines.
  copy=$(mktemp "$STATE/run/build-extras.XXXXXX")
  cp "$0" "$copy"
  setsid nohup bash "$copy" --in-background "$PWD" >>"$LOG" 2>&1 </dev/null &
  exit 0
fi
if [ "${1:-}" = --in-background ]; then
  case "$0" in "$STATE"/run/build-extras.*) rm -f "$0";; esac   # the copy (bash holds it open)
  cd "$2"       # the checkout (its scripts/build-horovod.sh)
fi
# The lock is root's alone: whoever could open it could hold a lock that stops every build. One
# left from an older version with other rights is made anew (a descriptor opened on it stays on it).
[ -e "$LOCK" ] && [ "$(stat -c '%u %a' "$LOCK")" != "0 600" ] && rm -f "$LOCK"
umask_was=$(umask); umask 077
exec 9>>"$LOCK"
umask "$umask_was"
if ! flock -n 9; then
  [ "${1:-}" = --in-background ] && { say "another build is running: left to it"; exit 0; }
  say "waiting for the build already running (log: $LOG)"
  flock 9
fi
started=$(date +%s)
echo $$ > "$STATE/run/extras.pid"   # make stop ends a background build (its whole process group)
say "started $(date -Is)"

# Queued first, so the launcher and the banner say "being built" from now on.
horovod_left=0
if ! ls "$WHEELS"/horovod-*.whl >/dev/null 2>&1; then horovod_left=$(cat "$HOROVOD_SECONDS" 2>/dev/null || echo 300); fi
"$ENV/bin/dsportal" images queue --wheels-in "$horovod_left" | sed 's/^/[extras] queued /'
# ... and kept fresh while this runs: marks its heartbeat stops touching are read as gone.
# (Without the lock's descriptor, and ending with this script even if it is killed outright.)
"$ENV/bin/dsportal" images heartbeat --parent $$ 9>&- &
heartbeat=$!
trap 'kill $heartbeat 2>/dev/null || true' EXIT

if [ "${1:-}" = --in-background ]; then
  # The portal's own start comes first: the builds wait until the hub answers (at most 5 min).
  "$ENV/bin/python" - <<'EOF' || true
import time, urllib.error, urllib.request
for _ in range(150):
    try:
        urllib.request.urlopen("http://127.0.0.1:8000/hub/login", timeout=2)
        break
    except urllib.error.HTTPError:
        break  # it answers
    except OSError:
        time.sleep(2)
EOF
fi

# VS Code in the browser for sessions (npm; its native modules compile here).
bash scripts/install-code-server.sh || say "code-server not installed: sessions offer the rest"

# Horovod compiles while the images that need no wheel of it are built beside it.
"$ENV/bin/dsportal" images build-demo --ready &
images=$!
horovod_started=$(date +%s)
bash scripts/build-horovod.sh "$ENV"
[ "$horovod_left" = 0 ] || echo $(( $(date +%s) - horovod_started )) > "$HOROVOD_SECONDS"
wait $images
"$ENV/bin/dsportal" images build-demo
say "done in $(( $(date +%s) - started )) s"
