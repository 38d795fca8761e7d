#!/usr/bin/env bash
# LOAD-01 A/B: two builds of the archive (two source trees) taking turns, round by round
# (A B, then B A), DCMTK storescu as the generator, Orthanc in the same rounds (ORTHANC= to
# leave it out). Each build is served from its own tree (PYTHONPATH), one worker, $DIMSE_PROCESSES (default 2) listener
# processes, 128 associations per peer; results under $OUT (default /tmp/load01_ab).
# Each invocation removes what it stored when it ends, just before the next one's step: on
# ext4 without a journal that costs the next step file-creation CPU (docs/load-testing.md);
# the rounds alternate the order (A B, then B A) so that it falls on both builds alike.
#
#   loadtests/load01_ab.sh BASE_TREE OURS_TREE     # env: STEPS="4 16 64" ROUNDS="0 1" IMAGES=300 DIMSE_PROCESSES=2
set -u
[ $# = 2 ] || { echo "usage: $0 BASE_TREE OURS_TREE" >&2; exit 2; }
BASE=$(cd "$1" && pwd); OURS=$(cd "$2" && pwd)
OUT=${OUT:-/tmp/load01_ab}; mkdir -p "$OUT"
PY=${PYTHON:-python}
free_port() { $PY -c "import socket;s=socket.socket();s.bind(('127.0.0.1',0));print(s.getsockname()[1])"; }
start() { # name src
  local name=$1 src=$2
  local d=$OUT/$name-data; rm -rf "$d"; mkdir -p "$d"
  local hp dp; hp=$(free_port); dp=$(free_port)
  (cd "$src"; PYTHONPATH=$src setsid $PY -c "from dicomweb_server.cli import main; main()" serve --data-dir "$d" \
     --port "$hp" --dimse-port "$dp" --workers 1 --dimse-processes "${DIMSE_PROCESSES:-2}" --dimse-max-associations 128 \
     --dimse-max-associations-per-peer 128 > "$OUT/$name.log" 2>&1 & echo $! > "$OUT/$name.pid")
  echo "$hp $dp $d"
}
read -r BH BD BDIR < <(start base "$BASE")
read -r OH OD ODIR < <(start ours "$OURS")
sleep 8
run() { # name hp dp dir n round
  (cd "$OURS" && PYTHONPATH=$OURS $PY -m loadtests.load01 --port "$3" --http "http://127.0.0.1:$2" --data-dir "$4" \
     --associations "$5" --images "${IMAGES:-300}" --latency 0 --generator storescu --output "$OUT/$1-$5-$6" \
     > "$OUT/$1-$5-$6.txt" 2>&1)
  echo "$1 n=$5 round=$6 load=$(cut -d' ' -f1-3 /proc/loadavg)"; grep -E "^\|\s+(ours|orthanc)" "$OUT/$1-$5-$6/results.md" | tail -1
}
orthanc() { # n round
  (cd "$OURS" && PYTHONPATH=$OURS $PY -m loadtests.load01 --no-ours --peer orthanc \
     --associations "$1" --images "${IMAGES:-300}" --latency 0 --generator storescu --output "$OUT/orthanc-$1-$2" \
     > "$OUT/orthanc-$1-$2.txt" 2>&1)
  echo "orthanc n=$1 round=$2 load=$(cut -d' ' -f1-3 /proc/loadavg)"; grep -E "^\|\s+orthanc" "$OUT/orthanc-$1-$2/results.md" | tail -1
}
for r in ${ROUNDS:-0 1}; do
  for n in ${STEPS:-4 16 64}; do
    if [ $((r % 2)) = 0 ]; then
      run base "$BH" "$BD" "$BDIR" "$n" "$r"; run ours "$OH" "$OD" "$ODIR" "$n" "$r"; [ -n "${ORTHANC-1}" ] && orthanc "$n" "$r"
    else
      [ -n "${ORTHANC-1}" ] && orthanc "$n" "$r"; run ours "$OH" "$OD" "$ODIR" "$n" "$r"; run base "$BH" "$BD" "$BDIR" "$n" "$r"
    fi
  done
done
kill -- -"$(cat "$OUT/base.pid")" -"$(cat "$OUT/ours.pid")"
