#!/usr/bin/env bash
# Issue 11's GPU measurements in four commands, each well inside a 10-minute limit per call, from
# the core library alone (no Ray, MLflow, Optuna or datasets on the GPU host). Each part writes
# its JSON files to $OUT (default bench/results); commit them with this script's line in the
# commit message. The baselines' packages travel as wheels (bench/gpu_wheels.sh, run where pip
# reaches a package index); without them their rows are skipped with a message.
#
#   bash bench/gpu_session.sh train      # bench/train.py, bert-12.8m .. bert-234m at batch 4096
#   bash bench/gpu_session.sh large      # bert-950m at batch 4096; truth and eval data
#   bash bench/gpu_session.sh measure    # Tr(F) (bert-41m, bert-110m, B.1's 10^4 x 50), a
#                                        # checkpoint's cost in the paper preset, shared GPU
#   bash bench/gpu_session.sh smoke cpu  # every part at toy sizes (tests/test_gpu_session.py)
#
# DEVICE (second argument, default cuda) names the torch device; PYTHON the interpreter (python3),
# WHEELS the folder of carried wheels (.whl).
set -euo pipefail
cd "$(dirname "$0")/.."
part=${1:?"usage: bash bench/gpu_session.sh train|large|measure|smoke [DEVICE]"}
device=${2:-cuda}
case "$part" in
train | large | measure | smoke) ;;
*)
    echo "bench/gpu_session.sh: unknown part '$part'; use train, large, measure or smoke" >&2
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
        --target /tmp/flatlm-site "$wheel" || echo "bench/gpu_session.sh: skipped $wheel"
done
[ -d /tmp/flatlm-site ] && export PYTHONPATH=/tmp/flatlm-site${PYTHONPATH:+:$PYTHONPATH}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # flatlm from this checkout, not installed

case "$part" in
train)
    $py bench/train.py --device "$device" --presets bert-12.8m,bert-41m,bert-110m,bert-234m \
        --out "$out/train_cuda.json"
    ;;
large)
    $py bench/train.py --device "$device" --presets bert-950m --out "$out/train_cuda_950m.json"
    $py bench/truth.py --device "$device" --n-nltk 10 --n 65536 --batch-size 65536 \
        --min-group 1024 4096 16384 --fused --out "$out/truth_gpu.json"
    $py bench/eval_data.py --device "$device" --n-downstream 100000 --n-eval 100000 \
        --out "$out/eval_data_gpu.json"
    ;;
measure)
    $py bench/flatness.py --device "$device" --model bert-41m bert-110m --loop-inputs 50 \
        --paper-precision 10000 50 --out "$out/flatness_gpu.json"
    $py bench/checkpoint_cost.py --device "$device" --scale gpu \
        --out "$out/checkpoint_cost_gpu.json"
    $py bench/shared_gpu.py --device "$device" --out "$out/shared_gpu_cuda.json"
    ;;
smoke)  # the same scripts and flags at toy sizes: that every part runs, not how fast
    $py bench/train.py --device "$device" --presets bert-2m --batch-size 32 --batches 1 \
        --warmup 1 --repeats 1 --out "$out/train_smoke.json"
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
echo "wrote: $(cd "$out" && ls -- *.json | tr '\n' ' ')"
