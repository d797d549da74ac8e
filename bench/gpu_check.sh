#!/usr/bin/env bash
# The GPU check (issues 11, 40 and 41) in one call of at most 8 minutes on one H100 or H200,
# from the core library alone (torch and transformers; no Ray, MLflow or datasets, nothing
# fetched). Every part writes its JSON to $OUT (default bench/results); commit them with this
# script's line in the commit message.
#
#   bash bench/gpu_check.sh [all]        # every part below in turn, each cut at its budget (s)
#                                        # so that the whole fits 8 minutes: train 150, measure
#                                        # 120, packs 60, large 110; each part's seconds and
#                                        # exit status (124: cut) in gpu_check.json
#   bash bench/gpu_check.sh train        # issue 40: flatlm padded / unpadded / rows
#                                        # (train.sequence_packing) vs stock BertForMaskedLM
#                                        # bf16 + SDPA, bert-12.8m, 41m, 110m at batch 4096,
#                                        # time to the first step included, one preset a
#                                        # command (a cut keeps the presets done); bert-12.8m
#                                        # also with batches built on the fly at train.prefetch
#                                        # 0, auto and 4 processes: train_gpu_check.json
#   bash bench/gpu_check.sh measure      # issue 40: a checkpoint's measurement per
#                                        # measurement (bert-41m, 2x10^5 evaluation sentences),
#                                        # the speed settings against fp32, and the PCFG truth
#                                        # (bench/gpu_measure.py): measure_cuda.json
#   bash bench/gpu_check.sh packs        # issue 41: packed vs 5 separate trial processes at
#                                        # batch 16 and 256, then the testbed's sizes experiment
#                                        # (d64-h4-l2/l3/l4, seeds 0-4) packed, 2000 updates each
#   bash bench/gpu_check.sh large        # issue 11: bert-950m at batch 4096 (unpadded vs stock
#                                        # bf16): train_gpu_check_950m.json; the truth against
#                                        # its baselines (bench/truth.py): truth_gpu.json; the
#                                        # evaluation data (bench/eval_data.py): eval_data_gpu.json
#   bash bench/gpu_check.sh smoke cpu    # all of it at toy sizes, the same commands, 5x the
#                                        # budgets (tests/bench/test_gpu_check.py): *_smoke.json
#
# DEVICE (second argument, default cuda) names the torch device; PYTHON the interpreter
# (python3; PYTHON=echo prints the commands instead); WHEELS the folder of the baselines' wheels
# (default .whl: NLTK, torch-struct, hmmlearn, made by bench/gpu_wheels.sh where pip reaches an
# index, carried with the call); without them truth.py leaves their rows out.
set -euo pipefail
cd "$(dirname "$0")/.."
part=${1:-all}
device=${2:-cuda}
case "$part" in
all | train | measure | packs | large | smoke) ;;
*)
    echo "bench/gpu_check.sh: unknown part '$part'; use all, train, measure, packs, large or" \
        "smoke" >&2
    exit 2
    ;;
esac
out=${OUT:-bench/results}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
if [ -z "${FLATLM_WHEELS_DONE:-}" ]; then # the baselines' wheels, once, if carried
    for wheel in "${WHEELS:-.whl}"/*.whl; do
        [ -e "$wheel" ] || break
        # one built for another Python is skipped with pip's message; its rows are left out
        $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/flatlm-site "$wheel" || echo "bench/gpu_check.sh: skipped $wheel"
    done
    [ -d /tmp/flatlm-site ] && export PYTHONPATH=/tmp/flatlm-site${PYTHONPATH:+:$PYTHONPATH}
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} # flatlm from this checkout, not installed
    export FLATLM_WHEELS_DONE=1
fi
if [ "$part" = smoke ]; then # every part at toy sizes, through the same budgets
    export FLATLM_GPU_CHECK_SMOKE=1
    part=all
fi
smoke=${FLATLM_GPU_CHECK_SMOKE:-}
sfx=${smoke:+_smoke}

case "$part" in
all) # each part in its own process group, cut at its budget; the record in gpu_check.json
    records=() factor=1
    [ -n "$smoke" ] && factor=5 # a shared CPU is not what the budgets are sized for
    for budget in train:150 measure:120 packs:60 large:110; do
        name=${budget%%:*} seconds=$((${budget#*:} * factor)) rc=0 start=$(date +%s)
        timeout -k 10 "$seconds" bash "$0" "$name" "$device" || rc=$?
        [ "$rc" = 124 ] && echo "bench/gpu_check.sh: $name cut at its budget of $seconds s" >&2
        records+=("{\"part\": \"$name\", \"budget_s\": $seconds, \"rc\": $rc,
 \"seconds\": $(($(date +%s) - start))}")
    done
    (IFS=,; echo "[${records[*]}]") >"$out/gpu_check$sfx.json"
    ;;
train)
    sizes=(--batch-size 4096 --batches 3 --warmup 3 --repeats 2)
    presets=(bert-12.8m bert-41m bert-110m)
    ahead=(--prefetch 0,auto,4:processes --prefetch-steps 30)
    if [ -n "$smoke" ]; then
        sizes=(--batch-size 32 --batches 1 --warmup 1 --repeats 1)
        presets=(bert-2m)
        ahead=(--prefetch 0,1,1:processes --prefetch-steps 2)
    fi
    for preset in "${presets[@]}"; do # compiled (not yet run on a GPU)
        $py bench/train.py --device "$device" --presets "$preset" \
            --variants padded,unpadded,rows --baselines hf-bf16 "${sizes[@]}" "${ahead[@]}" \
            --merge --out "$out/train_gpu_check$sfx.json"
        ahead=()
    done
    ;;
measure) # bert-41m at the gpu scale's measurements, 2x10^5 evaluation sentences
    if [ -n "$smoke" ]; then
        $py bench/gpu_measure.py --device "$device" --smoke --out "$out"
    else
        $py bench/gpu_measure.py --device "$device" --model bert-41m --n-eval 200000 --out "$out"
    fi
    ;;
packs)
    if [ -n "$smoke" ]; then
        $py bench/packs.py --device "$device" --smoke --sizes --out "$out"
    else
        $py bench/packs.py --device "$device" --members 5 --sizes --sizes-steps 2000 --out "$out"
    fi
    ;;
large)
    if [ -n "$smoke" ]; then # bench/train.py ran in the train part
        $py bench/truth.py --device "$device" --n-nltk 1 --n 64 --batch-size 64 --n-slow 1 \
            --n-torch-struct 2 --min-group 16 --fused --repeats 1 --out "$out/truth$sfx.json"
        $py bench/eval_data.py --device "$device" --n-downstream 256 --n-eval 256 \
            --out "$out/eval_data$sfx.json"
    else
        $py bench/train.py --device "$device" --presets bert-950m --variants unpadded \
            --baselines hf-bf16 --batch-size 4096 --batches 2 --warmup 2 --repeats 1 \
            --out "$out/train_gpu_check_950m.json"
        $py bench/truth.py --device "$device" --n-nltk 10 --n 65536 --batch-size 65536 \
            --min-group 1024 4096 16384 --fused --out "$out/truth_gpu.json"
        $py bench/eval_data.py --device "$device" --n-downstream 100000 --n-eval 100000 \
            --out "$out/eval_data_gpu.json"
    fi
    ;;
esac
echo "wrote: $(cd "$out" && ls -- *.json 2>/dev/null | tr '\n' ' ')"
