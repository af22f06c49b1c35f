#!/usr/bin/env bash
# GeoMX's scripts/cpu/run_vanilla_hips.sh, ported: every process started by hand with GeoMX's DMLC_*
# variables (no topology file, no emulated WAN). `geomx launch` does all of this for you; this script
# shows that GeoMX-style launches work. Our one addition: GEOMX_WORKER_OFFSET gives dc1's workers their
# data shards (without a topology file no process knows the other parties' sizes).
# Usage: bash scripts/run_vanilla_hips.sh [python] [epochs]   (epochs: 4 unless given)
set -euo pipefail
PYTHON=${1:-python}
EPOCHS=${2:-4}
cd "$(dirname "$0")/.."
free_port() { "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
GLOBAL_PORT=$(free_port); DC0_PORT=$(free_port); DC1_PORT=$(free_port)
COMMON="DMLC_PS_GLOBAL_ROOT_URI=127.0.0.1 DMLC_PS_GLOBAL_ROOT_PORT=$GLOBAL_PORT DMLC_NUM_GLOBAL_SERVER=1 \
DMLC_NUM_GLOBAL_WORKER=2 DMLC_NUM_ALL_WORKER=4 DMLC_NUM_WORKER=2 DMLC_NUM_SERVER=1"
DC0="DMLC_PS_ROOT_URI=127.0.0.1 DMLC_PS_ROOT_PORT=$DC0_PORT"
DC1="DMLC_PS_ROOT_URI=127.0.0.1 DMLC_PS_ROOT_PORT=$DC1_PORT GEOMX_WORKER_OFFSET=2"  # data shards 2, 3
NODE="$PYTHON -m geomx.node"
TRAIN="$PYTHON examples/cnn.py --epochs $EPOCHS"
pids=()
start() { env $@ & pids+=($!); }
trap 'kill ${pids[@]} 2>/dev/null || true' EXIT
# central party: global scheduler, global server, local scheduler, local server, master worker + 1 worker
start $COMMON DMLC_ROLE_GLOBAL=global_scheduler $NODE
start $COMMON $DC0 DMLC_ROLE=server DMLC_ROLE_GLOBAL=global_server $NODE
start $COMMON $DC0 DMLC_ROLE=scheduler $NODE
start $COMMON $DC0 DMLC_ROLE=server $NODE
start $COMMON $DC0 DMLC_ROLE=worker DMLC_ROLE_MASTER_WORKER=1 $TRAIN
start $COMMON $DC0 DMLC_ROLE=worker $TRAIN
# second party
start $COMMON $DC1 DMLC_ROLE=scheduler $NODE
start $COMMON $DC1 DMLC_ROLE=server $NODE
start $COMMON $DC1 DMLC_ROLE=worker $TRAIN
start $COMMON $DC1 DMLC_ROLE=worker $TRAIN
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
trap - EXIT
exit $status
