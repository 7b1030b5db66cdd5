#!/usr/bin/env bash
# Tries docs/how-to/deploy.md as a new admin would (issue 29): two fresh Debian bookworm systems, a login
# node and a compute node, each booting systemd as PID 1 in systemd-nspawn on a bridge of their own,
# then the guide's sections in order, as root of those systems, and at the end a real login over
# the network, a session as a Slurm job on the compute node, a kernel running code, a hub
# restart that keeps the session's route, and the hub's ports closed to all but cn1 and login itself.
#
#   scripts/deploy-trial.sh            everything (each step is skipped when its result is there)
#   scripts/deploy-trial.sh STEP...    some steps: systems boot munge slurm ldap portal check sessions upgrade ports
#                                      backup restore (sessions and upgrade only with DSPORTAL_TRIAL_FROM=v0.2.0)
#   scripts/deploy-trial.sh down       stops both systems, removes the bridge and every trial file
#
# Reach them: scripts/deploy-trial.sh shell login|cn1 (a root shell inside); the portal answers at
# https://hub.example.org (192.0.2.10:443; the trial's CA: /var/lib/dsportal-trial/tls/ca.crt).
# Runs as root on a Debian bookworm host; needs the package registries; uses 192.0.2.8/29 only.
#
# DSPORTAL_TRIAL_SUITE=trixie: the systems are Debian 13 (Python 3.13, Slurm 24.11), and the portal's environment
# is built on a third, scratch Debian 13 system by the guide's own step 2 (scripts/install-deps.sh there, then its
# rsync of env/ and chp/); its files go to /var/lib/dsportal-trial-trixie. Default: bookworm, built on this host.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
SUITE=${DSPORTAL_TRIAL_SUITE:-bookworm}
[[ "$SUITE" =~ ^(bookworm|trixie)$ ]] || { echo "DSPORTAL_TRIAL_SUITE: bookworm or trixie, not $SUITE" >&2; exit 2; }
if [ "$SUITE" = bookworm ]; then TRIAL=${DSPORTAL_TRIAL:-/var/lib/dsportal-trial}; else TRIAL=${DSPORTAL_TRIAL:-/var/lib/dsportal-trial-$SUITE}; fi
BRIDGE=dstrial0
NET_PREFIX=192.0.2              # documentation range; the bridge takes only 192.0.2.8/29 of it,
HOST_ADDR=$NET_PREFIX.9/29      # so a host whose own uplink is in 192.0.2.0/24 keeps it
LOGIN_ADDR=$NET_PREFIX.10
CN1_ADDR=$NET_PREFIX.11
HUB2_ADDR=$NET_PREFIX.12        # the fresh login node a backup is restored onto (back-up-and-restore.md)
PORTAL_NAME=portal              # the hub's name for the compute nodes (hub_bind_url): an alias that can move
# DSPORTAL_TRIAL_FROM=v0.2.0 (any earlier release's tag or commit): that release is deployed first (its own
# guide's way where it lacks a command of today's: units from its checkout, no firewall ports), sessions are
# started on it, and the upgrade step takes them to this commit's wheel
FROM_REV=${DSPORTAL_TRIAL_FROM:-}
CLUSTER=$NET_PREFIX.8/29
COMPUTE=$CN1_ADDR               # the compute nodes: the only hosts besides login that reach the hub's ports
USER_NAME=alice USER_UID=2001 USER_PASSWORD=alice-trial
LDAP_ADMIN_PASSWORD=trial-ldap-admin
declare -A TIMES=()
say() { echo "[trial] $*"; }
now() { date +%s.%N; }
elapsed() { awk -v s="$1" -v e="$(now)" 'BEGIN { printf "%.1f", e - s }'; }

# ---- the two systems ---------------------------------------------------------------------------
nspawn_of() {  # the (root's) systemd-nspawn that boots system NAME of this trial
  pgrep -u 0 -f "^systemd-nspawn --boot .* -D $TRIAL/$1 " | head -1
}
leader() {  # the container's PID 1 (systemd), as the host sees it
  local nspawn
  nspawn=$(nspawn_of "$1") || return 1
  pgrep -P "$nspawn" | head -1
}
# in_node NAME CMD...: a root login's environment inside NAME (not the host's PATH and variables)
in_node() {
  local pid
  pid=$(leader "$1") || { echo "trial system $1 is not running" >&2; return 1; }
  nsenter -t "$pid" -a env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root LANG=C.UTF-8 TERM=dumb "${@:2}"
}
# script_in NAME: runs bash's stdin inside NAME, stopping at the first failing command
script_in() { in_node "$1" bash -euo pipefail -s; }

packages_for() {
  local common="python3 munge slurm-client nftables adduser procps iproute2 iputils-ping openssl curl less nslcd libnss-ldapd"
  if [ "$1" = login ]; then
    echo "$common nodejs sudo slurmctld slurmdbd mariadb-server slapd ldap-utils"
  elif [ "$1" = hub2 ]; then  # a login node without Slurm's daemons or the directory: the portal, its database
    echo "$common nodejs sudo mariadb-server"
  else
    echo "$common slurmd"
  fi
}

apt_sources() {  # the systems' sources.list: $SUITE, its updates and (unless "no-security") its security archive
  printf 'deb http://deb.debian.org/debian %s main\ndeb http://deb.debian.org/debian %s-updates main\n' "$SUITE" "$SUITE"
  [ "${1:-}" = no-security ] || printf 'deb http://deb.debian.org/debian-security %s-security main\n' "$SUITE"
}

make_base() {  # one debootstrap, copied for each system (each then gets its own packages)
  local start
  [ -d "$TRIAL/base" ] && return 0
  start=$(now)
  debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,iproute2,ca-certificates \
    "$SUITE" "$TRIAL/base.new" http://deb.debian.org/debian > "$TRIAL/debootstrap.log"
  mv "$TRIAL/base.new" "$TRIAL/base"
  TIMES[debootstrap]=$(elapsed "$start")
}

# make_root NAME [FIRST]: NAME's root, then the guide's packages (section 2) from the host: the systems have no
# internet. FIRST: a script run in the root before the packages (the restored hub account's numbers). With an
# earlier release to upgrade from, no bookworm-security: its patch check knows python3.11 up to bookworm's
# 3.11.2-6+deb12u8 (the security update deb12u9 stops its hub: bench/results/deploy-trial-2026-12-06.md).
make_root() {
  local name=$1 root=$TRIAL/$1 start
  [ -x "$root/usr/sbin/nft" ] && return 0
  make_base
  rm -rf "$root.new" && cp -a "$TRIAL/base" "$root.new" && mv "$root.new" "$root"
  start=$(now)
  if [ -n "${2:-}" ]; then
    printf '%s\n' "$2" > "$root/root/first.sh"
    systemd-nspawn -q --register=no --keep-unit -D "$root" --pipe /bin/sh -e /root/first.sh 2>&1 | grep -v propagate || true
  fi
  cat > "$root/root/preseed" <<EOF
slapd slapd/domain string example.org
slapd shared/organization string Example
slapd slapd/password1 password $LDAP_ADMIN_PASSWORD
slapd slapd/password2 password $LDAP_ADMIN_PASSWORD
nslcd nslcd/ldap-uris string ldap://login/
nslcd nslcd/ldap-base string dc=example,dc=org
libnss-ldapd libnss-ldapd/nsswitch multiselect passwd, group, shadow
EOF
  apt_sources $(old_portal && echo no-security) > "$root/etc/apt/sources.list"
  systemd-nspawn -q --register=no --keep-unit -D "$root" --pipe /bin/sh -ec "
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q && debconf-set-selections /root/preseed
    apt-get install -y -q --no-install-recommends $(packages_for "$name") && apt-get clean" \
    > "$TRIAL/apt-$name.log" 2>&1 || { tail "$TRIAL/apt-$name.log"; return 1; }
  TIMES[packages-$name]=$(elapsed "$start")
  echo "$name" > "$root/etc/hostname"
  # slurmd waits for its slurm.conf (section 4) to be enabled: Debian 13's would start configless and wait
  [ "$name" != cn1 ] || rm -f "$root/etc/systemd/system/multi-user.target.wants/slurmd.service"
  local address=$CN1_ADDR; [ "$name" = login ] && address=$LOGIN_ADDR; [ "$name" = hub2 ] && address=$HUB2_ADDR
  # 10-: before the container's own 80-container-host0.network (DHCP), which would win otherwise
  mkdir -p "$root/etc/systemd/network"
  printf '[Match]\nName=host0\n\n[Network]\nAddress=%s/29\nLinkLocalAddressing=no\nIPv6AcceptRA=no\n' \
    "$address" > "$root/etc/systemd/network/10-host0.network"
  ln -sf /lib/systemd/system/systemd-networkd.service "$root/etc/systemd/system/multi-user.target.wants/"
  hosts_file "$(portal_addr)" > "$root/etc/hosts"
  say "$name: packages ${TIMES[packages-$name]} s"
}

# The names every system knows (the site's DNS): the hub's name and the public one at the portal's machine
hosts_file() {
  printf '127.0.0.1\tlocalhost\n%s\tlogin\n%s\tcn1\n%s\thub2\n%s\t%s hub.example.org\n' \
    "$LOGIN_ADDR" "$CN1_ADDR" "$HUB2_ADDR" "$1" "$PORTAL_NAME"
}
portal_addr() {  # where the portal is: login, or hub2 once a backup was restored there
  cat "$TRIAL/portal-addr" 2>/dev/null || echo "$LOGIN_ADDR"
}
old_portal() { [ -n "$FROM_REV" ] && [ ! -f "$TRIAL/upgraded" ]; }  # the earlier release still runs
portal_node() { if [ "$(portal_addr)" = "$HUB2_ADDR" ]; then echo hub2; else echo login; fi; }

# build_wheel REV DEST: dsportal's wheel from the commit REV (committed code only, never the working tree's
# edits), as `make dist` builds it: pip's wheel with the environment's setuptools, nothing fetched
build_wheel() {
  local src
  src=$(mktemp -d /tmp/dsportal-trial-src.XXXXXX)
  git archive "$1" | tar -x -C "$src"
  rm -rf "$2" && mkdir -p "$2"
  (cd "$src" && /opt/dsportal/env/bin/pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation \
    -w "$2" .) > "$TRIAL/wheel.log" 2>&1 || { tail "$TRIAL/wheel.log"; rm -rf "$src"; return 1; }
  rm -rf "$src"
}

# install_wheel WHEEL: take-a-security-release.md, section 4 ("for dsportal's own code only"), on the host
# that writes the shared /opt/dsportal: the login node here (its /root holds the wheel)
install_wheel() {
  cp "$1" "$TRIAL/login/root/"
  local install="/opt/dsportal/env/bin/pip install -q --disable-pip-version-check --no-deps --force-reinstall /root/$(basename "$1")
                 /opt/dsportal/env/bin/python -c 'import importlib.metadata as m; print(\"installed dsportal\", m.version(\"dsportal\"))'
                 chmod -R a+rX /opt/dsportal/env"
  if leader login > /dev/null; then
    in_node login sh -ec "$install"
  else
    systemd-nspawn -q --register=no --keep-unit -D "$TRIAL/login" --bind="$TRIAL/shared/opt-dsportal:/opt/dsportal" \
      --pipe /bin/sh -ec "$install" > "$TRIAL/install.log" 2>&1 || { cat "$TRIAL/install.log"; return 1; }
    grep -v propagate "$TRIAL/install.log" || true
  fi
}

# build_env: section 2 on a scratch Debian system of $SUITE ($TRIAL/build, never booted): the guide's checkout (the
# commit's files) and its `bash scripts/install-deps.sh`. What the site's network gives it: this host's CA
# certificates (an egress proxy may sign PyPI's and npm's), named to pip and npm.
build_env() {
  local root=$TRIAL/build start
  [ -f "$root/.dsportal-built" ] && return 0  # written once install-deps.sh has finished
  make_base
  start=$(now)
  [ -d "$root" ] || { rm -rf "$root.new" && cp -a "$TRIAL/base" "$root.new" && mv "$root.new" "$root"; }
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/" 2>/dev/null || true
  # and its registry's apt settings (a registry that serves a snapshot: Release files past their Valid-Until)
  cp /etc/apt/apt.conf.d/99artifact-registry "$root/etc/apt/apt.conf.d/" 2>/dev/null || true
  rm -rf "$root/usr/local/src/dsportal" && mkdir -p "$root/usr/local/src/dsportal"
  git archive "${DSPORTAL_TRIAL_REV:-HEAD}" | tar -x -C "$root/usr/local/src/dsportal"
  apt_sources > "$root/etc/apt/sources.list"
  systemd-nspawn -q --register=no --keep-unit -D "$root" --pipe /bin/bash -ec "
    export DEBIAN_FRONTEND=noninteractive
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d  # a build machine: no daemons
    apt-get update -q && apt-get install -y -q --no-install-recommends ca-certificates git
    update-ca-certificates
    printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > /etc/pip.conf
    printf 'cafile=/etc/ssl/certs/ca-certificates.crt\n' > /root/.npmrc
    cd /usr/local/src/dsportal && bash scripts/install-deps.sh" > "$TRIAL/build-env.log" 2>&1 ||
    { tail -n 30 "$TRIAL/build-env.log"; return 1; }
  touch "$root/.dsportal-built"
  TIMES[build-env]=$(elapsed "$start")
  say "build: $(systemd-nspawn -q --register=no --keep-unit -D "$root" --pipe /opt/dsportal/env/bin/python --version 2>/dev/null) environment in ${TIMES[build-env]} s (log: $TRIAL/build-env.log)"
}

shared_env() {  # section 2: /opt/dsportal built once (scripts/install-deps.sh), copied onto the shared storage
  local shared=$TRIAL/shared start
  mkdir -p "$shared"/{home,datasets,courses}
  if [ ! -x "$shared/opt-dsportal/env/bin/python" ]; then
    local built=/opt/dsportal  # the scratch machine's /opt/dsportal: this host, or (trixie) a system of its own
    if [ "$SUITE" = bookworm ]; then
      [ -x /opt/dsportal/env/bin/python ] || bash scripts/install-deps.sh
    else
      build_env || return 1
      built=$TRIAL/build/opt/dsportal
    fi
    start=$(now)
    # the guide's rsync: env/ and chp/, each on its own (never the whole /opt/dsportal with --delete)
    mkdir -p "$shared/opt-dsportal"
    rsync -a --delete "$built/env/" "$shared/opt-dsportal/env/"
    rsync -a --delete "$built/chp/" "$shared/opt-dsportal/chp/"
    TIMES[copy-env]=$(elapsed "$start")
  fi
  # dsportal itself: the wheel of this checkout's commit (DSPORTAL_TRIAL_REV, default HEAD), where it runs
  build_wheel "${DSPORTAL_TRIAL_REV:-HEAD}" "$TRIAL/wheel"
  if old_portal; then  # the earlier release first, and the unit files its guide took from its checkout
    build_wheel "$FROM_REV" "$TRIAL/wheel-from"
    [ -f "$TRIAL/from-installed" ] || { install_wheel "$(ls "$TRIAL"/wheel-from/dsportal-*.whl)"; touch "$TRIAL/from-installed"; }
    rm -rf "$TRIAL/from-src" && mkdir -p "$TRIAL/from-src"
    git archive "$FROM_REV" config/systemd | tar -x -C "$TRIAL/from-src"
  else
    install_wheel "$(ls "$TRIAL"/wheel/dsportal-*.whl)"
  fi
  # The login node has no checkout: the guide takes portal.yaml and the units from the installed package.
}

cgroup_name() { if [ "$SUITE" = bookworm ]; then echo "dstrial-$1"; else echo "dstrial-$SUITE-$1"; fi; }

cgroup_subtree() {  # NAME's own subtree of each cgroup v1 controller of the host (see boot_node)
  # under the cgroup nspawn runs in: the container's cgroup namespace starts there
  local controller dir nspawn
  nspawn=$(nspawn_of "$1")
  for controller in cpuset cpu cpuacct memory devices freezer pids; do
    dir=/sys/fs/cgroup/$controller$(awk -F: -v c="$controller" '$2 == c {print $3}' "/proc/$nspawn/cgroup")
    dir=${dir%/}/$(cgroup_name "$1")
    mkdir -p "$dir"
    if [ "$controller" = cpuset ]; then
      cat "$(dirname "$dir")/cpuset.cpus" > "$dir/cpuset.cpus"
      cat "$(dirname "$dir")/cpuset.mems" > "$dir/cpuset.mems"
    fi
  done
}

boot_node() {
  local name=$1 shared=$TRIAL/shared
  if ! leader "$name" >/dev/null; then
    # --register=no --keep-unit: the host has no systemd (nor D-Bus, nor machined) as PID 1; without
    # both nspawn stops at "Failed to open system bus". No user namespace (--private-users=no, the
    # default) and the host's hybrid cgroup layout (no SYSTEMD_NSPAWN_UNIFIED_HIERARCHY) boot as they are.
    # Without machined there is no `machinectl shell`: in_node enters with nsenter.
    setsid systemd-nspawn --boot --register=no --keep-unit --console=passive -D "$TRIAL/$name" -M "$name" \
      --network-bridge="$BRIDGE" \
      --bind="$shared/opt-dsportal:/opt/dsportal" --bind="$shared/home:/home" \
      --bind="$shared/datasets:/datasets" --bind="$shared/courses:/srv/courses" \
      > "$TRIAL/boot-$name.log" 2>&1 < /dev/null 9>&- &  # (9: the script's lock, not the system's)
    local tries
    for tries in $(seq 60); do
      in_node "$name" systemctl is-system-running 2>/dev/null | grep -qE 'running|degraded' && break
      sleep 1
    done
  fi
  say "$name: $(in_node "$name" systemctl is-system-running || true) ($(in_node "$name" ip -br -4 addr show host0 | awk '{print $3}'))"
  [ "$name" = cn1 ] || return 0
  # nspawn mounts the host's cgroup v1 controllers read-only (only name=systemd is the container's):
  # Slurm's proctrack/task cgroup plugins could not make a job's cgroups. Each controller's mount
  # is replaced by a writable bind of a subtree of its own, so cn1's jobs stay apart from the host's.
  cgroup_subtree "$name"
  in_node "$name" sh -ec 'for c in cpuset cpu cpuacct memory devices freezer pids; do
      tac /proc/self/mounts | grep -m1 " /sys/fs/cgroup/$c " | grep -q " rw," && continue
      mount --bind /sys/fs/cgroup/$c/$0 /sys/fs/cgroup/$c
      mount -o remount,bind,rw /sys/fs/cgroup/$c
    done
    # after a reboot slurmd started before its cgroups were writable: again, now that they are
    # (only once it has a slurm.conf: the slurmd of Debian 13 starts without one, configless, waiting for DNS SRV)
    if [ -f /etc/slurm/slurm.conf ] && systemctl is-enabled -q slurmd 2>/dev/null && ! grep -q "^$(pgrep -xo slurmd)\$" /run/dstrial-slurmd-cgroups 2>/dev/null; then
      systemctl restart slurmd && { pgrep -xo slurmd > /run/dstrial-slurmd-cgroups || true; }
    fi' "$(cgroup_name "$name")"
}

step_systems() {
  no_other_trial
  apt-get install -y -q --no-install-recommends debootstrap systemd-container > /dev/null
  mkdir -p "$TRIAL"
  make_root login
  make_root cn1
  shared_env
  ip link show "$BRIDGE" > /dev/null 2>&1 || ip link add "$BRIDGE" type bridge
  ip addr show "$BRIDGE" | grep -q "$HOST_ADDR" || ip addr add "$HOST_ADDR" dev "$BRIDGE"
  ip link set "$BRIDGE" up
}

# One trial at a time on this host: both use $BRIDGE and 192.0.2.8/29, and `down` of either removes the bridge
no_other_trial() {
  local other
  other=$(pgrep -u 0 -af "^systemd-nspawn --boot " | grep -v -- " -D $TRIAL/" | sed -n 's/.* -D \([^ ]*\) .*/\1/p' | head -1) || true
  [ -z "$other" ] || { echo "[trial] another trial's system runs ($other): one trial at a time (stop it with its own down)" >&2; return 1; }
}

step_boot() { no_other_trial; boot_node login; boot_node cn1; }

step_down() {
  local name nspawn start
  # The jobs end first: a session's slurmstepd otherwise holds cn1's poweroff for systemd's 90 s
  if leader login > /dev/null 2>&1 && in_node login squeue -h -o %i > "$TRIAL/jobs-left" 2>/dev/null && [ -s "$TRIAL/jobs-left" ]; then
    in_node login scancel $(cat "$TRIAL/jobs-left") || true
    for _ in $(seq 30); do [ -z "$(in_node login squeue -h -t running,completing -o %i 2>/dev/null)" ] && break; sleep 1; done
  fi
  for name in hub2 cn1 login; do
    nspawn=$(nspawn_of "$name") || continue
    start=$(now)
    in_node "$name" systemctl poweroff || kill "$nspawn"
    for _ in $(seq 60); do kill -0 "$nspawn" 2>/dev/null || break; sleep 1; done
    if kill -0 "$nspawn" 2>/dev/null; then  # no clean poweroff within a minute: nspawn stops it
      kill "$nspawn"
      for _ in $(seq 30); do kill -0 "$nspawn" 2>/dev/null || break; sleep 1; done
    fi
    say "down: $name stopped in $(elapsed "$start") s"
  done
  for controller in cpuset cpu cpuacct memory devices freezer pids; do
    find "/sys/fs/cgroup/$controller" -depth -type d -path "*/$(cgroup_name cn1)*" -exec rmdir {} \; 2>/dev/null || true
  done
  if no_other_trial 2>/dev/null; then ip link del "$BRIDGE" 2>/dev/null || true; else say "down: $BRIDGE kept (another trial's systems use it)"; fi
  rm -rf "$TRIAL"
  say "down: systems stopped, $BRIDGE and $TRIAL removed"
}

# ---- docs/how-to/deploy.md, section by section -----------------------------------------------------------
step_munge() {  # section 3: login's key (the package made one) on cn1 too
  install -m 0400 "$TRIAL/login/etc/munge/munge.key" "$TRIAL/cn1/etc/munge/munge.key"  # the guide's scp -p
  local name
  for name in login cn1; do
    in_node "$name" sh -ec 'chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
                            systemctl enable -q munge && systemctl restart munge'
  done
  say "munge: login -> cn1 $(in_node login munge -n | in_node cn1 unmunge | grep STATUS)"
}

# What a site's slurm.conf has anyway (the guide takes a Slurm cluster as given), then the guide's block.
site_slurm_conf() {
  # job_container/tmpfs fails inside systemd-nspawn here: slurmstepd's bind of the job's mount
  # namespace (/proc/PID/ns/mnt onto BasePath/JOB/.ns) gets EINVAL, and every job ends with
  # "reason Prolog" (kernel 6.18, Slurm 22.05.8; the same bind by hand works). DSPORTAL_TRIAL_TMPFS=yes tries it.
  local JOB_CONTAINER_LINE="#JobContainerType=job_container/tmpfs  (off in the trial: see deploy-trial.sh)"
  [ "${DSPORTAL_TRIAL_TMPFS:-no}" = yes ] && JOB_CONTAINER_LINE=JobContainerType=job_container/tmpfs
  # Slurm's cron where the nodes' slurm-client has scrontab (Debian 13's; Debian 12's needs build-scrontab.sh)
  local SCRON_LINE="#ScronParameters=enable  (bookworm's slurm-client has no scrontab: see deploy.md section 4)"
  [ "$SUITE" = bookworm ] || SCRON_LINE=ScronParameters=enable
  cat <<EOF
ClusterName=trial
SlurmctldHost=login($LOGIN_ADDR)
SlurmUser=slurm
AuthType=auth/munge
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
AccountingStorageHost=login
ReturnToService=2
MpiDefault=none
NodeName=cn1 NodeAddr=$CN1_ADDR CPUs=2 RealMemory=8000 State=UNKNOWN
PartitionName=cpu Nodes=cn1 Default=YES MaxTime=04:00:00 DefaultTime=01:00:00 State=UP

# docs/how-to/deploy.md, section 4
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=4000
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup,task/affinity
$JOB_CONTAINER_LINE
PrologFlags=Contain
PrivateData=jobs,usage,users,accounts,reservations
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageEnforce=associations,limits,qos
AccountingStorageTRES=gres/gpu
AccountingStoreFlags=job_comment
GresTypes=gpu
SchedulerParameters=bf_interval=1,batch_sched_delay=0
Prolog=/etc/slurm/prolog.sh
MinJobAge=600
$SCRON_LINE
EOF
}

slurmdbd_conf() {
  cat <<EOF
AuthType=auth/munge
DbdHost=localhost
SlurmUser=slurm
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=$(cat "$TRIAL/slurmdb-password")
LogFile=/var/log/slurm/slurmdbd.log
PidFile=/run/slurmdbd.pid
# docs/how-to/deploy.md, section 4
PrivateData=jobs,usage,users,accounts
EOF
}

step_slurm() {  # section 4
  [ -f "$TRIAL/slurmdb-password" ] || (umask 077; openssl rand -hex 16 > "$TRIAL/slurmdb-password")
  local name
  for name in login cn1; do
    site_slurm_conf > "$TRIAL/$name/etc/slurm/slurm.conf"
    printf 'ConstrainCores=yes\nConstrainDevices=yes\nConstrainRAMSpace=yes\nConstrainSwapSpace=yes\nAllowedSwapSpace=0\n' \
      > "$TRIAL/$name/etc/slurm/cgroup.conf"
    printf 'AutoBasePath=true\nBasePath=/local/slurm-tmp\n' > "$TRIAL/$name/etc/slurm/job_container.conf"
  done
  slurmdbd_conf > "$TRIAL/login/etc/slurm/slurmdbd.conf"
  script_in login <<EOF
chown slurm:slurm /etc/slurm/slurmdbd.conf && chmod 0600 /etc/slurm/slurmdbd.conf
mariadb -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$(cat "$TRIAL/slurmdb-password")';
          GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
systemctl enable -q slurmdbd && systemctl restart slurmdbd
for i in \$(seq 30); do
  sacctmgr -n -P show cluster >/dev/null 2>&1 && break
  # Debian 13: slurmdbd 24.11.5 stopped at its first start on a fresh MariaDB 11.8 ("_check_mysql_concat_is_sane:
  # null result from query", error 5027), and started the next time (deploy-trial-trixie-2026-12-06.md)
  systemctl is-active -q slurmdbd || { echo "slurmdbd stopped: started again" >&2; systemctl restart slurmdbd; }
  sleep 1
done
sacctmgr -n -P show cluster format=cluster | grep -q trial || sacctmgr -i add cluster trial
systemctl enable -q slurmctld && systemctl restart slurmctld
EOF
  script_in cn1 <<'EOF'
systemctl enable -q slurmd && systemctl restart slurmd
EOF
  sleep 2
  # section 4: users see only their own processes
  for name in login cn1; do
    in_node "$name" sh -ec 'grep -q hidepid /etc/fstab || echo "proc /proc proc defaults,hidepid=invisible,gid=adm 0 0" >> /etc/fstab
                            mount -o remount /proc'
  done
  in_node login sinfo -N -o '%N %T %c %m'
  say "slurm: $(in_node login scontrol show config | grep -E 'DefMemPerCPU|JobContainerType|PrologFlags' | tr -s ' ' | paste -sd ';')"
}

trial_ca() {  # the trial's own CA: slapd's StartTLS certificate and the portal's public one (section 7)
  local tls=$TRIAL/tls
  [ -f "$tls/portal.crt" ] && return 0
  mkdir -p "$tls" && chmod 700 "$tls"
  # keyUsage on the CA and key identifiers on what it signs: Python 3.13 verifies strictly (VERIFY_X509_STRICT),
  # as a site's CA is made anyway
  openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj /CN=dsportal-trial-CA \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
    -keyout "$tls/ca.key" -out "$tls/ca.crt" 2>/dev/null
  issue_cert ldap "login" "DNS:login"
  issue_cert portal "hub.example.org" "DNS:hub.example.org,DNS:*.hub.example.org"
}

issue_cert() {  # issue_cert FILE CN SUBJECT_ALT_NAMES
  local tls=$TRIAL/tls
  openssl req -newkey rsa:2048 -nodes -subj "/CN=$2" -keyout "$tls/$1.key" -out "$tls/$1.csr" 2>/dev/null
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n' \
    "$3" > "$tls/$1.ext"
  openssl x509 -req -in "$tls/$1.csr" -CA "$tls/ca.crt" -CAkey "$tls/ca.key" -CAcreateserial -days 30 \
    -extfile "$tls/$1.ext" -out "$tls/$1.crt" 2>/dev/null
}

directory_ldif() {  # the portal's user, her group and the portal group (what a site's directory has)
  cat <<EOF
dn: ou=people,dc=example,dc=org
objectClass: organizationalUnit
ou: people

dn: ou=groups,dc=example,dc=org
objectClass: organizationalUnit
ou: groups

dn: uid=$USER_NAME,ou=people,dc=example,dc=org
objectClass: inetOrgPerson
objectClass: posixAccount
uid: $USER_NAME
cn: Alice Trial
sn: Trial
uidNumber: $USER_UID
gidNumber: $USER_UID
homeDirectory: /home/$USER_NAME
loginShell: /bin/bash
userPassword: $(in_node login slappasswd -s "$USER_PASSWORD")

dn: cn=$USER_NAME,ou=groups,dc=example,dc=org
objectClass: posixGroup
cn: $USER_NAME
gidNumber: $USER_UID

dn: cn=datascience,ou=groups,dc=example,dc=org
objectClass: posixGroup
cn: datascience
gidNumber: 3000
memberUid: $USER_NAME
EOF
}

step_ldap() {  # the directory the guide assumes: slapd on login (StartTLS), nslcd on both nodes
  trial_ca
  install -d -m 0755 "$TRIAL/login/etc/ldap/tls"
  install -m 0644 "$TRIAL/tls/ca.crt" "$TRIAL/login/usr/local/share/ca-certificates/dsportal-trial-ca.crt"
  install -m 0644 "$TRIAL/tls/ca.crt" "$TRIAL/cn1/usr/local/share/ca-certificates/dsportal-trial-ca.crt"
  install -m 0644 "$TRIAL/tls/ldap.crt" "$TRIAL/login/etc/ldap/tls/ldap.crt"
  install -m 0600 "$TRIAL/tls/ldap.key" "$TRIAL/login/etc/ldap/tls/ldap.key"
  script_in login <<'EOF'
update-ca-certificates >/dev/null
# libldap-common (a Recommends) brings ldap.conf: without it the client commands trust no CA
[ -f /etc/ldap/ldap.conf ] || echo 'TLS_CACERT /etc/ssl/certs/ca-certificates.crt' > /etc/ldap/ldap.conf
chown openldap:openldap /etc/ldap/tls/ldap.key
ldapmodify -Q -Y EXTERNAL -H ldapi:/// <<LDIF
dn: cn=config
changetype: modify
replace: olcTLSCACertificateFile
olcTLSCACertificateFile: /etc/ssl/certs/ca-certificates.crt
-
replace: olcTLSCertificateFile
olcTLSCertificateFile: /etc/ldap/tls/ldap.crt
-
replace: olcTLSCertificateKeyFile
olcTLSCertificateKeyFile: /etc/ldap/tls/ldap.key
LDIF
EOF
  if ! in_node login ldapsearch -LLL -x -H ldap://login -ZZ -b dc=example,dc=org uid="$USER_NAME" dn | grep -q dn; then
    directory_ldif | in_node login ldapadd -x -H ldap://login -ZZ -D cn=admin,dc=example,dc=org -w "$LDAP_ADMIN_PASSWORD" > /dev/null
  fi
  in_node cn1 update-ca-certificates > /dev/null
  local name
  for name in login cn1; do
    in_node "$name" sh -c 'grep -q "^ssl start_tls" /etc/nslcd.conf || echo "ssl start_tls" >> /etc/nslcd.conf; systemctl restart nslcd'
    say "ldap: $name sees $(in_node "$name" id "$USER_NAME")"
  done
  in_node login sh -ec "install -d -m 0700 -o $USER_NAME -g $USER_NAME /home/$USER_NAME"  # shared homes
  # section 4, end: every portal user needs a Slurm association
  in_node login sh -ec "sacctmgr -n -P show account datascience format=account | grep -q datascience ||
                          sacctmgr -i add account datascience > /dev/null
                        sacctmgr -n -P show user $USER_NAME format=user | grep -q $USER_NAME ||
                          sacctmgr -i add user $USER_NAME account=datascience > /dev/null"
  say "ldap: $USER_NAME's association: $(in_node login sacctmgr -n -P show assoc user="$USER_NAME" format=cluster,account,user)"
}

# Section 5: the shipped portal.yaml with the guide's changes, and the trial's one profile (cn1 has
# 2 CPUs and no GPU), no container images (no Apptainer here), the repo's template notebooks only.
edit_portal_yaml() {
  cat <<EOF
import sys, yaml
config = yaml.safe_load(open("/etc/dsportal/portal.yaml"))  # the installed package's copy (section 5)
hub = config["hub"]
for key in ("proxy_token_file",):  # the demo's: here the units hand the token over (section 8)
    hub.pop(key, None)
hub.update({
    "bind_url": "https://hub.example.org", "subdomain_host": "https://hub.example.org",
    "hub_bind_url": "https://$PORTAL_NAME:8081", "proxy_api_url": "http://127.0.0.1:8001",
    "data_dir": "/var/lib/dsportal/hub", "internal_ssl": True, "external_proxy": True,
    "account": "dsportal-hub", "admin_users": [],
    "db_url": "mysql+pymysql://dsportal_hub@127.0.0.1:3306/jupyterhub",
    "db_password_file": "/var/lib/dsportal/hub/db-password",
})
config["slurm"].update({"conf": "/etc/slurm/slurm.conf", "submit_as": "sudo",
                        "mediator": "/usr/local/libexec/dsportal/mediator"})
config["ldap"].update({"server_address": "login", "server_port": 389, "tls_strategy": "before_bind",
                       "bind_dn_template": ["uid={username},ou=people,dc=example,dc=org"],
                       "allowed_groups": ["cn=datascience,ou=groups,dc=example,dc=org"]})
config["session"].update({"environment": "/opt/dsportal/env", "default_profile": "cpu"})
config["profiles"] = [{
    "name": "cpu", "partition": "cpu", "display_name": "CPU partition",
    "description": "One core and 2 GB on cn1.", "gpu_choices": [0], "default_gpus": 0,
    "cpus_without_gpu": 1, "mem_without_gpu": "2G", "tools": ["terminal"],  # no R, git or code-server on cn1
    "default_walltime": "01:00:00", "max_walltime": "04:00:00", "sessions_per_user": 3}]
config["images"] = []
config["templates"]["sources"] = [s for s in config["templates"]["sources"] if s["name"] == "dsportal"]
config["data_mounts"] = []
config["sharing"] = {"groups": ["datascience"]}  # alice may share her sessions (the upgrade trial shares one)
yaml.safe_dump(config, sys.stdout, sort_keys=False)
EOF
}

portal_config() {  # 5. portal.yaml: the guide's two lines, then its changes
  local shipped=/opt/dsportal/env/share/dsportal/portal.yaml
  # an earlier release's guide: the package's copy (releases up to 0.3.0 have no share/dsportal)
  old_portal && shipped=/opt/dsportal/env/lib/python3.11/site-packages/dsportal_config/portal.yaml
  script_in login <<EOF
install -d -m 0755 /etc/dsportal
install -m 0644 $shipped /etc/dsportal/portal.yaml
EOF
  edit_portal_yaml | in_node login /opt/dsportal/env/bin/python - > "$TRIAL/portal.yaml"
  install -m 0644 "$TRIAL/portal.yaml" "$TRIAL/login/etc/dsportal/portal.yaml"
}

portal_firewall() {  # 6. the node firewall (its unit from the installed package: cn1 has no checkout)
  # `up` forgets the users the Prolog added: not again on a node whose firewall runs (it may have jobs)
  if old_portal; then  # its guide: the unit file copied from the checkout
    install -m 0644 "$TRIAL/from-src/config/systemd/dsportal-firewall.service" "$TRIAL/cn1/root/"
    install -m 0644 "$TRIAL/from-src/config/systemd/dsportal-firewall.service" "$TRIAL/login/root/"
  fi
  local install_unit="/opt/dsportal/env/bin/dsportal firewall install-unit" hub_ports="--hub-ports 8081,8082 --local-ports 8001 --compute $COMPUTE"
  old_portal && install_unit="install -m 0644 /root/dsportal-firewall.service /etc/systemd/system/" hub_ports=""
  script_in cn1 <<EOF
systemctl is-active -q dsportal-firewall && exit 0
/opt/dsportal/env/bin/dsportal firewall up --cluster $CLUSTER
cat > /etc/slurm/prolog.sh <<'PROLOG'
#!/bin/sh
# the job's user's TCP services on this node answer only that user
/opt/dsportal/env/bin/dsportal firewall add-user "\$SLURM_JOB_UID" >/dev/null || true
PROLOG
chmod 755 /etc/slurm/prolog.sh
printf 'PORTAL_GROUP=datascience\nCLUSTER=$CLUSTER\n' > /etc/default/dsportal-firewall
$install_unit
systemctl daemon-reload && systemctl enable -q --now dsportal-firewall
EOF
  # the login node: its users, and the hub's ports for cn1 (the compute nodes) and itself only
  script_in login <<EOF
systemctl is-active -q dsportal-firewall && exit 0
/opt/dsportal/env/bin/dsportal firewall up \$(getent group datascience | cut -d: -f4 | tr , ' ') --cluster $CLUSTER $hub_ports
printf 'PORTAL_GROUP=datascience\nCLUSTER=$CLUSTER\n' > /etc/default/dsportal-firewall
[ -z "$hub_ports" ] || printf 'HUB_PORTS=8081,8082\nLOCAL_PORTS=8001\nCOMPUTE=$COMPUTE\n' >> /etc/default/dsportal-firewall
$install_unit
systemctl daemon-reload && systemctl enable -q --now dsportal-firewall
EOF
  say "firewall: login: $(in_node login /opt/dsportal/env/bin/dsportal firewall status)"
  say "firewall: login $(in_node login systemctl is-active dsportal-firewall), cn1 $(in_node cn1 systemctl is-active dsportal-firewall)"
}

portal_tls() {  # 7. TLS for the public side: the proxy terminates it
  install -m 0600 "$TRIAL/tls/portal.key" "$TRIAL/login/root/hub.example.org.key"
  install -m 0644 "$TRIAL/tls/portal.crt" "$TRIAL/login/root/hub.example.org.fullchain.crt"
  script_in login <<'EOF'
cd /root
install -d -m 0700 /etc/dsportal/tls
install -m 0600 hub.example.org.key /etc/dsportal/tls/portal.key
install -m 0644 hub.example.org.fullchain.crt /etc/dsportal/tls/portal.crt
EOF
}

portal_account() {  # 8. the hub's account, the mediator and its sudo rule, the proxy token
  script_in login <<'EOF'
getent passwd dsportal-hub >/dev/null || adduser --system --group --home /var/lib/dsportal --no-create-home dsportal-hub
sacctmgr -n -P show account dsportal format=account | grep -q dsportal ||
  sacctmgr -i add account dsportal Description="the portal's hub"
sacctmgr -n -P show user dsportal-hub format=user | grep -q dsportal-hub ||
  sacctmgr -i add user dsportal-hub Account=dsportal AdminLevel=Operator
install -d -m 0755 /usr/local/libexec/dsportal
/opt/dsportal/env/bin/dsportal --config /etc/dsportal/portal.yaml hub install-mediator
/opt/dsportal/env/bin/dsportal --config /etc/dsportal/portal.yaml hub sudoers > /tmp/dsportal.sudoers
visudo -cf /tmp/dsportal.sudoers && install -m 0440 /tmp/dsportal.sudoers /etc/sudoers.d/dsportal
install -d -m 0755 /etc/dsportal
if [ ! -f /etc/dsportal/proxy-token.env ]; then
  (umask 077; printf 'CONFIGPROXY_AUTH_TOKEN=%s\n' "$(openssl rand -hex 32)" > /etc/dsportal/proxy-token.env)
fi
chown dsportal-hub:dsportal-hub /etc/dsportal/proxy-token.env && chmod 0600 /etc/dsportal/proxy-token.env
EOF
  say "sudo: as alice: $(in_node login sudo -u dsportal-hub sudo -n -u "$USER_NAME" /bin/sh -c id 2>&1 | head -1)"
  say "sudo: as root:  $(in_node login sudo -u dsportal-hub sudo -n true 2>&1 | head -1)"
}

portal_database() {  # 9. the hub's database: its own on login's MariaDB (docs/how-to/move-the-database.md)
  script_in login <<'EOF'
install -d -m 0755 /var/lib/dsportal
install -d -m 0700 -o dsportal-hub -g dsportal-hub /var/lib/dsportal/hub
if [ ! -f /var/lib/dsportal/hub/db-password ]; then
  (umask 077; openssl rand -hex 16 > /var/lib/dsportal/hub/db-password)
fi
chown dsportal-hub:dsportal-hub /var/lib/dsportal/hub/db-password
mariadb -e "CREATE DATABASE IF NOT EXISTS jupyterhub CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
          CREATE USER IF NOT EXISTS 'dsportal_hub'@'localhost' IDENTIFIED BY '$(cat /var/lib/dsportal/hub/db-password)';
          GRANT ALL ON jupyterhub.* TO 'dsportal_hub'@'localhost';"
EOF
}

portal_units() {  # 10. the units from the installed package; the proxy unit's site values edited as its header says
  # (--force: a second run of this step takes the shipped units again, then makes the same edit)
  if old_portal; then
    install -m 0644 "$TRIAL"/from-src/config/systemd/dsportal-{proxy,hub}.service "$TRIAL/login/etc/systemd/system/"
  else
    in_node login /opt/dsportal/env/bin/dsportal hub install-units --force
  fi
  script_in login <<'EOF'
sed -i 's|https://login1.cluster.example.org:8081/hub/error|https://portal:8081/hub/error|' /etc/systemd/system/dsportal-proxy.service
systemd-analyze verify /etc/systemd/system/dsportal-proxy.service /etc/systemd/system/dsportal-hub.service
systemctl daemon-reload
systemctl enable -q --now dsportal-proxy dsportal-hub
EOF
  local tries
  for tries in $(seq 60); do
    curl -s -o /dev/null --cacert "$TRIAL/tls/ca.crt" --resolve "hub.example.org:443:$LOGIN_ADDR" \
      https://hub.example.org/hub/login -w "%{http_code}" | grep -q 200 && break
    sleep 1
  done
  say "hub: $(in_node login systemctl is-active dsportal-proxy dsportal-hub | paste -sd ' '), login page $(curl -s -o /dev/null -w '%{http_code}' --cacert "$TRIAL/tls/ca.crt" --resolve "hub.example.org:443:$LOGIN_ADDR" https://hub.example.org/hub/login)"
  # /etc/dsportal/portal.yaml (an earlier release read it only when named)
  in_node login env DSPORTAL_CONFIG=/etc/dsportal/portal.yaml /opt/dsportal/env/bin/dsportal check | sed 's/^/[check] /' || true
}

step_portal() {  # sections 5 to 10, in the guide's order
  trial_ca
  portal_config
  portal_firewall
  portal_tls
  portal_account
  portal_database
  portal_units
}

# ---- done: a real login from this host, a session on cn1, a kernel, a hub restart ----------------------
# The host's Python with the checkout's tests/hubclient.py (a browser's way through the hub), every
# *.hub.example.org name sent to the login node, the trial's CA trusted.
hub_python() {
  REQUESTS_CA_BUNDLE=$TRIAL/tls/ca.crt WEBSOCKET_CLIENT_CA_BUNDLE=$TRIAL/tls/ca.crt PYTHONPATH=$REPO/tests \
    TRIAL_LOGIN_ADDR=$(portal_addr) /opt/dsportal/env/bin/python -c "
import os, socket
real_getaddrinfo = socket.getaddrinfo
def trial_getaddrinfo(host, *args, **kwargs):
    if host == 'hub.example.org' or str(host).endswith('.hub.example.org'):
        host = os.environ['TRIAL_LOGIN_ADDR']
    return real_getaddrinfo(host, *args, **kwargs)
socket.getaddrinfo = trial_getaddrinfo
$1"
}

step_check() {
  local start token_file=$TRIAL/alice-token job
  start=$(now)
  hub_python "
import time
from hubclient import HubUser
alice = HubUser('https://hub.example.org', '$USER_NAME').must_login('$USER_PASSWORD')
print('[trial] login: $USER_NAME logged in over $(portal_addr)')
if alice.model().get('servers'):  # a session of an earlier run: stopped, so that this one measures a start
    # Right after the systems booted, the hub's startup check of that session may still be under way
    # (up to twice hub.http_timeout while Slurm has not yet seen cn1 reboot), and JupyterHub answers
    # the stop with 500 ('pending check') until it is done.
    for attempt in range(40):
        try:
            alice.stop_server()
            break
        except AssertionError as refused:
            if 'Internal Server Error' not in str(refused) or attempt == 39:
                raise
            time.sleep(5)
    print(f'[trial] session: the earlier run\'s session stopped (after {attempt} refusals)')
started = time.monotonic()
server = alice.spawn({}, timeout=300)
print(f'[trial] session: ready in {time.monotonic() - started:.1f} s at {server[\"url\"]}')
lab = alice.web.get(alice.url('/user/$USER_NAME/lab'))
print(f'[trial] JupyterLab through the proxy: {lab.status_code} {lab.url}')
assert lab.status_code == 200
print('[trial] kernel says: ' + alice.run_code(
    'import os, socket; print(os.getuid(), socket.gethostname(), os.environ[\"SLURM_JOB_ID\"], 6 * 7)').strip())
with open('$token_file', 'w', opener=lambda path, flags: os.open(path, flags, 0o600)) as out:
    out.write(alice.token)
import json  # her browser's cookies, for the restore's check that her login outlives the machine
with open('$TRIAL/alice-cookies.json', 'w', opener=lambda path, flags: os.open(path, flags, 0o600)) as out:
    json.dump([{'name': c.name, 'value': c.value, 'domain': c.domain, 'path': c.path, 'secure': c.secure}
               for c in alice.web.cookies], out)
"
  say "session: first start to a running kernel $(elapsed "$start") s"
  job=$(in_node login squeue -h -u "$USER_NAME" -o %i | head -1)
  say "squeue on login: job $job: $(in_node login squeue -h -j "$job" -o 'user %u, node %N, %T')"
  say "ps on cn1, $USER_NAME's processes: $(in_node cn1 ps -u "$USER_NAME" -o comm= | sort | uniq -c | tr -s ' ' | paste -sd ',')"
  # the route survives a hub restart: the session answers through the proxy while and after the hub restarts
  local status_url="https://$USER_NAME.hub.example.org/user/$USER_NAME/api/status" code
  curl_session() {
    curl -s -o /dev/null -w '%{http_code}' --cacert "$TRIAL/tls/ca.crt" \
      --resolve "$USER_NAME.hub.example.org:443:$(portal_addr)" -H "Authorization: token $(cat "$token_file")" "$status_url"
  }
  say "before the hub restart: session API $(curl_session)"
  local node; node=$(portal_node)
  in_node "$node" systemctl restart dsportal-hub --no-block
  code=$(curl_session)
  say "while dsportal-hub restarts ($(in_node "$node" systemctl is-active dsportal-hub)): session API $code"
  sleep 5
  say "after: dsportal-hub $(in_node "$node" systemctl is-active dsportal-hub), session API $(curl_session), squeue: $(in_node login squeue -h -j "$job" -o %T)"
  say "hub process user: $(in_node "$node" ps -o user= -p "$(in_node "$node" systemctl show -P MainPID dsportal-hub)"), proxy's: $(in_node "$node" ps -o user= -p "$(in_node "$node" systemctl show -P MainPID dsportal-proxy)")"
  say "job $job's memory limit on cn1: $(in_node cn1 cat "/sys/fs/cgroup/memory/slurm_cn1/uid_$USER_UID/job_$job/memory.limit_in_bytes") bytes"
}

# ---- the hub's ports (section 6): cn1 and login itself reach them, another host of the network does not ----------
# probe TARGET...: each HOST:PORT "open", "refused" or "timeout" (3 s), with the seconds it took
PROBE='import socket, sys, time
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    start = time.monotonic()
    try:
        socket.create_connection((host, int(port)), timeout=3).close(); result = "open"
    except ConnectionRefusedError:
        result = "refused"
    except OSError as error:
        result = "timeout" if isinstance(error, TimeoutError) else type(error).__name__
    print(f"{target}={result}({time.monotonic() - start:.2f}s)")'

step_ports() {
  local from_host from_cn1 from_login failed=0 start node address
  start=$(now) node=$(portal_node) address=$(portal_addr)
  # The host itself is on the bridge (192.0.2.9: inside the cluster's /29, neither the hub nor a compute node)
  from_host=$(python3 -c "$PROBE" "$address:8001" "$address:8081" "$address:8082" "$address:443" | paste -sd ' ')
  from_cn1=$(in_node cn1 python3 -c "$PROBE" $PORTAL_NAME:8081 $PORTAL_NAME:8082 $PORTAL_NAME:8001 | paste -sd ' ')
  from_login=$(in_node "$node" python3 -c "$PROBE" 127.0.0.1:8001 $PORTAL_NAME:8081 $PORTAL_NAME:8082 | paste -sd ' ')
  say "ports of $node ($address): from the host ${HOST_ADDR%/*}: $from_host"
  say "ports of $node: from cn1 $CN1_ADDR: $from_cn1"
  say "ports of $node: from $node itself: $from_login"
  [[ $from_host =~ :8001=(refused|timeout) && $from_host =~ :8081=(refused|timeout) && $from_host =~ :8082=(refused|timeout) \
     && $from_host =~ :443=open ]] || { say "ports: FAILED: the host reaches a port of the hub's"; failed=1; }
  [[ $from_cn1 =~ :8081=open && $from_cn1 =~ :8082=open && $from_cn1 =~ :8001=(refused|timeout) ]] \
    || { say "ports: FAILED: cn1 does not reach the hub's API or dsportal's service"; failed=1; }
  [[ ! $from_login =~ =(refused|timeout) ]] || { say "ports: FAILED: $node does not reach its own ports"; failed=1; }
  say "ports: $node's refusals: $(in_node "$node" nft list chain inet dsportal_isolation input | grep -oE '(packets [0-9]+ bytes [0-9]+ reject with tcp reset comment "[^"]*")' | sed 's/ bytes [0-9]* reject with tcp reset comment//' | paste -sd ';')"
  TIMES[ports]=$(elapsed "$start")
  return $failed
}

# ---- docs/how-to/take-a-security-release.md, section 4: the upgrade in place, sessions running ----------------
# alice's sessions on the earlier release: the default one with a kernel busy in a loop, a named one, and a
# third that waits in Slurm's queue (cn1's 2 CPUs are taken)
step_sessions() {
  old_portal || { say "sessions: no earlier release deployed (DSPORTAL_TRIAL_FROM)"; return 0; }
  local start; start=$(now)
  hub_python "
import json, time
from hubclient import HubUser
alice = HubUser('https://hub.example.org', '$USER_NAME', token=open('$TRIAL/alice-token').read())
kernel = alice.api('POST', '/user/$USER_NAME/api/kernels', json={'name': 'python3'}).json()['id']
ws = alice._channels(kernel, 30)
alice._ask(ws, 'import time\nfor i in range(100000):\n    open(\"/home/$USER_NAME/busy-counter\", \"w\").write(str(i))\n    time.sleep(0.1)')
ws.close()
time.sleep(2)
state = alice.api('GET', f'/user/$USER_NAME/api/kernels/{kernel}').json()['execution_state']
print(f'[trial] sessions: the default session\'s kernel {kernel} {state}, counting in ~/busy-counter')
assert state == 'busy', state
open('$TRIAL/busy-kernel', 'w').write(kernel)
alice.spawn({'shared': True}, timeout=300, server='second')
code = alice.api('POST', '/hub/api/share-codes/$USER_NAME/second')
assert code.status_code in (200, 201), code.text
print(f'[trial] sessions: named session second ready, started shareable and shared: share code {code.json()[\"id\"]}')
response = alice.start_server({}, server='queued')
assert response.status_code in (201, 202), response.text
for _ in range(30):
    pending = alice.model()['servers'].get('queued', {})
    if pending.get('pending') == 'spawn':
        break
    time.sleep(1)
print(f'[trial] sessions: named session queued: {json.dumps({k: pending.get(k) for k in (\"pending\", \"ready\")})}')
"
  sleep 3
  in_node login squeue -h -u "$USER_NAME" -o '%i %j %T %R' | sed 's/^/[trial] sessions: squeue: /'
  in_node login squeue -h -u "$USER_NAME" -o '%i %j %T' | sort -n > "$TRIAL/jobs-before"
  TIMES[sessions]=$(elapsed "$start")
}

step_upgrade() {
  old_portal || { say "upgrade: nothing to upgrade from (DSPORTAL_TRIAL_FROM)"; return 0; }
  local start revision_before revision_after from to counted queued_job
  start=$(now)
  from="dsportal $(in_node login /opt/dsportal/env/bin/python -c 'import importlib.metadata as m; print(m.version("dsportal"))')"  # 0.1.0 has no --version
  revision_before=$(in_node login mariadb -N -e 'SELECT version_num FROM jupyterhub.alembic_version')
  counted=$(cat "$TRIAL/shared/home/$USER_NAME/busy-counter")
  # "For dsportal's own code only": the wheel into the shared environment (the login node writes it here) ...
  install_wheel "$(ls "$TRIAL"/wheel/dsportal-*.whl)"
  touch "$TRIAL/upgraded"
  # ... then on the login node, as written (install-units keeps the edited proxy unit and says so: exit 1)
  script_in login <<'EOS'
/opt/dsportal/env/bin/dsportal check | sed 's/^/[check upgrade] /' | grep -v '\[ok\]' || true
/opt/dsportal/env/bin/dsportal hub install-mediator
/opt/dsportal/env/bin/dsportal hub install-units || echo "[trial] upgrade: install-units exited $?"
systemctl daemon-reload && systemctl restart dsportal-hub
EOS
  # deploy.md, section 6: the firewall's new unit and the hub's ports (the login node runs no jobs)
  script_in login <<EOS
/opt/dsportal/env/bin/dsportal firewall install-unit || /opt/dsportal/env/bin/dsportal firewall install-unit --force
grep -q HUB_PORTS /etc/default/dsportal-firewall || printf 'HUB_PORTS=8081,8082\nLOCAL_PORTS=8001\nCOMPUTE=$COMPUTE\n' >> /etc/default/dsportal-firewall
systemctl daemon-reload && systemctl restart dsportal-firewall
EOS
  to=$(in_node login /opt/dsportal/env/bin/dsportal --version)
  queued_job=$(awk '$2 ~ /:queued$/ {print $1}' "$TRIAL/jobs-before")
  hub_python "
import time
from hubclient import HubUser
alice = HubUser('https://hub.example.org', '$USER_NAME', token=open('$TRIAL/alice-token').read())
for _ in range(120):  # the upgraded hub's start-up check of each session
    servers = alice.model().get('servers', {})
    if servers.get('', {}).get('ready') and servers.get('second', {}).get('ready') and ('queued' in servers or _ > 30):
        break
    time.sleep(1)
print('[trial] upgrade: the hub lists ' + ', '.join(f'{n or \"(default)\"} ' + ('ready' if s.get('ready') else f'pending {s.get(\"pending\")}') for n, s in sorted(servers.items())))
kernel = open('$TRIAL/busy-kernel').read()
state = alice.api('GET', f'/user/$USER_NAME/api/kernels/{kernel}').json()['execution_state']
counted = int(open('$TRIAL/shared/home/$USER_NAME/busy-counter').read())
print(f'[trial] upgrade: the default session\'s kernel {kernel} still {state}; it counted from $counted to {counted} meanwhile')
assert state == 'busy' and counted > $counted, (state, counted)
print('[trial] upgrade: named session second: its kernel says job ' + alice.run_code('import os; print(os.environ[\"SLURM_JOB_ID\"])', server='second').strip())
codes = alice.api('GET', '/hub/api/share-codes/$USER_NAME/second').json()
codes = codes['items'] if isinstance(codes, dict) else codes
print(f'[trial] upgrade: named session second: its share codes: {\", \".join(c[\"id\"] for c in codes) or \"none\"}')
queued = servers.get('queued', {})
print('[trial] upgrade: the session queued under the earlier release is ' + (f'started again by the upgraded hub (pending {queued.get(\"pending\")})' if queued else
      'gone from the hub (that release did not store a queued job\'s id; its job $queued_job still waits in Slurm)'))
alice.stop_server(server='second')
print('[trial] upgrade: second stopped: its CPU is free for the queued job')
if queued:
    started = time.monotonic()
    alice.wait_ready(timeout=180, server='queued')
    job = alice.run_code('import os; print(os.environ[\"SLURM_JOB_ID\"])', server='queued').strip()
    print(f'[trial] upgrade: the queued session is ready {time.monotonic() - started:.1f} s after second stopped; its kernel says job {job} (queued as $queued_job)')
"
  if [ -n "$queued_job" ]; then
    say "upgrade: the earlier release's queued job $queued_job: $(in_node login sacct -n -X -j "$queued_job" -o State%12,Start,ExitCode | xargs)"
  fi
  revision_after=$(in_node login mariadb -N -e 'SELECT version_num FROM jupyterhub.alembic_version')
  say "upgrade: $from -> $to; JupyterHub's schema $revision_before -> $revision_after; state's version $(in_node login cat /var/lib/dsportal/hub/dsportal-version)"
  say "upgrade: jobs before: $(paste -sd ' ' "$TRIAL/jobs-before"); now: $(in_node login squeue -h -u "$USER_NAME" -o '%i %j %T' | sort -n | paste -sd ' ')"
  TIMES[upgrade]=$(elapsed "$start")
}

# ---- docs/how-to/back-up-and-restore.md: a backup of the running portal, restored onto a fresh login node -------
step_backup() {  # section 2, on the login node, alice's session running (the doc's commands, backup=/root/dsportal-backup)
  local start job
  start=$(now)
  job=$(in_node login squeue -h -u "$USER_NAME" -t running -o %i | head -1)
  [ -n "$job" ] || { say "backup: FAILED: no running session job of $USER_NAME (run the check step first)"; return 1; }
  echo "$job" > "$TRIAL/alice-job"
  script_in login <<'EOF'
umask 077
backup=/root/dsportal-backup && rm -rf "$backup" && mkdir -p "$backup"
mariadb-dump --single-transaction jupyterhub > "$backup/jupyterhub.sql"
getent passwd dsportal-hub > "$backup/hub-account" && getent group dsportal-hub >> "$backup/hub-account"
tar -C / -cpf "$backup/files.tar" --exclude="*.pid" etc/dsportal var/lib/dsportal \
  etc/default/dsportal-firewall etc/sudoers.d/dsportal etc/systemd/system/dsportal-hub.service \
  etc/systemd/system/dsportal-proxy.service etc/systemd/system/dsportal-firewall.service
/opt/dsportal/env/bin/dsportal --version > "$backup/version"
EOF
  rm -rf "$TRIAL/backup" && cp -a "$TRIAL/login/root/dsportal-backup" "$TRIAL/backup"  # off the machine
  say "backup: $(du -sh "$TRIAL/backup" | cut -f1) ($(tar -tf "$TRIAL/backup/files.tar" | grep -vc '/$') files, a dump of $(grep -c '^INSERT' "$TRIAL/backup/jupyterhub.sql") INSERTs, $(cat "$TRIAL/backup/version")), hub account $(head -1 "$TRIAL/backup/hub-account" | cut -d: -f1,3,4); $USER_NAME's job $job $(in_node login squeue -h -j "$job" -o %T)"
  TIMES[backup]=$(elapsed "$start")
}

step_restore() {  # section 3: login's portal lost for good, a fresh hub2 takes over the hub's names
  local start job uid gid tries
  start=$(now)
  job=$(cat "$TRIAL/alice-job")
  if [ "$(portal_node)" != hub2 ]; then
    # The login node's portal is gone; slurmctld, slurmdbd and the directory stay on login
    in_node login systemctl disable -q --now dsportal-hub dsportal-proxy
    say "restore: login's portal stopped for good (hub $(in_node login systemctl is-active dsportal-hub || true)); job $job $(in_node login squeue -h -j "$job" -o %T)"
    # A fresh machine: the hub account's numbers from the backup first, then Debian's packages
    uid=$(awk -F: 'NR == 1 {print $3}' "$TRIAL/backup/hub-account")
    gid=$(awk -F: 'NR == 2 {print $3}' "$TRIAL/backup/hub-account")
    make_root hub2 "groupadd --system --gid $gid dsportal-hub
useradd --system --uid $uid --gid dsportal-hub --home-dir /var/lib/dsportal --no-create-home --shell /usr/sbin/nologin dsportal-hub"
    boot_node hub2
    # what deploy.md gives every login node: munge's key (3), slurm.conf (4), the directory client, /proc
    install -m 0400 "$TRIAL/login/etc/munge/munge.key" "$TRIAL/hub2/etc/munge/munge.key"
    cp "$TRIAL/login/etc/slurm/slurm.conf" "$TRIAL/login/etc/slurm/cgroup.conf" "$TRIAL/hub2/etc/slurm/"
    install -m 0644 "$TRIAL/tls/ca.crt" "$TRIAL/hub2/usr/local/share/ca-certificates/dsportal-trial-ca.crt"
    script_in hub2 <<'EOF'
chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
systemctl enable -q munge && systemctl restart munge
update-ca-certificates > /dev/null
grep -q "^ssl start_tls" /etc/nslcd.conf || echo "ssl start_tls" >> /etc/nslcd.conf
systemctl restart nslcd
grep -q hidepid /etc/fstab || echo "proc /proc proc defaults,hidepid=invisible,gid=adm 0 0" >> /etc/fstab
mount -o remount /proc
EOF
    say "restore: hub2 sees $(in_node hub2 id "$USER_NAME"); its hub account $(in_node hub2 id dsportal-hub), on login $(in_node login id dsportal-hub); munge hub2 -> login $(in_node hub2 munge -n | in_node login unmunge | grep STATUS)"
    # The backup, off the old machine, onto the new one, then the doc's commands
    rm -rf "$TRIAL/hub2/root/dsportal-backup" && cp -a "$TRIAL/backup" "$TRIAL/hub2/root/dsportal-backup"
    script_in hub2 <<'EOF'
backup=/root/dsportal-backup
tar -C / -xpf "$backup/files.tar"
install -d -m 0755 /usr/local/libexec/dsportal
/opt/dsportal/env/bin/dsportal hub install-mediator
visudo -cf /etc/sudoers.d/dsportal
mariadb -e "CREATE DATABASE jupyterhub CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
          CREATE USER 'dsportal_hub'@'localhost' IDENTIFIED BY '$(cat /var/lib/dsportal/hub/db-password)';
          GRANT ALL ON jupyterhub.* TO 'dsportal_hub'@'localhost';"
mariadb jupyterhub < "$backup/jupyterhub.sql"
systemctl daemon-reload && systemctl enable -q --now dsportal-firewall
EOF
    # The names move to hub2 (the site's DNS): the hub's name for the compute nodes, the public one for browsers
    echo "$HUB2_ADDR" > "$TRIAL/portal-addr"
    for name in login cn1 hub2; do hosts_file "$HUB2_ADDR" > "$TRIAL/$name/etc/hosts"; done
    in_node hub2 systemctl enable -q --now dsportal-proxy dsportal-hub
  fi
  for tries in $(seq 90); do
    curl -s -o /dev/null --cacert "$TRIAL/tls/ca.crt" --resolve "hub.example.org:443:$HUB2_ADDR" \
      https://hub.example.org/hub/login -w "%{http_code}" | grep -q 200 && break
    sleep 1
  done
  TIMES[restore-to-login-page]=$(elapsed "$start")
  say "restore: hub2's $(in_node hub2 systemctl is-active dsportal-firewall dsportal-proxy dsportal-hub | paste -sd ' '), $(in_node hub2 /opt/dsportal/env/bin/dsportal --version) after $(elapsed "$start") s"
  # alice's token from before the backup, then her session through the restored hub: the same job, a kernel
  say "restore: $USER_NAME's token from before the backup: session API $(curl -s -o /dev/null -w '%{http_code}' --cacert "$TRIAL/tls/ca.crt" \
    --resolve "$USER_NAME.hub.example.org:443:$HUB2_ADDR" -H "Authorization: token $(cat "$TRIAL/alice-token")" \
    "https://$USER_NAME.hub.example.org/user/$USER_NAME/api/status")"
  hub_python "
import json, time
from hubclient import HubUser
browser = HubUser('https://hub.example.org', '$USER_NAME')  # her browser's cookies from before the backup
for cookie in json.load(open('$TRIAL/alice-cookies.json')):
    browser.web.cookies.set(cookie['name'], cookie['value'], domain=cookie['domain'], path=cookie['path'],
                            secure=cookie['secure'])
home = browser.web.get('https://hub.example.org/hub/home', allow_redirects=False)
print(f'[trial] restore: her login cookie from before the backup: /hub/home {home.status_code}'
      + (f' -> {home.headers.get(\"Location\")}' if home.is_redirect else ''))
assert home.status_code == 200
alice = HubUser('https://hub.example.org', '$USER_NAME').must_login('$USER_PASSWORD')
for _ in range(120):  # the restored hub's start-up check of her session (Slurm, then its address)
    server = alice.model().get('servers', {}).get('')
    if server and server.get('ready'):
        break
    time.sleep(1)
assert server and server.get('ready'), f'no ready session of $USER_NAME on the restored hub: {server}'
print(f'[trial] restore: the restored hub lists her session, ready, at {server[\"url\"]}')
# Opening JupyterLab takes the session's own call to the hub (OAuth): the session's HTTP client keeps a name's
# address up to 10 s (aiohttp's DNS cache), so right after the move it may still call the old machine (500)
started = time.monotonic()
for attempt in range(30):
    lab = alice.web.get(alice.url('/user/$USER_NAME/lab'))
    if lab.status_code == 200:
        break
    time.sleep(1)
print(f'[trial] restore: JupyterLab through hub2\'s proxy: {lab.status_code} (after {attempt} refusal(s), {time.monotonic() - started:.1f} s)')
assert lab.status_code == 200
said = alice.run_code('import os, socket; print(socket.gethostname(), os.environ[\"SLURM_JOB_ID\"], 6 * 7)').strip()
print('[trial] restore: kernel says: ' + said)
assert said == 'cn1 $job 42', said
"
  say "restore: squeue on login: job $job $(in_node login squeue -h -j "$job" -o '%T on %N, started %S')"
  in_node hub2 /opt/dsportal/env/bin/dsportal check | sed 's/^/[check hub2] /' || true
  TIMES[restore]=$(elapsed "$start")
  step_ports
}

print_times() {  # at the end, also of a failed run: what each step took
  local key
  for key in $(printf '%s\n' "${!TIMES[@]}" | sort); do say "time: $key ${TIMES[$key]} s"; done
}

# One trial script at a time on this host (down included: it removes the bridge both use)
if [ "${1:-all}" != shell ]; then
  exec 9> /run/dsportal-trial.lock
  flock -n 9 || { echo "[trial] another deploy-trial.sh runs on this host: one at a time" >&2; exit 1; }
fi
case "${1:-all}" in
  down) step_down ;;
  shell) in_node "${2:-login}" bash -l ;;
  all) started=$(now)
       trap print_times EXIT
       for step in systems boot munge slurm ldap portal check sessions upgrade ports backup restore; do
         step_start=$(now); "step_$step"; TIMES[step-$step]=$(elapsed "$step_start")
       done
       TIMES[all]=$(elapsed "$started") ;;
  *) trap print_times EXIT
     for step in "$@"; do step_start=$(now); "step_$step"; TIMES[step-$step]=$(elapsed "$step_start"); done ;;
esac
