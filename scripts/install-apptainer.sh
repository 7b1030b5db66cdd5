#!/usr/bin/env bash
# Installs Apptainer, the portal's production container runtime, without setuid, into a private
# world-readable prefix (default /opt/apptainer, `apptainer` linked into /usr/local/bin).
#
# Debian bookworm has no apptainer package; Debian unstable (same registry) has it, built against a
# newer C library than bookworm's. Apptainer without setuid is relocatable, so: unstable's apptainer,
# libc6, libseccomp2 and libsqlite3-0 are unpacked into the prefix, and the ELF interpreter and a
# DT_RPATH of the two binaries (apptainer, starter) point at the prefix's libraries. DT_RPATH, not
# RUNPATH: it also applies to the libraries' own dependencies (libsqlite3 needs the newer libm).
# Nothing of the host's C library changes.
#
# The .deb files come through apt from unstable's signed index (apt checks each file's SHA256
# against it), pinned below, and are cached in $CACHE: later runs need no network.
# Idempotent and quick when installed. Usage: install-apptainer.sh [--prefix DIR]
set -euo pipefail
PREFIX=${DSPORTAL_APPTAINER_PREFIX:-/opt/apptainer}
[ "${1:-}" = "--prefix" ] && PREFIX=$2
CACHE=${DSPORTAL_APPTAINER_CACHE:-/var/cache/dsportal/apptainer}
MIRROR=${DSPORTAL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
say() { echo "[apptainer] $*"; }

# package=version sha256 (from unstable's Packages index, 2026-11-25)
PINNED=(
  "apptainer=1.4.5-2 26cf96e08fccb0e50ea0f285a5a19f940ee873d167a0680584fe6eba7d197d65"
  "libc6=2.43-7 5c71715c51103beb4fbba9fe9f8dff604af6610dfa71c70bff342f54a7860803"
  "libseccomp2=2.6.1-1+b2 2d97c9f6ce55043caff1f6818ff9f85693528604f9d7538bd1ff61a492db8567"
  "libsqlite3-0=3.53.4-2 bbf13c9326764d05e37e6590debdaa6f33af6bd822e3ca1204789d9d1dc23b11"
)
WANT_VERSION=1.4.5

[ "$(id -u)" = 0 ] || { echo "install-apptainer.sh must run as root" >&2; exit 1; }
stamp="$PREFIX/.dsportal-apptainer"
want=$(printf '%s\n' "${PINNED[@]}" | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && "$PREFIX/usr/bin/apptainer" --version >/dev/null 2>&1; then
  ln -sfn "$PREFIX/usr/bin/apptainer" /usr/local/bin/apptainer
  exit 0
fi

# --- the .deb files: from the cache, else through apt from unstable (a private apt state) --------
mkdir -p "$CACHE"
deb_of() { # package=version -> the cached file name apt gives it (':' in versions becomes %3a)
  local name=${1%%=*} version=${1#*=}
  echo "$CACHE/${name}_${version//:/%3a}_amd64.deb"
}
missing=()
for entry in "${PINNED[@]}"; do
  read -r spec sum <<<"$entry"
  file=$(deb_of "$spec")
  if [ -f "$file" ] && echo "$sum  $file" | sha256sum -c --quiet 2>/dev/null; then continue; fi
  rm -f "$file"
  missing+=("$spec")
done
if [ ${#missing[@]} -gt 0 ]; then
  source "$(dirname "$0")/private-apt.sh"
  private_apt deb unstable
  say "apt-get download ${missing[*]} (Debian unstable)"
  apt-get "${apt_opts[@]}" update -q >/dev/null
  if ! (cd "$CACHE" && apt-get "${apt_opts[@]}" download "${missing[@]}" >/dev/null); then
    # unstable moves on: a pinned version can leave its index. Take what it has now (still checked
    # by apt against the signed index) and say so, rather than leave the cluster without a runtime.
    say "WARNING: pinned versions gone from unstable; taking its current ${missing[*]%%=*}"
    (cd "$CACHE" && apt-get "${apt_opts[@]}" download "${missing[@]%%=*}" >/dev/null)
  fi
fi
for entry in "${PINNED[@]}"; do
  read -r spec sum <<<"$entry"
  file=$(deb_of "$spec")
  [ -f "$file" ] && { echo "$sum  $file" | sha256sum -c --quiet || { echo "checksum mismatch: $file" >&2; exit 1; }; }
done

# --- unpack and relocate ---------------------------------------------------------------------------
partial="$PREFIX.partial"
rm -rf "$partial"
mkdir -p "$partial"
for spec in apptainer libc6 libseccomp2 libsqlite3-0; do
  file=$(ls -t "$CACHE/${spec}_"*_amd64.deb | head -n 1)
  dpkg-deb -x "$file" "$partial"
done
lib="$PREFIX/usr/lib/x86_64-linux-gnu"
for binary in usr/bin/apptainer usr/lib/x86_64-linux-gnu/apptainer/bin/starter; do
  patchelf --set-interpreter "$lib/ld-linux-x86-64.so.2" --force-rpath --set-rpath "$lib" "$partial/$binary"
done
# It looks for its configuration and state relative to its own place: usr/etc (apptainer) and,
# as its libexec sits under usr/lib/x86_64-linux-gnu, usr/lib/var/lib (starter's session folder).
ln -sfn ../etc "$partial/usr/etc"
mkdir -p "$partial/usr/lib/var"
ln -sfn ../../../var/lib "$partial/usr/lib/var/lib"
ln -sfn ../../etc "$partial/usr/lib/etc"
chmod -R a+rX,go-w "$partial"
rm -rf "$PREFIX"
mv "$partial" "$PREFIX"
ln -sfn "$PREFIX/usr/bin/apptainer" /usr/local/bin/apptainer
version=$("$PREFIX/usr/bin/apptainer" --version)
case "$version" in *"$WANT_VERSION"*) ;; *) say "WARNING: installed $version, pinned $WANT_VERSION" ;; esac
echo "$want" > "$stamp"
say "ready: $version in $PREFIX (/usr/local/bin/apptainer)"
