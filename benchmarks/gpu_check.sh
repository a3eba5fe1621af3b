#!/usr/bin/env bash
# flash-cann's CUDA backend on a GPU machine, in one call (each call must end within
# 10 minutes): the GPU tests, then the benchmark; logs, JSON and PNG go into $OUT.
#
#   bash benchmarks/gpu_check.sh [quick]     GPU tests, then the benchmark's --quick run
#   bash benchmarks/gpu_check.sh tests       GPU tests, then `flash-cann demo`
#   bash benchmarks/gpu_check.sh bench ARGS  the benchmark alone, e.g.
#        bench --dtypes bfloat16                        (full bf16 grid + memory)
#        bench --dtypes float16 --memory-seqlens ''     (full fp16 grid)
#        bench --quick --impls flash_cann,flash_cann-pointers,sdpa-flash   (TMA on/off)
#   bash benchmarks/gpu_check.sh serving ARGS   gpu_serving.py (varlen, decode, split-KV), e.g.
#        serving --quick                                (the issue-24 targets, one run)
#
# Runs from the working tree (PYTHONPATH=python; no install, no network). The tests run
# in three processes at once: Triton compiles on the CPU, one GPU serves them all.
# The summary printed last: test results, then the benchmark's memory table, target
# check and speed table.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="python${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-benchmarks/results/gpu-check}"
mkdir -p "$OUT"
mode="${1:-quick}"
shift $(( $# > 0 ? 1 : 0 ))
summary=()

run_tests() {
  local shards=("bf16" "fp16" "not bf16 and not fp16") names=("bf16" "fp16" "other") pids=()
  for i in 0 1 2; do
    timeout "${TESTS_TIMEOUT:-330}" python -m pytest -q -p no:cacheprovider tests/test_triton.py \
      -k "${shards[$i]}" > "$OUT/tests-${names[$i]}.log" 2>&1 &
    pids+=($!)
  done
  for i in 0 1 2; do
    wait "${pids[$i]}"
    local rc=$? last
    last=$(tail -n 1 "$OUT/tests-${names[$i]}.log")
    [ $rc -eq 124 ] && last="TIMED OUT after ${TESTS_TIMEOUT:-330} s; $last"
    summary+=("tests ${names[$i]} (rc $rc): $last")
  done
}

run_bench() {
  # The autotuner's choices go into the log (NOTES.md, step 4).
  TRITON_PRINT_AUTOTUNING=1 timeout "${BENCH_TIMEOUT:-570}" \
    python benchmarks/gpu_attention.py --out "$OUT" "$@" > "$OUT/bench.log" 2>&1
  local rc=$?
  summary+=("benchmark (rc $rc): $OUT/bench.log")
}

run_serving() {
  TRITON_PRINT_AUTOTUNING=1 timeout "${BENCH_TIMEOUT:-570}" \
    python benchmarks/gpu_serving.py --out "$OUT" "$@" > "$OUT/serving.log" 2>&1
  local rc=$?
  summary+=("serving benchmark (rc $rc): $OUT/serving.log")
}

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
  --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
case "$mode" in
  quick) run_tests; BENCH_TIMEOUT="${BENCH_TIMEOUT:-240}" run_bench --quick --tag quick ;;
  tests)
    run_tests
    timeout 120 python -m flash_cann demo > "$OUT/demo.log" 2>&1
    summary+=("demo (rc $?): $(grep -E 'accuracy: (PASS|FAIL)' "$OUT/demo.log")") ;;
  bench) run_bench "$@" ;;
  serving) run_serving "$@" ;;
  *) echo "usage: $0 [quick|tests|bench ARGS...|serving ARGS...]" >&2; exit 2 ;;
esac

echo "=== summary ($mode; files in $OUT) ==="
printf '%s\n' "${summary[@]}"
for log in "$OUT"/tests-*.log; do
  [ -f "$log" ] && grep -E "^(FAILED|ERROR) " "$log" | head -n 10
done
if [ -f "$OUT/serving.log" ] && [ "$mode" = serving ]; then
  if grep -q '^wrote ' "$OUT/serving.log"; then
    sed -n '/^wrote /,$p' "$OUT/serving.log"
  else
    tail -n 30 "$OUT/serving.log"
  fi
fi
if [ -f "$OUT/bench.log" ] && [ "$mode" != tests ] && [ "$mode" != serving ]; then
  if grep -q '^wrote ' "$OUT/bench.log"; then
    sed -n '/^wrote /,$p' "$OUT/bench.log"
  else
    tail -n 30 "$OUT/bench.log"
  fi
fi
