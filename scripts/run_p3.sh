#!/usr/bin/env bash
# GeoMX's scripts/cpu/run_p3.sh, as one `geomx launch`: ENABLE_P3=1 on every process (50K-element slices,
# shallow layers first in every send queue) for the PyTorch wrapper's loop, examples/cnn_torch.py, whose
# forward pre-hooks let the next forward start before the deepest layers' updates arrive. The kvstore loop
# (examples/cnn.py) also runs with ENABLE_P3=1 but pulls every key before its next forward: it gets the
# slicing and the order, not the overlap. GEOMX_P3_SLICE_ELEMS changes the slice size.
# Usage: bash scripts/run_p3.sh [python] [example args...]
set -euo pipefail
PYTHON=${1:-python}; shift || true
cd "$(dirname "$0")/.."
ENABLE_P3=1 "$PYTHON" -m geomx.cli launch topologies/demo.yaml -- "$PYTHON" examples/cnn_torch.py "$@"
