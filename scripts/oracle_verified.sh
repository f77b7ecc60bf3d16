#!/usr/bin/env bash
# Prints the "verified releases" table of docs/oracle.md: for each release the simulator
# follows, the differential fuzz (2,000 random traces) and every shipped trace, run through that
# release's own allocator (allocbench fidelity --oracle --torch-version V) and the simulator.
# Usage: scripts/oracle_verified.sh [ALLOCBENCH] > table.md   (fetches each release once)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/allocbench}
traces=(workloads/captured/*.csv.gz tests/fixtures/*.csv.gz)
echo "| torch | fuzz cases agreeing (events; ending at an OOM) | shipped traces agreeing |"
echo "|---|---|---|"
for v in 2.9 2.10 2.11 2.12 2.13 2.14 2.15; do
  fuzz=$("$bin" fidelity --oracle --fuzz 2000 --torch-version "$v" --json - 2>/dev/null || true)
  line=$(python3 -c '
import json, sys
r = json.loads(sys.argv[1])
ok = r["cases"] - len(r["differences"])
print("%s | %s of %s (%s; %s)" % (r["torch_version"], f"{ok:,}", f"{r['"'"'cases'"'"']:,}", f"{r['"'"'events'"'"']:,}", f"{r['"'"'ooms'"'"']:,}"))' "$fuzz")
  agree=0
  for t in "${traces[@]}"; do
    if "$bin" fidelity "$t" --oracle --torch-version "$v" --json /dev/null >/dev/null 2>&1; then agree=$((agree + 1)); fi
  done
  echo "| $line | $agree of ${#traces[@]} |"
done
