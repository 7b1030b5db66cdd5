#!/usr/bin/env bash
# Tries the newest versions that pyproject.toml's ranges allow, in a scratch environment: resolves
# them (uv), installs them there with their hashes, checks that environment (pip check) and
# dsportal's patches of upstream internals against it (tests/test_upstream.py), and lists what
# would change. Nothing outside the scratch folder changes.
#   bash scripts/upgrade-check.sh [uv's choice, default --upgrade; e.g. --upgrade-package jupyterhub]
set -uo pipefail
export LC_ALL=C  # sort and join agree on the order
cd "$(dirname "$0")/.."
choice=("${@:---upgrade}")
scratch=$(mktemp -d "${TMPDIR:-/tmp}/dsportal-upgrade-check.XXXXXX")
say() { echo "[upgrade-check] $*"; }
pins() { grep -E '^[A-Za-z0-9._-]+==' "$1" | sed 's/ .*//; s/==/ /' | tr 'A-Z_' 'a-z-' | sort; }  # "name version"

cp requirements.lock "$scratch/requirements.lock"
say "resolving (${choice[*]}) into $scratch/requirements.lock"
bash scripts/uv.sh pip compile -q pyproject.toml --extra test --generate-hashes --python-version 3.11 \
  --custom-compile-command "make lock" "${choice[@]}" -o "$scratch/requirements.lock" || exit 1
changes=$(join -a2 -e '(new)' -o 0,1.2,2.2 <(pins requirements.lock) <(pins "$scratch/requirements.lock") |
          awk '$2 != $3 {printf "  %s %s -> %s\n", $1, $2, $3}')
gone=$(join -v1 <(pins requirements.lock) <(pins "$scratch/requirements.lock") | awk '{printf "  %s %s -> (gone)\n", $1, $2}')
if [ -z "$changes$gone" ]; then
  say "requirements.lock has the newest versions already"
  rm -rf "$scratch"
  exit 0
fi

say "installing them into a scratch environment ($scratch/env)"
/usr/bin/python3 -m venv "$scratch/env"
"$scratch/env/bin/pip" install -q --disable-pip-version-check --require-hashes -r "$scratch/requirements.lock" || exit 1
"$scratch/env/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation . || exit 1
failed=()
"$scratch/env/bin/pip" check || failed+=("pip check")
PYTHONPATH=$PWD "$scratch/env/bin/python" -m pytest -p no:cacheprovider -q tests/test_upstream.py || failed+=("the patch checks")

echo
say "what would change:"
echo "$changes${gone:+
$gone}"
if [ ${#failed[@]} -gt 0 ]; then
  say "FAILED: ${failed[*]} (above). A patch that failed names the upstream code to re-check:"
  say "docs/how-to/take-a-security-release.md. The scratch environment stays in $scratch."
  exit 1
fi
say "pip check and the patch checks pass. To take these versions: make lock UV_ARGS='${choice[*]}',"
say "then make deps and make test (docs/how-to/take-a-security-release.md)."
rm -rf "$scratch"
