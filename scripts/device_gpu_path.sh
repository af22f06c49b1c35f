#!/usr/bin/env bash
# The GPU path of issue 47 on one GPU machine, in one go: the CUDA tests (FSA's pinned chunks; HFA's round machine
# through the CUDA mirror, blocking and streaming, whole and FSDP2), then the real 85M model (forward, backward,
# AdamW on the GPU) with 2 parties x 2 ranks sharing it: plain (no sync) against streaming + int8 at 1 Gbit/s 25 ms,
# H = 100, the stand-in's grid rows on the same machine through the CPU and the staged path beside it.
# Writes its logs and JSON under OUT (default ./device-out). Tried on the CPU first (the tests skip there):
#   bash scripts/device_gpu_path.sh
source "$(dirname "$0")/device_env.sh"
nvidia-smi -L 2>/dev/null; python3 -c 'import torch, zmq; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "zmq", zmq.__version__)'
start=$SECONDS
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/unit/test_collective_host.py tests/unit/test_hfa_machine.py \
  tests/integration/test_collective_cuda.py 2>&1 | tee "$OUT/tests.log" | tail -15
echo "cuda tests: $((SECONDS - start)) s"; start=$SECONDS
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  timeout 420 python3 -m geomx.bench.scale --configs streaming_int8 --rates 1Gbit --h 100 --rounds 2 --fsa-rates \
    --device cuda --out "$OUT/real" 2>&1 | tee "$OUT/scale_cuda.log" | grep "^\[scale\]"
  echo "real 85M on cuda: $((SECONDS - start)) s"; start=$SECONDS
fi
for path in cpu staged; do
  timeout 300 python3 -m geomx.bench.scale --configs streaming_int8 --rates 1Gbit --h 100 --rounds 2 --fsa-rates \
    --path "$path" --out "$OUT/standin-$path" 2>&1 | tee "$OUT/scale_$path.log" | grep "utilization"
  echo "stand-in, $path path: $((SECONDS - start)) s"; start=$SECONDS
done
