#!/usr/bin/env bash
# Runs uv, the tool that makes requirements.lock (make lock, make upgrade-check), installed once into
# a folder of its own: never into the portal's environment.
set -euo pipefail
UV=uv==0.13.9
tools=${DSPORTAL_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/dsportal-tools}
if [ "$(cat "$tools/.dsportal-uv" 2>/dev/null)" != "$UV" ]; then
  [ -x "$tools/bin/python" ] || /usr/bin/python3 -m venv "$tools"
  "$tools/bin/pip" install -q --disable-pip-version-check "$UV" >&2
  echo "$UV" > "$tools/.dsportal-uv"
fi
exec "$tools/bin/uv" "$@"
