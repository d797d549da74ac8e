#!/usr/bin/env bash
# Issue 41's GPU check: K same-shape trials as one packed model on one GPU (bench/packs.py), from
# the core library alone. One part well inside a 10-minute limit per call; it writes its JSON
# to $OUT (default bench/results); commit it with this script's line in the commit message.
#
#   bash bench/gpu_check.sh packs        # packed vs 5 separate trial processes on one GPU at
#                                        # batch 16 and 256, then the testbed's sizes experiment
#                                        # (d64-h4-l2/l3/l4, seeds 0-4) packed, 2000 updates each
#   bash bench/gpu_check.sh train        # issue 40: flatlm padded / unpadded / rows
#                                        # (train.sequence_packing) vs stock BertForMaskedLM
#                                        # bf16 + SDPA, bert-12.8m, 41m, 110m at batch 4096,
#                                        # time to the first step included: train_gpu_check.json
#   bash bench/gpu_check.sh smoke cpu    # the same at toy sizes (tests/bench/test_packs.py,
#                                        # tests/bench/test_train.py)
#
# DEVICE (second argument, default cuda) names the torch device; PYTHON the interpreter (python3).
set -euo pipefail
cd "$(dirname "$0")/.."
part=${1:?"usage: bash bench/gpu_check.sh packs|train|smoke [DEVICE]"}
device=${2:-cuda}
out=${OUT:-bench/results}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # flatlm from this checkout, not installed
py=${PYTHON:-python3}
case "$part" in
packs)
    $py bench/packs.py --device "$device" --members 5 --sizes --sizes-steps 2000 --out "$out"
    ;;
train)  # issue 40's training part: 12 sides, each compiled (not yet run on a GPU)
    $py bench/train.py --device "$device" --presets bert-12.8m,bert-41m,bert-110m \
        --variants padded,unpadded,rows --baselines hf-bf16 --batch-size 4096 \
        --batches 3 --warmup 3 --repeats 2 --out "$out/train_gpu_check.json"
    ;;
smoke)  # that the part runs, not how fast
    $py bench/packs.py --device "$device" --smoke --sizes --out "$out"
    $py bench/train.py --device "$device" --presets bert-2m --batch-size 32 \
        --variants padded,unpadded,rows --baselines hf-bf16 --batches 1 --warmup 1 \
        --repeats 1 --out "$out/train_gpu_check_smoke.json"
    ;;
*)
    echo "bench/gpu_check.sh: unknown part '$part'; use packs, train or smoke" >&2
    exit 2
    ;;
esac
echo "wrote: $(cd "$out" && ls -- packs_*.json train_gpu_check*.json 2>/dev/null | tr '\n' ' ')"
