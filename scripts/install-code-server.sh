#!/usr/bin/env bash
# VS Code in the browser for sessions (portal/session/tool/vscode.py): code-server from npm, at the version
# and with the hashes of scripts/code-server/package-lock.json, into $PREFIX/code-server (read-only
# to users). Its install compiles native modules (node-pty for its terminals, kerberos, argon2) with
# Debian's headers, and its ripgrep (search in files) is Debian's: its own installer would download
# one from GitHub, which these machines cannot reach. npm's install scripts run as nobody in a
# folder of their own, never as root, in a process namespace of their own, so nothing of theirs
# outlives the build; root then copies the result, as root's files, into a folder only root can
# enter until it is complete, and moves it in place. Again only when the lock changes.
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${DSPORTAL_PREFIX:-/opt/dsportal}
DEST=$PREFIX/code-server
say() { echo "[code-server] $*"; }

want=$(cat scripts/code-server/package.json scripts/code-server/package-lock.json | sha256sum | cut -c1-16)
if [ -x "$DEST/bin/code-server" ] && [ "$(cat "$DEST/.lock" 2>/dev/null)" = "$want" ]; then
  say "ready: $DEST/bin/code-server"
  exit 0
fi
# code-server 4.100 runs on Node.js 20 only (its installer refuses any other): without it, sessions
# offer the rest (the launcher shows no VS Code tile), and this says why.
node_major=$(node --version 2>/dev/null | sed -n 's/^v\([0-9]*\)\..*/\1/p')
if [ "$node_major" != 20 ]; then
  echo "[code-server] not installed: code-server 4.100 needs Node.js 20, this machine has ${node_major:+v}${node_major:-none}." \
       "Sessions offer R, git and the terminal; VS Code once Node.js 20 is installed (then: bash scripts/install-code-server.sh)" >&2
  exit 0
fi
packages=()
for p in build-essential pkg-config python3 libkrb5-dev libx11-dev libxkbfile-dev libsecret-1-dev ripgrep; do
  dpkg -s "$p" >/dev/null 2>&1 || packages+=("$p")
done
if [ ${#packages[@]} -gt 0 ]; then
  say "Debian packages: ${packages[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
fi

work=$(mktemp -d /tmp/dsportal-code-server.XXXXXX)
trap '[ -n "${KEEP_WORK:-}" ] || rm -rf "$work"' EXIT
chown nobody: "$work"
cp scripts/code-server/package.json scripts/code-server/package-lock.json "$work/"
# @vscode/ripgrep takes its download from this cache when present: Debian's rg, packed as it expects.
rg_version=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["packages"].get(
  "node_modules/@vscode/ripgrep", {}).get("version", "1.15.11"))' "$work/package-lock.json")
mkdir -p "$work/tmp/vscode-ripgrep-cache-$rg_version" "$work/rg"
cp /usr/bin/rg "$work/rg/rg"
for tag in v13.0.0-10 v13.0.0-4; do
  tar czf "$work/tmp/vscode-ripgrep-cache-$rg_version/ripgrep-$tag-x86_64-unknown-linux-musl.tar.gz" -C "$work/rg" rg
done
# code-server's own install (lib/vscode) pins @vscode/ripgrep itself: the cache for that version too.
for v in 1.15.9 1.15.10 1.15.11 1.15.12 1.15.13 1.15.14; do
  [ -d "$work/tmp/vscode-ripgrep-cache-$v" ] || cp -r "$work/tmp/vscode-ripgrep-cache-$rg_version" "$work/tmp/vscode-ripgrep-cache-$v"
done
chown -R nobody: "$work"
say "installing code-server $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["dependencies"]["code-server"])' \
  scripts/code-server/package.json) (npm ci, native modules built here)"
log=$work/npm.log
if ! unshare --pid --fork --kill-child runuser -u nobody -- env -i PATH=/usr/bin:/bin HOME="$work" TMPDIR="$work/tmp" npm_config_cache="$work/.npm" \
    npm_config_yes=true npm_config_unsafe_perm=true npm_config_nodedir=/usr \
    bash -c 'cd "$1" && npm ci --no-audit --no-fund --loglevel=error' _ "$work" >"$log" 2>&1; then
  tail -20 "$log" >&2
  echo "[code-server] npm ci failed (log above): VS Code is not offered until it is installed" >&2
  exit 1
fi
rm -rf "$DEST.new"
(umask 077 && mkdir -p "$DEST.new/bin")   # root's alone while it fills
cp -R --no-preserve=ownership "$work/node_modules" "$DEST.new/"
ln -s ../node_modules/code-server/out/node/entry.js "$DEST.new/bin/code-server"
echo "$want" > "$DEST.new/.lock"
chmod -R u+w,go-w,a+rX,ug-s "$DEST.new"
rm -rf "$DEST.old"; [ -e "$DEST" ] && mv "$DEST" "$DEST.old"
mv "$DEST.new" "$DEST" && rm -rf "$DEST.old"
home=$(mktemp -d)   # root's: code-server writes a config file into its home
say "ready: $DEST/bin/code-server ($(HOME=$home "$DEST/bin/code-server" --version 2>/dev/null | tail -1 | cut -d' ' -f1))"
rm -rf "$home"
