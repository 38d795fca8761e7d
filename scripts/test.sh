#!/usr/bin/env bash
# Install everything the tests need into .venv and run them (the README's test command).
# The viewer test drives Debian's Chromium (never a downloaded browser), the client's peer
# suite (tests/peers) Debian's Orthanc with its DICOMweb plugin and nginx, the DIMSE walk-through
# (tests/dimse/test_dcmtk.py) DCMTK's storescu/findscu/getscu/movescu/storescp: installed here with
# apt-get when missing (as root, or with sudo). The PostgreSQL index's tests start Debian's
# PostgreSQL server themselves (tests/postgres.py; DICOMWEB_POSTGRES=skip skips them). The docs extra
# (mkdocs) lets tests/docs/ build the documentation site. wrk runs one short step of the capacity
# runner (tests/loadtests/test_short_run.py).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive  # CI has no terminal: apt must never ask
cd "$(dirname "$0")/.."
ORTHANC_DICOMWEB=/usr/share/orthanc/plugins/libOrthancDicomWeb.so
if ! command -v chromium >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1 \
   || [ ! -x /usr/sbin/Orthanc ] || [ ! -e "$ORTHANC_DICOMWEB" ] || ! [ -x /usr/sbin/nginx ] \
   || ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || ! [ -x /usr/bin/storescu ] \
   || ! [ -x /usr/bin/wrk ]; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  command -v chromium >/dev/null 2>&1 || $SUDO apt-get install -y -qq chromium
  command -v npm >/dev/null 2>&1 || $SUDO apt-get install -y -qq npm
  { [ -x /usr/sbin/Orthanc ] && [ -e "$ORTHANC_DICOMWEB" ]; } || $SUDO apt-get install -y -qq orthanc orthanc-dicomweb
  [ -x /usr/sbin/nginx ] || $SUDO apt-get install -y -qq nginx-light
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || $SUDO apt-get install -y -qq postgresql
  [ -x /usr/bin/storescu ] || $SUDO apt-get install -y -qq dcmtk
  [ -x /usr/bin/wrk ] || $SUDO apt-get install -y -qq wrk
fi
python3 -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
pip install --quiet -e '.[test,interop,load,docs]'
# Every core for the tests that may share the machine (pytest-xdist, whole files per
# worker), then the serial ones alone (tests/conftest.py SERIAL: SIGKILL, timing, browser).
# Exit status 5 (no test selected, e.g. a path of one kind only) is not a failure.
set +e
python -m pytest -q --durations=15 -n "${TEST_WORKERS:-auto}" --dist loadfile -m "not serial" "$@"; parallel=$?
python -m pytest -q --durations=15 -m serial "$@"; serial=$?
set -e
for rc in "$parallel" "$serial"; do
  [ "$rc" = 0 ] || [ "$rc" = 5 ] || exit "$rc"
done
