#!/usr/bin/env bash
# GeoMX's scripts/cpu/run_fp16.sh, as one `geomx launch`: the demo job trains examples/cnn_fp16.py, the
# seeds' loop (fp16 buffers on the servers, push grad.half(), pull, cast back): fp16 on the LAN and the WAN.
# Without touching the loop: `GEOMX_FP16=1 geomx launch topologies/demo.yaml -- python examples/cnn.py`.
# Usage: bash scripts/run_fp16.sh [python] [example args...]
set -euo pipefail
PYTHON=${1:-python}; shift || true
cd "$(dirname "$0")/.."
"$PYTHON" -m geomx.cli launch topologies/demo.yaml -- "$PYTHON" examples/cnn_fp16.py "$@"
