#!/usr/bin/env bash
# Slurm's cron, `scrontab`, for the installed Debian slurm-client: bookworm's package builds it but
# leaves it out of debian/slurm-client.install (it ships every other client command). Notebooks run
# on a schedule (portal/session/schedules.py) are scrontab entries.
#
# Built from Debian's own source of the installed version, linked against Debian's installed
# libslurmfull.so (only src/scrontab is compiled: about 30 s on 2 cores), with Debian's hardening
# flags; cached by version in $CACHE, installed as /usr/local/bin/scrontab. libslurmfull is a private
# library with no version in its name, so a new slurm-client version builds again.
set -euo pipefail
CACHE=${DSPORTAL_CACHE:-/var/cache/dsportal}/scrontab
say() { echo "[scrontab] $*"; }

version=$(dpkg-query -W -f='${Version}' slurm-client)
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
lib=/usr/lib/$arch/slurm-wlm
built=$CACHE/$version/scrontab
if [ ! -x "$built" ]; then
  test -e "$lib/libslurmfull.so" || { echo "[scrontab] no $lib/libslurmfull.so" >&2; exit 1; }
  say "building scrontab for slurm-client $version from Debian's source (about 30 s)"
  work=$CACHE/build && rm -rf "$work" && mkdir -p "$work" && cd "$work"
  log=$work/build.log
  {
    if ! apt-cache showsrc "slurm-wlm=$version" 2>/dev/null | grep -q "^Version: $version\$"; then
      # Debian's source archive (the same registry as its packages), signed by its archive key.
      key=/usr/share/keyrings/debian-archive-keyring.gpg
      printf 'deb-src [signed-by=%s] http://deb.debian.org/debian %s main\n' \
        "$key" bookworm "$key" bookworm-updates > /etc/apt/sources.list.d/dsportal-src.list
      printf 'deb-src [signed-by=%s] http://deb.debian.org/debian-security bookworm-security main\n' "$key" \
        >> /etc/apt/sources.list.d/dsportal-src.list
      apt-get update -qq
    fi
    apt-get source -qq -o APT::Sandbox::User=root "slurm-wlm=$version"
    src=$(ls -d "$work"/slurm-wlm-*/)
    mkdir build && cd build
    export DEB_BUILD_MAINT_OPTIONS=hardening=+all,-bindnow  # as debian/rules
    CFLAGS="$(dpkg-buildflags --get CFLAGS)" CPPFLAGS="$(dpkg-buildflags --get CPPFLAGS)" \
      LDFLAGS="$(dpkg-buildflags --get LDFLAGS)" "$src/configure" -q --prefix=/usr --libdir="/usr/lib/$arch" \
      --sysconfdir=/etc/slurm --localstatedir=/var --disable-debug --without-rpath --disable-dependency-tracking
    # LIB_SLURM_BUILD empty: link Debian's libslurmfull rather than build one.
    make -C src/scrontab scrontab LIB_SLURM_BUILD= LIB_SLURM="-Wl,-rpath=$lib -L$lib -lslurmfull"
  } > "$log" 2>&1 || { tail -n 30 "$log"; echo "[scrontab] build failed: see $log" >&2; exit 1; }
  mkdir -p "$(dirname "$built")"
  install -m 0755 -s "$work/build/src/scrontab/scrontab" "$built"
  rm -rf "$work"
fi
install -m 0755 "$built" /usr/local/bin/scrontab
say "ready: /usr/local/bin/scrontab (slurm-client $version)"
