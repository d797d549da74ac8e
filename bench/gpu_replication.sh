#!/usr/bin/env bash
# The testbed replication's trials on one lent GPU host, from the core library alone (no Ray,
# MLflow or datasets there): `flatlm replicate` with JOBS workers sharing the GPU (each worker a
# process with one CPU thread; a trial is taken by whichever worker finds it free), stopped after
# MINUTES so that the call ends inside the host's 10-minute limit. A second call on the same warm
# host continues (finished trials are skipped, an interrupted one resumes from its newest
# checkpoint). Trials train in fp32 without torch.compile so that their numbers compare with the
# CPU runs of the other protocol (bf16 autocast and compile are CUDA's defaults otherwise).
#
#   bash bench/gpu_replication.sh paper-code      # the paper-code column (35 trials, JOBS=12)
#   bash bench/gpu_replication.sh lambda          # the adversary's lambda at the testbed budget
#   bash bench/gpu_replication.sh all             # both at once (JOBS + 2 processes)
#
# Writes $OUT/trials-<part>.tgz (repl/ and lambda-<value>/ of WORK, default /tmp/gpu: each
# trial's config.json, metrics.jsonl, train_log.jsonl and trained_by.json; no
# checkpoints), $OUT/<part>.log and $OUT/device.txt. Unpack into repl/ here and build the report
# with bench/replication_testbed.py.
set -uo pipefail
cd "$(dirname "$0")/.."
part=${1:?"usage: bash bench/gpu_replication.sh paper-code|lambda|all"}
out=${OUT:-/tmp/gpu-out}
work=${WORK:-/tmp/gpu}  # repl/ (paper-code) and lambda-<value>/ (the lambda runs)
root=$work/repl
minutes=${MINUTES:-7.5}
device=${DEVICE:-cuda}
mkdir -p "$out" "$work"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fp32=(--set train.precision=fp32 --set train.compile=false)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$out/device.txt" 2>&1
nproc >>"$out/device.txt"

paper_code() {
    python3 -m flatlm replicate --scale testbed --protocol paper-code --jobs "${JOBS:-12}" \
        --device "$device" --minutes "$minutes" "${fp32[@]}" --out "$root" >"$out/paper-code.log" 2>&1
}
lambdas() {  # criterion (d): the next lambdas down the search's grid, under paper
    for lam in 0.01 0.003162; do
        python3 -m flatlm replicate --scale testbed --protocol paper --experiment algorithms \
            --algorithms adversarial --seeds "${SEEDS:-1}" --jobs "${SEEDS:-1}" \
            --device "$device" --minutes "$minutes" "${fp32[@]}" \
            --set "train.adversarial.lambda=$lam" --out "$work/lambda-$lam" \
            >"$out/lambda-$lam.log" 2>&1 &
    done
    wait
}
case "$part" in
paper-code) paper_code ;;
lambda) lambdas ;;
all)
    paper_code &
    paper_code_pid=$!
    lambdas
    wait "$paper_code_pid"
    ;;
*)
    echo "bench/gpu_replication.sh: unknown part '$part'; use paper-code, lambda or all" >&2
    exit 2
    ;;
esac
echo "exit status of the paper-code (or last lambda) replicate: $? (4: its time budget ran out)"
(cd "$work" && find . -not -path '*/checkpoints/*' -type f \
    \( -name config.json -o -name metrics.jsonl -o -name trained_by.json -o -name train_log.jsonl \) -print0 |
    tar czf "$out/trials-$part.tgz" --null -T -)
grep -h "done\|error\|Error\|Traceback" "$out"/*.log | tail -60
echo "trials with a measured checkpoint: $(cd "$work" && find . -name metrics.jsonl | wc -l)"
