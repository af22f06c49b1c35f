#!/usr/bin/env bash
# GeoMX's scripts/cpu/run_mixed_precision.sh, as one `geomx launch`: the demo job trains examples/cnn_mpq.py
# (GeoMX's Table 1: tensors below MXNET_KVSTORE_SIZE_LOWER_BOUND fp16 dense on LAN and WAN, larger ones fp32
# with Bi-Sparse on the WAN). The bound is 1000 here, as in GeoMX's scripts.
# Usage: bash scripts/run_mixed_precision.sh [python] [example args...]
set -euo pipefail
PYTHON=${1:-python}; shift || true
cd "$(dirname "$0")/.."
MXNET_KVSTORE_SIZE_LOWER_BOUND=${MXNET_KVSTORE_SIZE_LOWER_BOUND:-1000} \
  "$PYTHON" -m geomx.cli launch topologies/demo.yaml -- "$PYTHON" examples/cnn_mpq.py --threshold 0.01 "$@"
