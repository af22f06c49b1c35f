# Sourced by the device scripts (scripts/device_lan*.sh): OUT, and geomx importable from this checkout, with pyzmq
# (and any other missing package) from the wheels in .whl/ where the machine has none.
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD/src
else
  export PYTHONPATH=$PWD/src
fi
export PYTHONUNBUFFERED=1
