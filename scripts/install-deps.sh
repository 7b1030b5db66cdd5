#!/usr/bin/env bash
# Installs what dsportal needs on Debian bookworm (as root): Debian packages, Node.js for
# configurable-http-proxy, and one world-readable Python environment built from
# /usr/bin/python3 (hub and sessions; users cannot read root's own Python).
# Idempotent and quick when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${DSPORTAL_PREFIX:-/opt/dsportal}
ENV=$PREFIX/env
say() { echo "[install] $*"; }
# pip, without the one warning per package that a pip.conf naming a missing local index folder
# (extra-index-url = file:///...) gives; every other line passes.
pip_() { "$ENV/bin/pip" "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }

[ "$(id -u)" = 0 ] || { echo "install-deps.sh must run as root" >&2; exit 1; }

packages=(slurm-wlm munge slapd ldap-utils python3 python3-venv python3-dev procps util-linux sudo charliecloud debootstrap
          openmpi-bin libopenmpi-dev cmake g++ chromium nftables slurmdbd mariadb-server libnss-myhostname
          patchelf squashfs-tools  # Apptainer from Debian unstable, relocated (scripts/install-apptainer.sh)
          systemd   # systemd-analyze verify of the shipped units (tests/test_deploy.py); not run as PID 1
          postgresql  # the hub on PostgreSQL: tests/test_database_postgres.py runs a server of its own
          exim4-daemon-light bsd-mailx  # the login node's MTA (local delivery) and Slurm's MailProg /usr/bin/mail
          make dpkg-dev  # scrontab, built from Debian's source (scripts/build-scrontab.sh)
          r-cran-irkernel  # the sessions' R kernel (portal/session/tool/offer.py)
          samba samba-ad-dc samba-ad-provision)  # Active Directory for tests/test_ldap_ad.py (never started as a service)
command -v node >/dev/null 2>&1 || packages+=(nodejs)
command -v npm >/dev/null 2>&1 || packages+=(npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log=/var/log/dsportal-install-apt.log
  say "apt-get install: ${#missing[@]} packages (log: $log)"
  export DEBIAN_FRONTEND=noninteractive
  # Samba's daemons stay off this machine: tests/test_ldap_ad.py runs its own domain controller in a network
  # namespace. A policy-rc.d (where none is there) keeps the packages' scripts from starting smbd and nmbd.
  no_start=""
  if [[ " ${missing[*]} " == *" samba "* ]] && [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && no_start=1
  fi
  { apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"; } > "$log" 2>&1 ||
    { [ -z "$no_start" ] || rm -f /usr/sbin/policy-rc.d; tail -n 30 "$log"; echo "[install] apt-get failed: see $log" >&2; exit 1; }
  if [ -n "$no_start" ]; then
    rm -f /usr/sbin/policy-rc.d
    systemctl disable smbd nmbd winbind samba-ad-dc > /dev/null 2>&1 || true
  fi
fi

mkdir -p "$PREFIX"
chmod 755 "$PREFIX"
bash scripts/install-apptainer.sh
bash scripts/build-scrontab.sh
# Node packages, locked (config/NAME/package-lock.json: every package's version and integrity hash): npm ci
# into $PREFIX/NAME, again whenever config/NAME's package.json or lock changed (the stamp .dsportal-lock).
npm_locked() {
  local name=$1 what=$2 dest=$PREFIX/$1 want
  want=$(cat "config/$name/package.json" "config/$name/package-lock.json" | sha256sum | cut -c1-16)
  if [ ! -f "$dest/node_modules/.package-lock.json" ] || [ "$(cat "$dest/.dsportal-lock" 2>/dev/null)" != "$want" ]; then
    say "$what (npm ci, config/$name/package-lock.json)"
    mkdir -p "$dest"
    cp "config/$name/package.json" "config/$name/package-lock.json" "$dest/"
    (cd "$dest" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
    echo "$want" > "$dest/.dsportal-lock"
  fi
}
npm_locked chp "configurable-http-proxy"  # portal/hub/proxy.js patches its 4.6.3
# The demo's and the tests' OpenID provider (democluster/oidc-provider.mjs): for make's targets only (the Makefile
# exports DSPORTAL_DEMO=1), never on a site's login node, which deploy.md installs with this script too.
if [ "${DSPORTAL_DEMO:-}" = 1 ]; then
  npm_locked oidc "OpenID provider for the demo and tests"
fi

if [ ! -x "$ENV/bin/python" ]; then
  say "Python environment $ENV from /usr/bin/python3"
  /usr/bin/python3 -m venv "$ENV"
  fi
# Every package at the version and with the hashes requirements.lock names (make lock, from
# pyproject.toml's ranges); reinstalled when the lock changes.
stamp="$ENV/.dsportal-deps"
want=$(sha256sum requirements.lock | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  say "Python packages (requirements.lock changed)"
  pip_ install -q --disable-pip-version-check --require-hashes -r requirements.lock
  echo "$want" > "$stamp"
fi
# Sessions do not load jupyter_lsp's server extension (no language server is installed for it to
# run) nor notebook_shim's (it adapts classic Notebook server extensions, and sessions have none).
for extension in jupyter_lsp notebook_shim; do
  "$ENV/bin/jupyter" server extension disable --sys-prefix "$extension" >/dev/null 2>&1 || true
done
# PyTorch (CPU) and Horovod for multi-node jobs come after, from scripts/build-extras.sh (make demo runs it
# in the background, make test before the tests): they take minutes, and the portal serves without them.
# Our own code: always the checkout's current version (a copy, readable by every user). setuptools builds in
# build/ and never deletes there what the checkout no longer has: a module moved or removed would be installed
# still, from an earlier build. So the build starts empty.
rm -rf build dsportal.egg-info
pip_ install -q --disable-pip-version-check --no-deps --no-build-isolation --force-reinstall .
# Every package's requirements met: nothing missing, nothing at a version another one excludes.
"$ENV/bin/pip" check --disable-pip-version-check >/dev/null || { "$ENV/bin/pip" check; exit 1; }
# The JupyterLab extension, built from its TypeScript sources by JupyterLab's builder (cached).
bash scripts/build-labextension.sh "$ENV"
# The patches' fingerprints checked in full once here, against the installed upstream sources: each start
# (the hub, every session) then only stats those files (portal/upstream/patchcheck.py: record_verified). A file
# changed since (an upgrade, scripts/build-extras.sh) is checked in full again as it starts.
rm -f "$PREFIX/patchcheck-verified.json"
DSPORTAL_PREFIX=$PREFIX "$ENV/bin/python" -c 'from portal.upstream import patchcheck, hub as h, session as s
[patchcheck.record_verified(u.PATCHES) for u in (h, s)]' || true
chmod -R a+rX "$ENV" "$PREFIX/chp"
[ ! -d "$PREFIX/oidc" ] || chmod -R a+rX "$PREFIX/oidc"
[ ! -f "$PREFIX/patchcheck-verified.json" ] || chmod 644 "$PREFIX/patchcheck-verified.json"
say "ready: $ENV"
