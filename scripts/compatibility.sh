#!/usr/bin/env bash
# The whole cluster suite (make test) on one Slurm release, written down as that release's row of
# docs/reference/compatibility.md: the release, what built it, the Python, the date, the commit, and what
# passed and failed. A release whose whole suite passed is one `dsportal check` names without a warning
# (portal/slurm/slurmparse.py's TESTED_RELEASES, which this keeps to the table); one that failed loses it.
#
#   scripts/compatibility.sh 22.05      # Debian's own Slurm (bookworm: 22.05)
#   scripts/compatibility.sh 24.11      # scripts/build-slurm.sh's build, the demo configless
#
# Switching releases starts the demo's Slurm state afresh (democluster: switch_release), and the demo is
# left running on the release tried: `make demo` brings back Debian's. The run's whole output is kept in
# $LOGS (about 50 min on 2 cores). Extra pytest arguments: PYTEST_ARGS, as for make test: such a partial run, or
# one that never reached pytest's summary, is said but not written down.
set -uo pipefail
release=${1:?usage: compatibility.sh RELEASE (22.05: the Debian bookworm package; 24.11, 26.05)}
cd "$(dirname "$0")/.."
LOGS=${DSPORTAL_COMPAT_LOGS:-/var/log/dsportal-compatibility}
mkdir -p "$LOGS"
stamp=$(date -u +%Y-%m-%d)
log=$LOGS/slurm-$release-$stamp-$(date -u +%H%M%S).log
commit=$(git rev-parse --short HEAD)
[ -z "$(git status --porcelain --untracked-files=no)" ] || commit="$commit+changes"
echo "[compatibility] make test SLURM=$release at $commit: $log"
start=$(date +%s)
make test SLURM="$release" > "$log" 2>&1
status=$?
seconds=$(( $(date +%s) - start ))

# What built the release, and its own version (not `sinfo --version`: without a slurm.conf here 22.05's sinfo
# looks for the cluster): the build's stamp, or Debian's package.
if [ "$release" != 22.05 ]; then
  stamp_file=/opt/dsportal-slurm/$release/.dsportal-slurm
  built="$(sed -n 's/^source=//p' "$stamp_file") (scripts/build-slurm.sh)"
  version=$(sed -n 's/^version=//p' "$stamp_file")
else
  built="Debian $(. /etc/os-release && echo "$VERSION_CODENAME") \`slurm-wlm\` $(dpkg-query -W -f='${Version}' slurm-client)"
  version=$(dpkg-query -W -f='${Version}' slurm-client | sed 's/-[^-]*$//; s/^[0-9]*://')
fi
[[ "$version" =~ ^[0-9]{2}\.[0-9]{2}\.[0-9]+$ ]] || { echo "[compatibility] no version of Slurm $release found" >&2; exit 1; }
python=$(/opt/dsportal/env/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
/opt/dsportal/env/bin/python - "$version" "$built" "$python" "$stamp" "$commit" "$seconds" "$status" "$log" \
  "${PYTEST_ARGS:-}" <<'EOF'
import re
import sys
from pathlib import Path

version, built, python, date, commit, seconds, status, log, pytest_args = sys.argv[1:]
text = Path(log).read_text(errors="replace")
# pytest's last line: "===== 612 passed, 3 failed, 1 skipped, 2 warnings in 2941.21s (0:49:01) ====="
summary = next((line for line in reversed(text.splitlines()) if re.fullmatch(r"=+ .* in [0-9.]+s( \(.*\))? =+", line)),
               "")
counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?)", summary)}
failed = sorted({m for m in re.findall(r"^(?:FAILED|ERROR) (tests/\S+?)(?: - |$)", text, re.M)})
minutes = f"{int(seconds) // 60} min {int(seconds) % 60} s"
passed, bad = counts.get("passed", 0), counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
skipped = f", {counts['skipped']} skipped" if counts.get("skipped") else ""
if status == "0" and passed and not bad:
    result = f"whole suite passed: {passed} tests{skipped} in {minutes}"
else:
    result = f"{passed} passed, {bad} failed{skipped} in {minutes}" + (": " + ", ".join(failed) if failed else "")
row = f"| {version} | {built} | {python} | {date} | {commit} | {result} |"
line = ".".join(version.split(".")[:2])
if not summary or pytest_args:
    why = f"make test exited {status} before pytest's summary" if not summary else f"PYTEST_ARGS={pytest_args}"
    print(f"[compatibility] not written down ({why}; log {log}): {row}")
    sys.exit(0)

table = Path("docs/reference/compatibility.md")
lines = table.read_text().splitlines()
at = [i for i, existing in enumerate(lines) if re.match(rf"\| {re.escape(line)}\.\d+ \|", existing)]
if at:
    lines[at[0]] = row
else:
    last = max(i for i, existing in enumerate(lines) if re.match(r"\| \d{2}\.\d{2}\.\d+ \|", existing))
    lines.insert(last + 1, row)
table.write_text("\n".join(lines) + "\n")

# TESTED_RELEASES: the releases whose row says the whole suite passed, with that run's date.
code = Path("portal/slurm/slurmparse.py")
source = code.read_text()
tested = dict(re.findall(r'"(\d{2}\.\d{2})": "([0-9-]+)"', re.search(r"TESTED_RELEASES = \{[^}]*\}", source).group()))
if result.startswith("whole suite passed"):
    tested[line] = date
else:
    tested.pop(line, None)
body = ", ".join(f'"{k}": "{v}"' for k, v in sorted(tested.items()))
code.write_text(re.sub(r"TESTED_RELEASES = \{[^}]*\}", f"TESTED_RELEASES = {{{body}}}", source, count=1))
print(f"[compatibility] {row}")
EOF
exit $status
