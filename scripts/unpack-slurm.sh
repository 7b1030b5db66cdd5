#!/usr/bin/env bash
# A Slurm release whose source the mirror does not serve (Debian unstable's 26.05: its .orig.tar.gz and
# packaging answer 404, its binary packages do), from Debian's own binary packages, beside the installed
# Debian Slurm 22.05: into /opt/dsportal-slurm/RELEASE, as build-slurm.sh's builds are (bin, sbin, a stamp).
#
# The packages (slurmctld, slurmd, slurmdbd, slurm-client, sackd, the plugins) and every library they need
# of that suite, its C library included, are fetched through apt from a private apt state (signed by the
# Debian archive keyring; apt checks each file's SHA256 against the signed index), cached in $CACHE, and
# unpacked into PREFIX/root. Their programs are built for that suite's C library, not bookworm's: patchelf
# gives each program the root's own dynamic loader and each program, library and plugin the root's library
# folders (RUNPATH), so the daemons and commands run on the root's libraries while the jobs they start run
# the host's programs on the host's. What Debian compiled in and the root cannot change is given on their
# command lines and in slurm.conf (the stamp says which): PluginDir (Debian's /usr/lib/.../slurm-wlm holds
# 22.05's plugins here) and slurmd's slurmstepd (-d).
#
# Idempotent: a second run only checks the stamp. Usage: unpack-slurm.sh RELEASE [--again]
set -euo pipefail
declare -A SUITE_OF=([26.05]=unstable)
release=${1:-}
suite=${SUITE_OF[$release]:-}
[ -n "$suite" ] || { echo "usage: unpack-slurm.sh RELEASE [--again]  (RELEASE: ${!SUITE_OF[*]})" >&2; exit 2; }
again=${2:-}; [ "$again" != --rebuild ] || again=--again
PREFIX=${DSPORTAL_SLURM_PREFIX:-/opt/dsportal-slurm}/$release
CACHE=${DSPORTAL_CACHE:-/var/cache/dsportal}/slurm-debs/$suite
MIRROR=${DSPORTAL_DEBIAN_MIRROR:-http://deb.debian.org/debian}
PACKAGES=(slurmctld slurmd slurmdbd slurm-client sackd slurm-wlm-basic-plugins slurm-wlm-mysql-plugin)
say() { echo "[slurm] $*"; }

[ "$(id -u)" = 0 ] || { echo "unpack-slurm.sh must run as root" >&2; exit 1; }
command -v patchelf >/dev/null || { apt-get install -y -q --no-install-recommends patchelf >/dev/null; }
stamp=$PREFIX/.dsportal-slurm
if [ "$again" != --again ] && [ -f "$stamp" ] && "$PREFIX/sbin/slurmctld" -V >/dev/null 2>&1; then
  say "$(sed -n 's/^version=//p' "$stamp") in $PREFIX (Debian $suite's packages)"
  exit 0
fi

# What is unpacked comes from a cache only root may write to: any other is emptied.
mkdir -p "$CACHE"
if [ "$(stat -c %u "$CACHE")" != 0 ] || [ -n "$(find "$CACHE" -maxdepth 0 -perm /022)" ]; then
  rm -rf "${CACHE:?}"/* && chown root: "$CACHE" && chmod 755 "$CACHE"
fi

# --- the packages and their libraries, resolved against an empty system: everything the root needs ------
source "$(dirname "$0")/private-apt.sh"
private_apt deb "$suite"
empty_status=$private_apt_state/status
: > "$empty_status"
apt-get "${apt_opts[@]}" -o APT::Update::Error-Mode=any update -q >/dev/null
apt-get "${apt_opts[@]}" -o Dir::State::status="$empty_status" -o Dir::Cache::archives="$CACHE" \
  install -y -q --download-only --no-install-recommends "${PACKAGES[@]}" >/dev/null
plan=$(apt-get "${apt_opts[@]}" -o Dir::State::status="$empty_status" -s install --no-install-recommends "${PACKAGES[@]}" |
       awk '/^Inst/ { print $2 "_" substr($3, 2) }')
debian_version=$(grep -m1 '^slurmctld_' <<<"$plan" | cut -d_ -f2)

# --- unpack into a staging root, then make its programs and libraries its own --------------------------
staged=$PREFIX.new
rm -rf "$staged" && mkdir -p "$staged/root"
count=0
while read -r name_version; do
  name=${name_version%%_*} version=${name_version#*_}
  deb=$(find "$CACHE" -maxdepth 1 -name "${name}_$(sed 's/:/%3a/' <<<"$version")_*.deb" | head -n 1)
  [ -n "$deb" ] || { echo "[slurm] $name $version was not fetched" >&2; exit 1; }
  dpkg-deb -x "$deb" "$staged/root"
  count=$((count + 1))
done <<<"$plan"
root=$PREFIX/root  # where the root will be: RUNPATH and the loader name it there
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
libs="$root/usr/lib/$arch:$root/usr/lib/$arch/slurm-wlm:$root/lib/$arch"
loader=$root/usr/lib/$arch/ld-linux-x86-64.so.2
[ -e "$staged/root/usr/lib/$arch/ld-linux-x86-64.so.2" ] || { echo "[slurm] no dynamic loader in $suite's libc6" >&2; exit 1; }
patched=0
while IFS= read -r -d '' file; do
  head -c 4 "$file" | grep -q $'\x7fELF' || continue
  case "$(basename "$file")" in ld-linux*|libc.so*) continue ;; esac  # the loader and the C library stay as built
  if patchelf --print-interpreter "$file" >/dev/null 2>&1; then
    patchelf --set-interpreter "$loader" "$file"
  fi
  patchelf --set-rpath "$libs" "$file" 2>/dev/null || true
  patched=$((patched + 1))
done < <(find "$staged/root/usr/bin" "$staged/root/usr/sbin" "$staged/root/usr/lib/$arch" -type f -print0)

mkdir -p "$staged/bin" "$staged/sbin"
# bin: slurm-client's commands; sbin: the daemons (Debian names some NAME-wlm, for its alternatives).
client=$(find "$CACHE" -maxdepth 1 -name "slurm-client_*.deb" | head -n 1)
for program in $(dpkg-deb -c "$client" | awk '$6 ~ /^\.\/usr\/bin\/./ { sub(".*/", "", $6); print $6 }'); do
  ln -s "$root/usr/bin/$program" "$staged/bin/$program"
done
for program in slurmctld slurmd slurmdbd slurmstepd sackd; do
  built=$program; [ -e "$staged/root/usr/sbin/$program-wlm" ] && built=$program-wlm
  ln -s "$root/usr/sbin/$built" "$staged/sbin/$program"
done
chmod -R a+rX,go-w,ug-s "$staged"  # no setuid or setgid program of that suite's in /opt
rm -rf "$PREFIX.old"
[ ! -e "$PREFIX" ] || mv "$PREFIX" "$PREFIX.old"
mv "$staged" "$PREFIX"
rm -rf "$PREFIX.old"
version=$("$PREFIX/sbin/slurmctld" -V | awk '{ print $2 }')
printf 'version=%s\nsource=Debian %s binary packages of slurm-wlm %s (%s packages, %s files relinked to the root)\nplugin_dir=%s\nslurmstepd=%s\n' \
  "$version" "$suite" "$debian_version" "$count" "$patched" "$root/usr/lib/$arch/slurm-wlm" "$(readlink "$PREFIX/sbin/slurmstepd")" > "$stamp"
say "$version in $PREFIX (Debian $suite's slurm-wlm $debian_version, $count packages)"
