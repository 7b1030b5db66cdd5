#!/usr/bin/env bash
# Builds a newer Slurm release beside the installed Debian Slurm 22.05, into a private prefix
# (/opt/dsportal-slurm/RELEASE: bin, sbin, lib with its plugins, etc), so that the demo cluster and the
# tests can be run on it. Nothing of the installed slurm-wlm, slurm-client, munge or libslurm changes:
# the binaries find their own libslurm through their RPATH, their configuration in the prefix's etc
# unless SLURM_CONF names another.
#
# The source is Debian's own source package of the suite that carries the release (24.11: trixie,
# 26.05: unstable), fetched through apt from a private apt state (deb-src for that suite only, signed
# by the Debian archive keyring; apt checks each file's SHA256 against the signed index) and cached in
# $CACHE; the machine's own apt sources are not touched. dpkg-source -x applies Debian's patches
# (debian/patches/series). Where the mirror serves the upstream tarball but not Debian's packaging,
# the upstream source is built without them, and the script says so (the stamp records it).
#
# configure is run directly (not dpkg-buildpackage: that builds every binary package, against trixie's
# libraries) with bookworm's -dev packages and Debian's hardening flags. Idempotent: a second run only
# checks the stamp. Usage: build-slurm.sh RELEASE [--rebuild]   (about 4 min on 2 cores)
# 26.05: the mirror serves none of unstable's source (seen 2026-12-06: 404 for its .orig.tar.gz, .dsc and
# .debian.tar.xz), so scripts/unpack-slurm.sh installs Debian's binary packages of it into the same prefix.
set -euo pipefail
declare -A SUITE_OF=([24.11]=trixie)
release=${1:-}
# Releases whose source the mirror does not serve (unstable's 26.05): Debian's binary packages instead.
[ "$release" != 26.05 ] || exec bash "$(dirname "$0")/unpack-slurm.sh" "$@"
suite=${SUITE_OF[$release]:-}
[ -n "$suite" ] || { echo "usage: build-slurm.sh RELEASE [--rebuild]  (RELEASE: ${!SUITE_OF[*]} 26.05)" >&2; exit 2; }
rebuild=${2:-}
PREFIX=${DSPORTAL_SLURM_PREFIX:-/opt/dsportal-slurm}/$release
CACHE=${DSPORTAL_CACHE:-/var/cache/dsportal}/slurm
MIRROR=${DSPORTAL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
say() { echo "[slurm] $*"; }

[ "$(id -u)" = 0 ] || { echo "build-slurm.sh must run as root" >&2; exit 1; }
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
# Bookworm's -dev packages for the plugins the portal and its demo use: munge (auth, cred), PMIx (srun
# --mpi=pmix), json-c, http-parser, yaml and jwt (squeue/sinfo --json, slurmrestd), mariadb (slurmdbd),
# hwloc, lz4, dbus (cgroup/v2 beside cgroup/v1, which needs nothing), lua (job_submit/lua). Not: PAM,
# curl (its -dev pulls newer libpam/libcurl/libssl, whose upgrades restart services), GTK (sview),
# HDF5, IPMI, Kafka, ROCm.
BUILD_DEPS=(libmunge-dev libpmix-dev libjson-c-dev libhttp-parser-dev libyaml-dev libjwt-dev libmariadb-dev
            libhwloc-dev liblz4-dev libdbus-1-dev liblua5.4-dev libreadline-dev pkg-config make gcc dpkg-dev)
# As Debian's own: --enable-multiple-slurmd (the demo runs one slurmd per node on one host: slurmd -N,
# a cgroup tree per node) and --disable-debug (-O2 from dpkg-buildflags, not Slurm's -O1 -ggdb3).
CONFIGURE=(--prefix="$PREFIX" --sysconfdir="$PREFIX/etc" --enable-multiple-slurmd --disable-debug
           --with-munge --with-pmix="/usr/lib/$arch/pmix2" --with-json --with-http-parser --with-yaml
           --with-jwt --with-mysql_config=/usr/bin --with-hwloc --with-lz4 --with-lua --enable-cgroupv2
           --with-hdf5=no --disable-sview --disable-pam --with-systemdsystemunitdir=no
           --disable-dependency-tracking)
export DEB_BUILD_MAINT_OPTIONS=hardening=+all,-bindnow  # plugins resolve some symbols lazily, as in debian/rules
# From / : dpkg-buildflags names the current folder in its flags (-ffile-prefix-map=PWD=.), which must not decide
# whether the build is still the one asked for (a run from another checkout rebuilt it).
flags=$(cd / && printf '%s\n' "${CONFIGURE[@]}" "$(dpkg-buildflags --get CFLAGS)" "$(dpkg-buildflags --get LDFLAGS)" |
        sha256sum | cut -c1-16)

# --- built already: the stamp (version, Debian revision, patches, seconds, flags) and a binary that runs ---
stamp=$PREFIX/.dsportal-slurm
if [ "$rebuild" != --rebuild ] && [ -f "$stamp" ] && [ "$(sed -n 's/^flags=//p' "$stamp")" = "$flags" ] &&
   "$PREFIX/sbin/slurmctld" -V >/dev/null 2>&1; then
  ! grep -q "^source=.*without Debian's patches" "$stamp" || say "WARNING: $(sed -n 's/^source=//p' "$stamp")"
  say "$(sed -n 's/^version=//p' "$stamp") in $PREFIX (built in $(sed -n 's/^seconds=//p' "$stamp") s)"
  exit 0
fi

# What is built and installed comes from a cache only root may write to: any other is emptied.
mkdir -p "$CACHE"
if [ "$(stat -c %u "$CACHE")" != 0 ] || [ -n "$(find "$CACHE" -maxdepth 0 -perm /022)" ]; then
  rm -rf "${CACHE:?}"/* && chown root: "$CACHE" && chmod 755 "$CACHE"
fi

# --- build-dependencies: bookworm's, none that would upgrade or remove Slurm or munge ---------------
missing=()
for p in "${BUILD_DEPS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  plan=$(apt-get install -s --no-install-recommends "${missing[@]}" 2>&1) ||
    { apt-get update -q >/dev/null && plan=$(apt-get install -s --no-install-recommends "${missing[@]}"); }
  # "Inst NAME [old version]" is an upgrade; Remv a removal.
  if grep -E '^(Inst [^ ]+ \[|Remv )' <<<"$plan" | grep -E '^[A-Za-z]+ (lib)?(slurm|munge|pmi)'; then
    echo "[slurm] installing ${missing[*]} would change the installed Slurm or munge: not done" >&2; exit 1
  fi
  say "apt-get install ${missing[*]}"
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- the source: Debian's source package of $suite, through a private apt state, cached ------------
src_cache=$CACHE/$suite
mkdir -p "$src_cache"
source "$(dirname "$0")/private-apt.sh"
private_apt deb-src "$suite"
# The record kept beside the files (name and SHA256 of each, from the signed index) lets a later run
# without the network build from the cache.
record=$src_cache/slurm-wlm.sources
# Error-Mode=any: an index that cannot be fetched fails the update (by default only a warning).
if apt-get "${apt_opts[@]}" -o APT::Update::Error-Mode=any update -q >/dev/null 2>&1; then
  apt-cache "${apt_opts[@]}" showsrc --only-source slurm-wlm |
    awk '/^Version:/ { if (seen++) exit; print } /^Checksums-Sha256:/ { sums = 1; next } /^[^ ]/ { sums = 0 }
         sums { print "file", $3, $1 }' > "$record.new"
  grep -q '^Version: ' "$record.new" || { echo "[slurm] no slurm-wlm in Debian $suite" >&2; exit 1; }
  mv "$record.new" "$record"
  debian_version=$(sed -n 's/^Version: //p' "$record")
  say "apt-get source slurm-wlm=$debian_version (Debian $suite)"
  # apt skips a file already there with the right SHA256; one it cannot fetch is reported below.
  (cd "$src_cache" && apt-get "${apt_opts[@]}" source -q --download-only "slurm-wlm=$debian_version" >/dev/null 2>&1) || true
else
  [ -f "$record" ] || { echo "[slurm] Debian $suite's index cannot be had, and nothing is cached" >&2; exit 1; }
  debian_version=$(sed -n 's/^Version: //p' "$record")
  say "WARNING: Debian $suite's index cannot be had: the cached slurm-wlm $debian_version"
fi
upstream_version=${debian_version#*:}
upstream_version=${upstream_version%-*}
# Every cached file of this version that is there must match the index; the upstream tarball must be.
have() { local sum; sum=$(awk -v f="$1" '$1 == "file" && $2 == f { print $3 }' "$record")
         [ -f "$src_cache/$1" ] && echo "$sum  $src_cache/$1" | sha256sum -c --quiet 2>/dev/null; }
dsc=$(awk '$1 == "file" && $2 ~ /\.dsc$/ { print $2 }' "$record")
orig=$(awk '$1 == "file" && $2 ~ /\.orig\.tar\./ { print $2 }' "$record")
packaging=$(awk '$1 == "file" && $2 ~ /\.debian\.tar\./ { print $2 }' "$record")
have "$orig" || { echo "[slurm] $orig: not served by $MIRROR, or not what Debian $suite's index says" >&2; exit 1; }

# --- unpack, Debian's patches applied where its packaging was served --------------------------------
work=$CACHE/build-$release
rm -rf "$work" && mkdir -p "$work"
log=$work/build.log
if have "$dsc" && have "$packaging"; then
  # dpkg-source checks the files against the .dsc (the .dsc against the index: apt), then applies
  # debian/patches/series in order: Debian's fixes, security backports among them.
  dpkg-source -x "$src_cache/$dsc" "$work/src" >> "$log" 2>&1
  patches=$(grep -v '^#' "$work/src/debian/patches/series" 2>/dev/null | tr '\n' ' ' || true)
  source_note="Debian $debian_version, patches: ${patches:-none}"
  say "Debian's patches applied: ${patches:-none}"
else
  # Seen with trixie's 24.11.5-4+deb13u1: the mirror serves its .orig.tar.gz but answers 404 for the
  # .dsc and .debian.tar.xz (its security fixes are patches in the latter).
  say "WARNING: Debian's packaging of slurm-wlm $debian_version (${packaging:-none listed}) cannot be had" \
      "from $MIRROR: building upstream $upstream_version without Debian's patches"
  mkdir -p "$work/src"
  tar -xf "$src_cache/$orig" -C "$work/src" --strip-components=1
  source_note="upstream $upstream_version from Debian $debian_version's $orig, without Debian's patches"
fi

# --- configure, make -j2, install into a staging root first ----------------------------------------
say "building $upstream_version into $PREFIX (log: $log)"
start=$(date +%s)
mkdir -p "$work/build"
(
  cd "$work/build"
  CFLAGS="$(dpkg-buildflags --get CFLAGS)" CPPFLAGS="$(dpkg-buildflags --get CPPFLAGS)" \
    LDFLAGS="$(dpkg-buildflags --get LDFLAGS)" "$work/src/configure" "${CONFIGURE[@]}" &&
  make -j2 &&
  make install DESTDIR="$work/root"
) >> "$log" 2>&1 || { tail -n 30 "$log"; echo "[slurm] build failed: see $log" >&2; exit 1; }
seconds=$(( $(date +%s) - start ))
# make install wrote under the prefix only (no systemd units, PAM module or Perl API elsewhere).
stray=$(cd "$work/root" && find . -mindepth 1 -type f ! -path ".$PREFIX/*" | head -n 5)
[ -z "$stray" ] || { echo "[slurm] make install wrote outside $PREFIX: $stray" >&2; exit 1; }
# configure leaves out a plugin whose library it did not find, without failing: the ones asked for.
for plugin in auth_munge cred_munge mpi_pmix accounting_storage_mysql cgroup_v1 cgroup_v2 serializer_json \
              serializer_yaml rest_auth_jwt job_submit_lua; do
  [ -e "$work/root$PREFIX/lib/slurm/$plugin.so" ] || { echo "[slurm] configure left out $plugin: see $log" >&2; exit 1; }
done

# --- into place: a configuration already in the prefix's etc is kept ---------------------------------
staged=$work/root$PREFIX
mkdir -p "$staged/etc"
[ ! -d "$PREFIX/etc" ] || cp -a "$PREFIX/etc/." "$staged/etc/"
chmod -R a+rX,go-w "$staged"
rm -rf "$PREFIX.old"
[ ! -e "$PREFIX" ] || mv "$PREFIX" "$PREFIX.old"
mkdir -p "$(dirname "$PREFIX")"
mv "$staged" "$PREFIX"
rm -rf "$PREFIX.old"
version=$("$PREFIX/sbin/slurmctld" -V | awk '{ print $2 }')
printf 'version=%s\nsource=%s\nseconds=%s\nflags=%s\n' "$version" "$source_note" "$seconds" "$flags" > "$stamp"
cp "$log" "$CACHE/build-$release.log"
rm -rf "$work"
say "$version in $PREFIX (built in $seconds s)"
