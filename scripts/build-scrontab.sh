#!/usr/bin/env bash
# Slurm's cron, `scrontab`, for the installed Debian slurm-client: bookworm's package builds it but
# leaves it out of debian/slurm-client.install (it ships every other client command). Notebooks run
# on a schedule (portal/session/job/schedules.py) are scrontab entries.
#
# Built from Debian's own source of the installed version, linked against Debian's installed
# libslurmfull.so (only src/scrontab is compiled: about 30 s on 2 cores), with Debian's hardening
# flags; cached by version in $CACHE, installed as /usr/local/bin/scrontab. libslurmfull is a private
# library with no version in its name, so a new slurm-client version builds again.
set -euo pipefail
CACHE=${DSPORTAL_CACHE:-/var/cache/dsportal}/scrontab
say() { echo "[scrontab] $*"; }

version=$(dpkg-query -W -f='${Version}' slurm-client)
# Debian 13's slurm-client (24.11) ships scrontab itself: nothing to build, and no copy of ours in front of it.
if dpkg-query -L slurm-client 2>/dev/null | grep -x /usr/bin/scrontab > /dev/null; then
  # a copy this script installed for an earlier slurm-client (before an upgrade from Debian 12) goes: it would
  # come first on the PATH, built for another release
  if [ -e /usr/local/bin/scrontab ]; then
    for old in "$CACHE"/*/scrontab; do
      [ -f "$old" ] && cmp -s /usr/local/bin/scrontab "$old" && { rm -f /usr/local/bin/scrontab; say "removed /usr/local/bin/scrontab (built for $(basename "$(dirname "$old")"))"; break; }
    done
  fi
  if [ -e /usr/local/bin/scrontab ]; then
    echo "[scrontab] /usr/local/bin/scrontab is not the one slurm-client $version ships (/usr/bin/scrontab) and comes first on the PATH: remove it" >&2
    exit 1
  fi
  say "ready: /usr/bin/scrontab (slurm-client $version ships it)"
  exit 0
fi
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
lib=/usr/lib/$arch/slurm-wlm
built=$CACHE/$version/scrontab
# What lands in /usr/local/bin comes from a cache only root may write to: any other is built afresh.
mkdir -p "$CACHE"
if [ "$(stat -c %u "$CACHE")" != 0 ] || [ -n "$(find "$CACHE" -maxdepth 0 -perm /022)" ]; then
  rm -rf "${CACHE:?}"/* && chown root: "$CACHE" && chmod 755 "$CACHE"
fi
if [ ! -x "$built" ]; then
  test -e "$lib/libslurmfull.so" || { echo "[scrontab] no $lib/libslurmfull.so" >&2; exit 1; }
  say "building scrontab for slurm-client $version from Debian's source (about 30 s)"
  work=$CACHE/build && rm -rf "$work" && mkdir -p "$work" && cd "$work"
  log=$work/build.log
  # A chain of &&: errexit does not apply inside a group whose failure is handled by ||.
  srcs=/etc/apt/sources.list.d/dsportal-src.sources
  trap 'rm -f "$srcs" "${srcs%.sources}.list"' EXIT  # never left for later apt-get updates, even if killed
  chown _apt: "$work" 2>/dev/null || true  # apt downloads as its own unprivileged user where it can write
  {
    # Debian's source archive, from the same mirrors as the machine's packages (their deb lines as
    # deb-src), for this download only: later apt-get updates do not fetch source indexes.
    if [ -f /etc/apt/sources.list.d/debian.sources ]; then
      sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources > "$srcs"
    else
      grep -h '^deb ' /etc/apt/sources.list | sed 's/^deb /deb-src /' > "${srcs%.sources}.list"
    fi &&
    apt-get update -qq &&
    apt-get source -qq "slurm-wlm=$version" &&
    src=$(ls -d "$work"/slurm-wlm-*/) &&
    mkdir build && cd build &&
    # Debian's compiler and linker flags (hardening as debian/rules sets it); configure only for config.h
    # and the Makefiles, then scrontab linked against Debian's libslurmfull (LIB_SLURM_BUILD empty).
    export DEB_BUILD_MAINT_OPTIONS=hardening=+all,-bindnow &&
    CFLAGS="$(dpkg-buildflags --get CFLAGS)" CPPFLAGS="$(dpkg-buildflags --get CPPFLAGS)" \
      LDFLAGS="$(dpkg-buildflags --get LDFLAGS)" "$src/configure" -q --prefix=/usr --libdir="/usr/lib/$arch" \
      --sysconfdir=/etc/slurm --localstatedir=/var --disable-debug --without-rpath --disable-dependency-tracking &&
    make -C src/scrontab scrontab LIB_SLURM_BUILD= LIB_SLURM="-Wl,-rpath=$lib -L$lib -lslurmfull"
  } > "$log" 2>&1 || { rm -f "$srcs" "${srcs%.sources}.list"; tail -n 30 "$log"; echo "[scrontab] build failed: see $log" >&2; exit 1; }
  rm -f "$srcs" "${srcs%.sources}.list"
  mkdir -p "$(dirname "$built")"
  install -m 0755 -s "$work/build/src/scrontab/scrontab" "$built"
  rm -rf "$work"
fi
install -m 0755 "$built" /usr/local/bin/scrontab
say "ready: /usr/local/bin/scrontab (slurm-client $version)"
