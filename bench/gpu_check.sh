#!/usr/bin/env bash
# Issue 41's GPU check: K same-shape trials as one packed model on one GPU (bench/packs.py), from
# the core library alone. One part well inside a 10-minute limit per call; it writes its JSON
# to $OUT (default bench/results); commit it with this script's line in the commit message.
#
#   bash bench/gpu_check.sh packs        # packed vs 5 separate trial processes on one GPU at
#                                        # batch 16 and 256, then the testbed's sizes experiment
#                                        # (d64-h4-l2/l3/l4, seeds 0-4) packed, 2000 updates each
#   bash bench/gpu_check.sh measure      # issue 40: a paper-scale checkpoint's measurement per
#                                        # measurement, the speed settings against fp32, and the
#                                        # PCFG truth (bench/gpu_measure.py): measure_cuda.json
#   bash bench/gpu_check.sh measure-smoke cpu  # the same at toy sizes (tests/bench/
#                                        # test_gpu_measure.py)
#   bash bench/gpu_check.sh smoke cpu    # the same at toy sizes (tests/bench/test_packs.py)
#
# DEVICE (second argument, default cuda) names the torch device; PYTHON the interpreter (python3).
set -euo pipefail
cd "$(dirname "$0")/.."
part=${1:?"usage: bash bench/gpu_check.sh packs|smoke [DEVICE]"}
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
measure)  # issue 40's measurement part: bert-41m at the gpu scale (10^6 eval sentences)
    $py bench/gpu_measure.py --device "$device" --model bert-41m --out "$out"
    exit 0
    ;;
measure-smoke)  # that the measurement part runs, not how fast
    $py bench/gpu_measure.py --device "$device" --smoke --out "$out"
    exit 0
    ;;
smoke)  # that the part runs, not how fast
    $py bench/packs.py --device "$device" --smoke --sizes --out "$out"
    ;;
*)
    echo "bench/gpu_check.sh: unknown part '$part'; use packs or smoke" >&2
    exit 2
    ;;
esac
echo "wrote: $(cd "$out" && ls -- packs_*.json | tr '\n' ' ')"
