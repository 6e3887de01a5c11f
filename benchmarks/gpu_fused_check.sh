#!/usr/bin/env bash
# GPU check of the compiled fused cell bodies on CUDA (issue 32; edbatch/executor/_fused_compiled.py).
#
# Run from the repo root on the GPU machine (PYTHONPATH set so that edbatch imports):
#     bash benchmarks/gpu_fused_check.sh
# Needs results/throughput_policies/ (the FSM policies; ignored by git: carry it, else the
# throughput step trains them first). Writes everything under $OUT (default /tmp/gpu_fused_out):
#   tests_fused.txt     the new gpu tests alone (fused-compiled == unfused, fp64, gradients;
#                       also compiles the bodies into the fresh Inductor cache)
#   profile.{txt,json}  one fsm Tree-LSTM inference mini-batch under torch.profiler, fused
#                       bodies on and off: aten ops per batch, launches, syncs, memcpys
#   profile_no_cublaslt the same with DISABLE_ADDMM_CUDA_LT=1 (addmm with a bias through plain
#                       cuBLAS: is cuBLASLt's per-shape heuristic a host cost on fresh shapes?)
#   pytest_gpu.txt      every other gpu test (-n 12), right after the fused ones
#   throughput_ab.*     interleaved A/B on reshuffled mini-batches: dynet_agenda, fsm
#                       (compiled bodies), fsm+unfused (TorchExecutor(fused=False)), floor
# The steps share one deadline (DEADLINE_S, default 520 s, compiles included); each runs
# under `timeout` with what is left, so the whole script ends within 9 minutes. The A/B runs
# last (the H100's 3-workload run took 4 minutes): a cut A/B still leaves the tests' results.
set -u
OUT=${OUT:-/tmp/gpu_fused_out}
mkdir -p "$OUT"
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$(mktemp -d /tmp/inductor_cache.XXXXXX)}
export PYTHONUNBUFFERED=1
export EDBATCH_COMPILED_CELLS=cuda  # the compiled bodies are opt-in until timed on a GPU
DEADLINE_S=${DEADLINE_S:-520}
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

step tests_fused 80 python3 -m pytest -q -p no:cacheprovider -m gpu -n 0 \
    tests/executor/test_fused_compiled.py

step pytest_gpu 150 python3 -m pytest -q -p no:cacheprovider -m gpu -n 12 \
    tests/api/test_programs_requests.py tests/executor/test_cuda.py \
    tests/executor/test_equivalence.py tests/experiments/test_train_model.py \
    tests/test_api_variadic.py

step profile 60 python3 benchmarks/gpu_fused_profile.py --device cuda --minibatches 3 \
    --out "$OUT/profile.json"

DISABLE_ADDMM_CUDA_LT=1 step profile_no_cublaslt 40 python3 benchmarks/gpu_fused_profile.py \
    --device cuda --minibatches 2 --out "$OUT/profile_no_cublaslt.json"

step throughput_ab 240 python3 benchmarks/throughput.py --device cuda \
    --workloads tree_lstm bilstm_tagger --sizes 300x150 --minibatches 4 --no-dynet \
    --contenders dynet_agenda fsm fsm+unfused floor \
    --out "$OUT/throughput_ab.json" --plot "$OUT/throughput_ab.png"

echo "total $(( $(date +%s) - START ))s; results in $OUT"
