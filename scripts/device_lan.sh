#!/usr/bin/env bash
# The collective LAN tier on one GPU machine (issue 22's device run), in one go: the CUDA tests, then the lan
# bench with the 57M and 85M character transformers (AdamW, 2 ranks of one party sharing the GPU over NCCL):
# plain (no sync) vs DDP vs lan: collective vs lan: server. Writes its logs and JSON under OUT (default ./device-out).
# Needs torch with CUDA; pyzmq from a wheel in .whl/ when the machine has none:
#   bash scripts/device_lan.sh
source "$(dirname "$0")/device_env.sh"
nvidia-smi -L; python3 -c 'import torch, zmq; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), "zmq", zmq.__version__)'
start=$SECONDS
timeout 170 python3 -m geomx.bench.lan --device cuda --models gpt57m --ranks 2 --optimizer adamw --steps 20 \
  --tiers plain ddp collective server --out "$OUT/b57" 2>&1 | tee "$OUT/lan57.log" | grep -v "^\[lan\] gpt"
echo "57m bench: $((SECONDS - start)) s"; start=$SECONDS
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/unit/test_collective_host.py tests/unit/test_collective_group.py \
  tests/integration/test_collective_cuda.py 2>&1 | tee "$OUT/tests.log" | tail -15
echo "cuda tests: $((SECONDS - start)) s"; start=$SECONDS
timeout 150 python3 -m geomx.bench.lan --device cuda --models gpt85m --ranks 2 --optimizer adamw --steps 20 \
  --tiers plain ddp collective server --out "$OUT/b85" 2>&1 | tee "$OUT/lan85.log" | grep -v "^\[lan\] gpt"
echo "85m bench: $((SECONDS - start)) s"
cp "$OUT"/b57/lan.json "$OUT/lan57.json" 2>/dev/null; cp "$OUT"/b85/lan.json "$OUT/lan85.json" 2>/dev/null
rm -rf "$OUT/b57" "$OUT/b85"
