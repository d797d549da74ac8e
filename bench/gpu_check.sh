#!/usr/bin/env bash
# The GPU check of issues 40 and 41, from the core library alone (no Ray, MLflow or datasets on
# the GPU host). Each part fits well inside a 10-minute limit per call and writes its JSON to
# $OUT (default bench/results); commit it with this script's line in the commit message.
#
#   bash bench/gpu_check.sh train        # issue 40: flatlm padded / unpadded / rows
#                                        # (train.sequence_packing) vs stock BertForMaskedLM
#                                        # bf16 + SDPA, bert-12.8m, 41m, 110m at batch 4096,
#                                        # time to the first step included: train_gpu_check.json
#   bash bench/gpu_check.sh measure      # issue 40: a paper-scale checkpoint's measurement per
#                                        # measurement, the speed settings against fp32, and the
#                                        # PCFG truth (bench/gpu_measure.py): measure_cuda.json
#   bash bench/gpu_check.sh packs        # issue 41: packed vs 5 separate trial processes at
#                                        # batch 16 and 256, then the testbed's sizes experiment
#                                        # (d64-h4-l2/l3/l4, seeds 0-4) packed, 2000 updates each
#   bash bench/gpu_check.sh smoke cpu    # every part at toy sizes (tests/bench/test_packs.py,
#                                        # tests/bench/test_train.py, test_gpu_measure.py)
#
# DEVICE (second argument, default cuda) names the torch device; PYTHON the interpreter (python3).
set -euo pipefail
cd "$(dirname "$0")/.."
part=${1:?"usage: bash bench/gpu_check.sh train|measure|packs|smoke [DEVICE]"}
device=${2:-cuda}
out=${OUT:-bench/results}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # flatlm from this checkout, not installed
py=${PYTHON:-python3}
case "$part" in
train)  # 12 sides, each compiled (not yet run on a GPU)
    $py bench/train.py --device "$device" --presets bert-12.8m,bert-41m,bert-110m \
        --variants padded,unpadded,rows --baselines hf-bf16 --batch-size 4096 \
        --batches 3 --warmup 3 --repeats 2 --out "$out/train_gpu_check.json"
    ;;
measure)  # bert-41m at the gpu scale (10^6 eval sentences)
    $py bench/gpu_measure.py --device "$device" --model bert-41m --out "$out"
    ;;
packs)
    $py bench/packs.py --device "$device" --members 5 --sizes --sizes-steps 2000 --out "$out"
    ;;
smoke)  # that every part runs, not how fast
    $py bench/packs.py --device "$device" --smoke --sizes --out "$out"
    $py bench/train.py --device "$device" --presets bert-2m --batch-size 32 \
        --variants padded,unpadded,rows --baselines hf-bf16 --batches 1 --warmup 1 \
        --repeats 1 --out "$out/train_gpu_check_smoke.json"
    $py bench/gpu_measure.py --device "$device" --smoke --out "$out"
    ;;
*)
    echo "bench/gpu_check.sh: unknown part '$part'; use train, measure, packs or smoke" >&2
    exit 2
    ;;
esac
echo "wrote: $(cd "$out" && ls -- *.json 2>/dev/null | tr '\n' ' ')"
