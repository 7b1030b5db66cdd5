#!/usr/bin/env bash
# Builds the Horovod wheel used by multi-node jobs (and installs it with PyTorch into the
# session environment). The wheel is cached in $WHEELS, so later runs only reinstall it; the first
# build takes 4-12 minutes on 2 cores.
#
# Recipe (seen working on Debian bookworm): Horovod 0.28.1 from its sdist, against the CPU
# build of torch 2.13.0, C++17 instead of its C++14, CMAKE_POLICY_VERSION_MINIMUM=3.5,
# Debian's cmake, Open MPI + Gloo, no build isolation.
set -euo pipefail
ENV=${1:-/opt/dsportal/env}
WHEELS=${DSPORTAL_WHEELS:-/var/cache/dsportal/wheels}
HOROVOD=0.28.1
TORCH=2.13.0
say() { echo "[horovod] $*"; }
# Without pip's one warning per package where a pip.conf names a local index folder that does not exist.
exec 2> >(grep -v --line-buffered "is ignored: it is neither a file nor a directory" >&2)

mkdir -p "$WHEELS"
chmod 755 "$(dirname "$WHEELS")" "$WHEELS"
pip=("$ENV/bin/pip" install -q --disable-pip-version-check)

if ! "$ENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH')" 2>/dev/null; then
  say "torch==$TORCH"
  "${pip[@]}" "torch==$TORCH"
fi
# torch's own wheel, kept for building container images without a second download.
if ! ls "$WHEELS"/torch-$TORCH*.whl >/dev/null 2>&1; then
  "$ENV/bin/pip" download -q --no-deps -d "$WHEELS" "torch==$TORCH"
fi

wheel=$(ls "$WHEELS"/horovod-$HOROVOD-*.whl 2>/dev/null | head -1 || true)
if [ -z "$wheel" ]; then
  say "building Horovod $HOROVOD from its sdist (4-12 minutes on 2 cores)"
  "${pip[@]}" psutil cloudpickle pyyaml packaging "setuptools>=68" wheel
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  "$ENV/bin/pip" download -q --no-deps --no-binary :all: -d "$work" "horovod==$HOROVOD"
  tar -xzf "$work"/horovod-$HOROVOD.tar.gz -C "$work"
  src="$work/horovod-$HOROVOD"
  sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
  (
    cd "$src"
    export PATH="$ENV/bin:/usr/bin:/bin" CMAKE_POLICY_VERSION_MINIMUM=3.5
    export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1
    export HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_GPU_OPERATIONS=
    export MAKEFLAGS="-j$(nproc)"
    "$ENV/bin/pip" wheel -q --no-deps --no-build-isolation -w "$WHEELS" .
  )
  wheel=$(ls "$WHEELS"/horovod-$HOROVOD-*.whl | head -1)
  say "built $(basename "$wheel")"
fi
chmod a+r "$WHEELS"/*.whl

if ! "$ENV/bin/python" -c "import horovod.torch" 2>/dev/null; then
  say "installing $(basename "$wheel")"
  "${pip[@]}" --no-deps "$wheel"
  "${pip[@]}" psutil cloudpickle pyyaml packaging
fi
"$ENV/bin/python" -c "import horovod.torch as hvd; assert hvd.mpi_built() and hvd.gloo_built(), 'Horovod lacks MPI or Gloo'"
say "ready: $(basename "$wheel")"
