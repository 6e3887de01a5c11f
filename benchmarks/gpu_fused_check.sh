#!/usr/bin/env bash
# GPU check of the compiled fused cell bodies on CUDA (issue 32; edbatch/executor/_fused_compiled.py).
#
# Run from the repo root on the GPU machine (PYTHONPATH set so that edbatch imports):
#     bash benchmarks/gpu_fused_check.sh
# Needs results/throughput_policies/ (the FSM policies; ignored by git: carry it, else the
# throughput step trains them first). Writes everything under $OUT (default /tmp/gpu_fused_out):
#   pytest_gpu.txt      the gpu tests (-n 12) but the compiled bodies' own
#   profile.{txt,json}  one fsm Tree-LSTM inference mini-batch under torch.profiler, fused
#                       bodies on and off: aten ops per batch, launches, syncs, memcpys
#   calls.{txt,json}    one compiled body call against its eager ops, host and device us per
#                       call, also with guard evaluation skipped (benchmarks/gpu_fused_calls.py):
#                       where the H200's ~230 us of host per compiled call (2026-11-28) go
#   throughput_ab.*     interleaved A/B on reshuffled mini-batches: dynet_agenda, fsm
#                       (compiled bodies), fsm+unfused (TorchExecutor(fused=False)), floor
#   tests_fused.txt     the compiled bodies' gpu tests (compiled == unfused, fp64, gradients;
#                       their first compiles took more than 80 s on the H200)
# The steps share one deadline (DEADLINE_S, default 540 s, compiles included); each runs
# under `timeout` with what is left, so the whole script ends within 9 minutes; the
# correctness tests of every other path run first. (2026-11-28, H200: with
# DISABLE_ADDMM_CUDA_LT=1 the profiled run was no faster, 15.5 -> 16.9 ms; that step is gone.)
set -u
OUT=${OUT:-/tmp/gpu_fused_out}
mkdir -p "$OUT"
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$(mktemp -d /tmp/inductor_cache.XXXXXX)}
export PYTHONUNBUFFERED=1
export EDBATCH_COMPILED_CELLS=cuda  # the compiled bodies are opt-in (slower on an H200)
DEADLINE_S=${DEADLINE_S:-540}
START=$(date +%s)

# seconds for the next step: at most $1, at most what is left of the deadline (>= 1)
budget() {
    local left=$(( DEADLINE_S - ($(date +%s) - START) ))
    local cap=$1
    (( left < cap )) && cap=$left
    (( cap < 1 )) && cap=1
    echo "$cap"
}

step() {  # step NAME CAP CMD...: run CMD under timeout, output to $OUT/NAME.txt, report rc
    local name=$1 cap
    cap=$(budget "$2")
    shift 2
    echo "== $name (timeout ${cap}s, t=$(( $(date +%s) - START ))s): $*"
    timeout "$cap" "$@" > "$OUT/$name.txt" 2>&1
    local rc=$?
    tail -n 25 "$OUT/$name.txt"
    echo "== $name rc=$rc (t=$(( $(date +%s) - START ))s)"
}

nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" \
    >> "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
echo "TORCHINDUCTOR_CACHE_DIR=$TORCHINDUCTOR_CACHE_DIR"

step pytest_gpu 150 python3 -m pytest -q -p no:cacheprovider -m gpu -n 12 \
    tests/api/test_programs_requests.py tests/executor/test_cuda.py \
    tests/executor/test_equivalence.py tests/experiments/test_train_model.py \
    tests/test_api_variadic.py tests/benchmarks/test_throughput_data.py

step profile 60 python3 benchmarks/gpu_fused_profile.py --device cuda --minibatches 3 \
    --out "$OUT/profile.json"

step calls 60 python3 benchmarks/gpu_fused_calls.py --device cuda --out "$OUT/calls.json"

step throughput_ab 200 python3 benchmarks/throughput.py --device cuda \
    --workloads tree_lstm bilstm_tagger --sizes 300x150 --minibatches 4 --no-dynet \
    --contenders dynet_agenda fsm fsm+unfused floor \
    --out "$OUT/throughput_ab.json" --plot "$OUT/throughput_ab.png"

step tests_fused 200 python3 -m pytest -q -p no:cacheprovider -m gpu -n 0 \
    tests/executor/test_fused_compiled.py

echo "total $(( $(date +%s) - START ))s; results in $OUT"
