# Sourced by the GPU checks that run containers (apptainer.sh, scaling.sh) on the GPU machine, as
# root, with $R, $C, $IMG, $MINI and $VENV set: Apptainer from the carried .debs, and an image made of
# the machine's own userland (no registry can be reached from there).

# Apptainer 1.4.5 as `make deps` installs it (scripts/install-apptainer.sh, relocated, no setuid),
# with the SIF tools the machine lacks.
apptainer_install() {
  command -v dpkg-deb >/dev/null || { echo "no dpkg-deb on this machine: cannot unpack the debs"; exit 1; }
  mkdir -p /opt/tools/private
  dpkg-deb -x $C/tools/patchelf_*.deb /opt/tools/patchelf && export PATH=/opt/tools/patchelf/usr/bin:$PATH
  patchelf --version
  # The SIF tools (mksquashfs to build, squashfuse to mount as a user) where this machine lacks them;
  # their libraries that the machine lacks go into a private folder on the loader's path (as slurm-up.sh).
  for deb in $C/tools/*.deb; do case $deb in *patchelf*) ;; *) dpkg-deb -x $deb /opt/tools/sif;; esac; done
  for so in /opt/tools/sif/usr/lib/x86_64-linux-gnu/*.so.* /opt/tools/sif/lib/x86_64-linux-gnu/*.so.*; do
    [ -e "$so" ] || continue; ldconfig -p | grep -qP "^\t$(basename $so) " || cp -a $so /opt/tools/private/
  done
  echo /opt/tools/private > /etc/ld.so.conf.d/zz-dsportal-tools.conf; ldconfig
  for tool in mksquashfs squashfuse squashfuse_ll fusermount3; do
    carried=$(ls /opt/tools/sif/usr/bin/$tool /opt/tools/sif/bin/$tool 2>/dev/null | head -n 1)
    command -v $tool >/dev/null || { [ -n "$carried" ] && ln -sf $carried /usr/local/bin/$tool; }
    echo "$tool: $(command -v $tool) ($($tool --version 2>&1 | head -n 1 | cut -c1-60))"
  done
  t=$SECONDS
  DSPORTAL_APPTAINER_CACHE=$C/apptainer bash $R/scripts/install-apptainer.sh || { echo "install-apptainer.sh failed"; exit 1; }
  echo "installed in $((SECONDS - t)) s: $(apptainer --version) at $(readlink -f $(command -v apptainer))"
  ls -l /opt/apptainer/usr/lib/x86_64-linux-gnu/apptainer/bin/starter

}

# $IMG: the machine's /usr (less the driver's /usr/local/nvidia, which --nv brings in), /etc and
# the venv as hard links, made a sandbox. `host_image quick` skips `apptainer build --sandbox` (a
# copy of every file, about 50 s) and runs the root folder itself.
host_image() {
  chmod -R a+rX $VENV 2>/dev/null   # as isolation.sh: alice's python
  mkdir -p /opt/img $IMG.root && chmod 755 /opt/img
  link_copy() {  # $1: a path of the host -> the same path in the root folder; hard links on one file system
    mkdir -p "$IMG.root$(dirname "$1")"
    if [ "$(stat -c %d "$1")" = "$(stat -c %d /opt/img)" ]; then cp -al "$1" "$IMG.root$1" 2>/opt/img/cp.err || head -n 3 /opt/img/cp.err
    else echo "  $1 is on another file system: copied"; cp -a "$1" "$IMG.root$1"; fi
  }
  t=$SECONDS
  for top in /bin /sbin /lib /lib32 /lib64 /libx32 /etc $VENV; do [ -e $top ] || [ -L $top ] && link_copy $top; done
  for d in /usr/*; do [ "$d" = /usr/local ] || link_copy $d; done
  for d in /usr/local/*; do [ "$d" = /usr/local/nvidia ] || link_copy $d; done
  base=$(readlink -f $VENV/bin/python3)   # the venv's interpreter, where it lives outside /usr
  case $base in /usr/*) ;; *) link_copy "$(dirname "$(dirname "$base")")";; esac
  mkdir -p $IMG.root/{proc,sys,dev,tmp,home,root,run,mnt,var/tmp} && chmod 1777 $IMG.root/tmp $IMG.root/var/tmp
  echo "root folder in $((SECONDS - t)) s: $(find $IMG.root -xdev | wc -l) entries; /usr/local/nvidia in it: $(ls -d $IMG.root/usr/local/nvidia 2>/dev/null || echo no)"
  # A small root folder (dash, coreutils, their libraries): a quick sandbox, and the SIF of step 6.
  mini_root() {
    mkdir -p $1/usr/bin $1/etc $1/{proc,sys,dev,tmp,home,root} && ln -sfn usr/bin $1/bin
    cp -L /etc/os-release $1/etc/
    echo 'root:x:0:0:root:/root:/bin/sh' > $1/etc/passwd; echo 'root:x:0:' > $1/etc/group  # Apptainer adds the user
    for b in /bin/sh /usr/bin/cat /usr/bin/true /usr/bin/ls /usr/bin/head /usr/bin/env /usr/bin/id; do cp -L $b $1/usr/bin/; done
    for so in $(ldd /bin/sh /usr/bin/cat /usr/bin/ls /usr/bin/id $(command -v nvidia-smi) | grep -o '/[^ ]*\.so[^ ]*' | grep -v -e nvidia -e cuda | sort -u); do
      mkdir -p $1$(dirname $so) && cp -L $so $1$so
    done
  }
  mini_root $MINI.root
  t=$SECONDS; apptainer build --force --sandbox $MINI $MINI.root 2>&1 | tail -n 2
  echo "small sandbox ($(du -sh $MINI | cut -f1)): apptainer build --sandbox in $((SECONDS - t)) s; $(ls -A $MINI | tr '\n' ' ')"
  # The big one: apptainer build --sandbox copies every file (no hard links): where the disk holds a
  # second copy, 90 s at most; else the small sandbox's /.singularity.d (its environment and action
  # scripts) goes into the root folder.
  export APPTAINER_TMPDIR=/opt/img/tmp; mkdir -p $APPTAINER_TMPDIR
  used=$(df --output=used -BG / | tail -n 1 | tr -dc 0-9); free=$(df --output=avail -BG /opt/img | tail -n 1 | tr -dc 0-9)
  echo "disk: ${used} GiB used on /, ${free} GiB free"
  t=$SECONDS
  if [ "${1:-}" != quick ] && [ $free -gt $((used + 8)) ] && timeout 90 apptainer build --force --sandbox $IMG $IMG.root > /opt/img/build.log 2>&1; then
    SANDBOX_HOW="apptainer build --sandbox of the root folder, $((SECONDS - t)) s"; rm -rf $IMG.root
  else
    SANDBOX_HOW="the root folder itself, /.singularity.d of the small sandbox copied in (${1:-not built: no build in 90 s or no room for a copy, rc $?, ${free} GiB free})"
    tail -n 3 /opt/img/build.log 2>/dev/null; rm -rf $IMG $APPTAINER_TMPDIR/*
    mv $IMG.root $IMG
    for f in .singularity.d environment singularity .exec .run .shell .test; do [ -e $MINI/$f ] || [ -L $MINI/$f ] && cp -a $MINI/$f $IMG/; done
  fi
  unset APPTAINER_TMPDIR   # root's folder: not for alice's and bob's jobs, which inherit this environment
  echo "image: $SANDBOX_HOW; du -sh (files counted once): $(du -sh $IMG 2>/dev/null | cut -f1)"
}
