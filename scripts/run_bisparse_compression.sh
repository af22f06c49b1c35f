#!/usr/bin/env bash
# GeoMX's scripts/cpu/run_bisparse_compression.sh, as one `geomx launch`: the demo job (2 parties x 2
# workers, emulated 100 Mbit/s WAN) trains examples/cnn_bsc.py with Bi-Sparse on the WAN (top 1% both ways).
# Like GeoMX's scripts it sets MXNET_KVSTORE_SIZE_LOWER_BOUND=1000 (the demo CNN's tensors are all smaller
# than the 200000 default). Extra arguments go to the example, e.g. --threshold 0.001 --epochs 24.
# Usage: bash scripts/run_bisparse_compression.sh [python] [example args...]
set -euo pipefail
PYTHON=${1:-python}; shift || true
cd "$(dirname "$0")/.."
MXNET_KVSTORE_SIZE_LOWER_BOUND=${MXNET_KVSTORE_SIZE_LOWER_BOUND:-1000} \
  "$PYTHON" -m geomx.cli launch topologies/demo.yaml -- "$PYTHON" examples/cnn_bsc.py --type bsc \
  --threshold 0.01 --size-lower-bound "${MXNET_KVSTORE_SIZE_LOWER_BOUND:-1000}" "$@"
