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
#   bash bench/gpu_check.sh large        # bert-234m and bert-950m at batch 4096; the PCFG truth
#                                        # at 65,536 sentences a batch; eval data at 10^5
#   bash bench/gpu_check.sh flatness     # Tr(F) of bert-41m and bert-110m, at B.1's precision
#                                        # (10^4 x 50); a gpu-scale checkpoint's cost; two
#                                        # trials sharing one GPU
#   bash bench/gpu_check.sh smoke cpu    # every part at toy sizes (tests/bench/test_packs.py)
#
# DEVICE (second argument, default cuda) names the torch device; PYTHON the interpreter (python3);
# WHEELS a folder of carried wheels (.whl: the baselines' packages, bench/gpu_wheels.sh, run where
# pip reaches a package index); without them the rows that need them are skipped with a message.
# The one GPU runbook: it replaces bench/gpu_session.sh (its parts are large and flatness here).
set -euo pipefail
cd "$(dirname "$0")/.."
part=${1:?"usage: bash bench/gpu_check.sh train|measure|packs|large|flatness|smoke [DEVICE]"}
device=${2:-cuda}
case "$part" in
train | measure | packs | large | flatness | smoke) ;;
*)
    echo "bench/gpu_check.sh: unknown part '$part'; use train, measure, packs, large, flatness" \
        "or smoke" >&2
    exit 2
    ;;
esac
out=${OUT:-bench/results}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
for wheel in "${WHEELS:-.whl}"/*.whl; do  # the baselines' wheels, if carried
    [ -e "$wheel" ] || break
    # one built for another Python is skipped with pip's message; its rows are then left out
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/flatlm-site "$wheel" || echo "bench/gpu_check.sh: skipped $wheel"
done
[ -d /tmp/flatlm-site ] && export PYTHONPATH=/tmp/flatlm-site${PYTHONPATH:+:$PYTHONPATH}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # flatlm from this checkout, not installed
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
large)
    $py bench/train.py --device "$device" --presets bert-234m,bert-950m --batch-size 4096 \
        --out "$out/train_cuda_large.json"
    $py bench/truth.py --device "$device" --n-nltk 10 --n 65536 --batch-size 65536 \
        --min-group 1024 4096 16384 --fused --out "$out/truth_gpu.json"
    $py bench/eval_data.py --device "$device" --n-downstream 100000 --n-eval 100000 \
        --out "$out/eval_data_gpu.json"
    ;;
flatness)
    $py bench/flatness.py --device "$device" --model bert-41m bert-110m --loop-inputs 50 \
        --paper-precision 10000 50 --out "$out/flatness_gpu.json"
    $py bench/checkpoint_cost.py --device "$device" --scale gpu \
        --out "$out/checkpoint_cost_gpu.json"
    $py bench/shared_gpu.py --device "$device" --out "$out/shared_gpu_cuda.json"
    ;;
smoke)  # that every part runs, not how fast
    $py bench/packs.py --device "$device" --smoke --sizes --out "$out"
    $py bench/train.py --device "$device" --presets bert-2m --batch-size 32 \
        --variants padded,unpadded,rows --baselines hf-bf16 --batches 1 --warmup 1 \
        --repeats 1 --out "$out/train_gpu_check_smoke.json"
    $py bench/gpu_measure.py --device "$device" --smoke --out "$out"
    $py bench/truth.py --device "$device" --n-nltk 2 --n 256 --batch-size 256 --n-slow 1 \
        --n-torch-struct 8 --min-group 64 --fused --out "$out/truth_smoke.json"
    $py bench/eval_data.py --device "$device" --n-downstream 256 --n-eval 256 \
        --out "$out/eval_data_smoke.json"
    $py bench/flatness.py --device "$device" --model bert-2m --train-steps 3 --pool 256 \
        --pilot 64 --max-inputs 256 --batch-size 64 --loop-inputs 4 --hutchinson-batches 2 \
        --hutchinson 8x1 --paper-precision 128 4 --out "$out/flatness_smoke.json"
    $py bench/checkpoint_cost.py --device "$device" --scale tiny --steps 2 \
        --set measure.n_eval=64 measure.n_downstream=200 measure.probe.epochs=2 \
        measure.flatness.n_inputs=64 --measure-steps 2 --patience 1 \
        --measure-set measure.n_eval=64 measure.n_downstream=200 measure.probe.epochs=2 \
        --out "$out/checkpoint_cost_smoke.json"
    $py bench/shared_gpu.py --device "$device" --trials 2 --steps 3 --warmup 1 --repeats 1 \
        --out "$out/shared_gpu_smoke.json"
    ;;
esac
echo "wrote: $(cd "$out" && ls -- *.json 2>/dev/null | tr '\n' ' ')"
