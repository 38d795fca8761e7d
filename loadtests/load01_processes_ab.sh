#!/usr/bin/env bash
# LOAD-01 with 2 and with 4 DIMSE listener processes (--dimse-processes), alternating
# (2 4 4 2 2 4): a fresh archive from this tree per run, its data in a new folder under
# $ROOT (default /work: not a churned /tmp, see docs/load-testing.md), removed after the run.
#
#   loadtests/load01_processes_ab.sh            # env: STEPS=64 IMAGES=1500 ROOT=/work
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD
ROOT=${ROOT:-/work}
one() { # tag processes
  local B=$ROOT/bench-dp-$1; rm -rf "$B"; mkdir -p "$B"; export TMPDIR=$B
  (DICOMWEB_DIMSE_MAX_ASSOCIATIONS_PER_PEER=64 setsid python -c "from dicomweb_server.cli import main; main()" \
     serve --data-dir "$B/d" --port 8183 --dimse-port 11183 --workers 1 --dimse-processes "$2" > "$B/log" 2>&1 &
   echo $! > "$B/pid")
  for _ in $(seq 60); do curl -sf http://127.0.0.1:8183/ >/dev/null && break; sleep 1; done; sleep 2
  python -m loadtests.load01 --port 11183 --http http://127.0.0.1:8183 --data-dir "$B/d" --associations "${STEPS:-64}" \
    --images "${IMAGES:-1500}" --generator storescu --latency 0 --output "$B/out" > /dev/null 2>&1
  echo "$1 processes=$2 load=$(cut -d' ' -f1 /proc/loadavg)"; grep -E '^\|\s+ours' "$B/out/results.md" | cut -d'|' -f3,5,7,9,14
  kill -- -"$(cat "$B/pid")"; sleep 3; rm -rf "$B"; sleep 10
}
one a1 2; one b1 4; one b2 4; one a2 2; one a3 2; one b3 4
