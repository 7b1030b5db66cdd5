#!/usr/bin/env bash
# Builds dsportal's JupyterLab extension (labextension/, TypeScript) with JupyterLab's own builder
# (`jupyter-builder build`, the tool JupyterLab 4.6 itself uses) and installs the result into the
# session environment's share/jupyter/labextensions/dsportal-lab. npm packages come from the
# registry, pinned by labextension/package-lock.json. The build is cached by the hash of its sources
# and the JupyterLab version: a second run only copies.
set -euo pipefail
cd "$(dirname "$0")/.."
ENV=${1:-/opt/dsportal/env}
PREFIX=$(dirname "$ENV")
CACHE=${DSPORTAL_CACHE:-/var/cache/dsportal}/labextension
DEST=$ENV/share/jupyter/labextensions/dsportal-lab
say() { echo "[labextension] $*"; }

key=$( (cd labextension && cat package.json package-lock.json tsconfig.json src/*.ts style/*; \
        "$ENV/bin/python" -c 'import jupyterlab; print(jupyterlab.__version__)') | sha256sum | cut -c1-16)
if [ ! -f "$CACHE/$key/package.json" ]; then
  # The builder (rspack) needs Node.js >= 20.19; Debian bookworm ships 18: take one from npm.
  if ! node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 20 || (a === 20 && b >= 19) ? 0 : 1)' 2>/dev/null; then
    if [ ! -x "$PREFIX/node/node_modules/.bin/node" ]; then
      say "Node.js $(node --version 2>/dev/null || echo missing) is too old for the builder: node@22 from npm into $PREFIX/node"
      mkdir -p "$PREFIX/node"
      (cd "$PREFIX/node" && npm install --no-audit --no-fund --loglevel=error node@22)
    fi
    export PATH="$PREFIX/node/node_modules/.bin:$PATH"
  fi
  say "building with JupyterLab's builder (node $(node --version))"
  work=$CACHE/build
  mkdir -p "$work"
  # npm install (not ci): it keeps to the lock file, and tolerates the lock lacking optional
  # packages of other platforms (the native builder bindings), which npm ci refuses.
  rm -rf "$work/src" "$work/style" "$work/lib" "$work/build"
  cp -r labextension/package.json labextension/package-lock.json labextension/tsconfig.json labextension/src labextension/style "$work/"
  log=$work/build.log  # the builder's output, shown only when it fails
  (cd "$work" && npm install --no-audit --no-fund --loglevel=error && npx tsc && PATH="$ENV/bin:$PATH" jupyter-builder build .) \
    > "$log" 2>&1 || { tail -n 40 "$log"; echo "[labextension] build failed: see $log" >&2; exit 1; }
  rm -rf "$CACHE/$key.new"
  cp -r "$work/build/dsportal-lab" "$CACHE/$key.new"
  mv "$CACHE/$key.new" "$CACHE/$key"
fi
rm -rf "$DEST"
mkdir -p "$DEST"
cp -r "$CACHE/$key/." "$DEST/"
cp labextension/install.json "$DEST/"
chmod -R a+rX "$DEST"
say "installed $(basename "$(ls "$DEST"/static/remoteEntry.*.js)") into $DEST"
