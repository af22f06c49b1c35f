#!/usr/bin/env bash
# The second device run of issue 22: DiLoCo's shape inside the party (HFA, H=10, outer Nesterov) on one GPU, the
# 57M and 85M transformers, 2 ranks of one party sharing the GPU: plain vs DDP vs lan: collective (DDP inside,
# NCCL) vs the same with the script's own DDP making the inner steps vs lan: server (local SGD through the local
# server). Same set-up as scripts/device_lan.sh:
#   bash scripts/device_lan_hfa.sh
source "$(dirname "$0")/device_env.sh"
for model in gpt57m gpt85m; do
  start=$SECONDS
  timeout 200 python3 -m geomx.bench.lan --device cuda --models $model --ranks 2 --optimizer adamw --steps 25 \
    --tiers plain ddp collective_hfa collective_hfa_ddp server_hfa --out "$OUT/b-$model" 2>&1 | tee "$OUT/hfa-$model.log" | grep -v "^\[lan\] gpt"
  echo "$model: $((SECONDS - start)) s"
  cp "$OUT/b-$model/lan.json" "$OUT/hfa-$model.json" 2>/dev/null; rm -rf "$OUT/b-$model"
done
