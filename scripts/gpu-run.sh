#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, over what scripts/gpu-stage.sh put into .carry/:
# SASS check of every cached cubin, the GPU test tier, and the benchmarks. Logs and JSON go to $OUT.
#   usage: scripts/gpu-run.sh [sass] [tests] [gemm] [fp8] [layer-fp8] [layer] [sanitize] [python] [example]
#   (default: sass tests gemm)
set -uo pipefail
OUT=${OUT:-/tmp/megamoe-out}; mkdir -p "$OUT"
export MEGAMOE_CACHE_DIR=$PWD/.carry/cache
chmod -R go-w "$MEGAMOE_CACHE_DIR"  # the runtime refuses a cache others could write to; a copy may not keep modes
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
# The Python package from this tree (python/megamoe) over the staged library.
export MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} OUT
steps=${*:-sass tests gemm}
nvidia-smi -L | tee "$OUT/machine.txt"; date -u | tee -a "$OUT/machine.txt"
for step in $steps; do
  case $step in
    sass)
      # Every cached sm_90a cubin disassembled: HGMMA must appear exactly where the kernel uses the MMA tile.
      for d in .carry/cache/entries/*/; do
        grep -q '"target": *"sm_90a"' "$d/manifest.json" || continue
        name=$(python3 -c "import json,sys; m=json.load(open('$d/manifest.json')); print(m['kernel'])")
        cp "$d/code.bin" /tmp/k.cubin
        n=$(cuobjdump -sass /tmp/k.cubin | grep -c HGMMA)
        echo "SASS $name HGMMA=$n $(cuobjdump -sass /tmp/k.cubin | grep -o 'HGMMA\.[0-9A-Za-z.]*' | sort -u | head -2 | tr '\n' ' ')"
      done 2>&1 | tee "$OUT/sass.txt" ;;
    tests)
      # Every GPU test binary, or those named in TESTS (e.g. TESTS=gpu_layer_test); gtest reads GTEST_FILTER (e.g.
      # GTEST_FILTER='*/Ranks2' or '*/Ranks8' to split the multi-rank cases, which run with every rank on one GPU
      # when there is one). Each binary's whole log goes to $OUT/NAME.log, its verdicts and summaries here.
      for name in ${TESTS:-$(cd .carry/bin && ls gpu_*_test)}; do
        echo "== $name"
        timeout "${TEST_TIMEOUT:-540}" ".carry/bin/$name" > "$OUT/$name.log" 2>&1; echo "exit status $?"
        grep -E '^\[  (FAILED|SKIPPED|PASSED)  \]|^(SUMMARY|BANDWIDTH)|Failure$' "$OUT/$name.log" | tail -150
      done 2>&1 | tee "$OUT/gpu-tests.txt" ;;
    gemm)
      timeout 500 python3 tools/megamoe-bench/megamoe-bench gemm --lib .carry/lib/libmegamoe.so \
        --json "$OUT/gemm.json" ${GEMM_CASES:+--cases $GEMM_CASES} 2>&1 | tee "$OUT/gemm.txt" ;;
    fp8)
      # The FP8 kernels' GPU tests (GEMMs and the quantiser), the FP8 layer (gpu_layer_fp8_test), the package's FP8
      # ops, and megamoe-bench gemm --dtype fp8 (FP8_CASES narrows it, e.g. FP8_CASES=dsv3-ep2-l1,qwen3-l1).
      { GTEST_FILTER='*Fp8*:*Quantize*' timeout 120 .carry/bin/gpu_kernels_test; echo "exit status $?"
        timeout 400 .carry/bin/gpu_layer_fp8_test > "$OUT/gpu_layer_fp8_test.log" 2>&1; echo "exit status $?"
        grep -E '^\[  (FAILED|SKIPPED|PASSED)  \]|^SUMMARY|Failure$' "$OUT/gpu_layer_fp8_test.log" | tail -80
        timeout 120 python3 -m pytest -q -rs -p no:cacheprovider tests/python/gpu -k fp8; echo "exit status $?"
        timeout 300 python3 tools/megamoe-bench/megamoe-bench gemm --dtype fp8 --lib .carry/lib/libmegamoe.so \
          --json "$OUT/gemm-fp8.json" ${FP8_CASES:+--cases $FP8_CASES}; } 2>&1 | tee "$OUT/fp8.txt" ;;
    layer-fp8)
      # The FP8 layer's forward against the bf16 layer's on one GPU (DeepSeek-V3 EP2's per-GPU work by default).
      timeout 500 python3 tools/megamoe-bench/megamoe-bench layer-fp8 --lib .carry/lib/libmegamoe.so \
        --json "$OUT/layer-fp8.json" ${LAYER_FP8_ARGS:-} 2>&1 | tee "$OUT/layer-fp8.txt" ;;
    layer)
      # Two processes (one per GPU) through torch.distributed; LAYER_ARGS adds options (e.g. --routings uniform).
      timeout 560 python3 tools/megamoe-bench/megamoe-bench layer --lib .carry/lib/libmegamoe.so \
        --json "$OUT/layer.json" ${LAYER_ARGS:-} 2>&1 | tee "$OUT/layer.txt" ;;
    sanitize)
      # compute-sanitizer memcheck and racecheck on the small forward (plain and with dedup) and backward (also at
      # H=1024, where the combines reduce in column chunks) at 2 and at 8 ranks (every rank on one GPU when there is
      # one; SANITIZE_FILTER overrides the cases). Instrumented kernels run many times slower, so the cross-rank
      # waits are bounded at 30 s instead of 10 s: a rank still waiting then (e.g. kernels that the tool would not
      # run side by side) ends in a timeout error, not a hang.
      filter=${SANITIZE_FILTER:-'LayerTest.SmallForward/*:LayerTest.SmallForwardDedup/*:LayerTest.SmallBackward/*:LayerTest.SmallChunkedBackward/*'}
      for tool in memcheck racecheck; do
        MEGAMOE_WAIT_TIMEOUT_MS=30000 timeout 270 compute-sanitizer --tool $tool .carry/bin/gpu_layer_test \
          --gtest_filter="$filter"
      done 2>&1 | tee "$OUT/sanitize.txt" ;;
    python)
      # The package's GPU tier (tests/python/gpu): pytest where installed, else the file's own runner; JUnit XML and
      # (without pytest) JSON verdicts in $OUT, the op's overhead against the C++ layer in $OUT/python-overhead.json.
      # Ranks sharing the GPU time-slice, so their waits are bounded at 60 s.
      if python3 -c 'import pytest' 2>/dev/null; then
        MEGAMOE_WAIT_TIMEOUT_MS=60000 timeout 560 python3 -m pytest -v -rs -p no:cacheprovider tests/python/gpu \
          --junitxml="$OUT/python-junit.xml"
      else
        MEGAMOE_WAIT_TIMEOUT_MS=60000 timeout 560 python3 tests/python/gpu/test_gpu.py --junit "$OUT/python-junit.xml" \
          --json "$OUT/python.json"
      fi 2>&1 | tee "$OUT/python.txt" ;;
    example)
      # The examples as the README runs them: two ranks (on one GPU when there is one, each on half its SMs).
      for ex in train_moe serve_graph; do
        echo "== examples/$ex.py"
        MEGAMOE_WAIT_TIMEOUT_MS=60000 timeout 270 python3 -m torch.distributed.run --standalone --nproc_per_node 2 \
          "examples/$ex.py"; echo "exit status $?"
      done 2>&1 | tee "$OUT/example.txt" ;;
  esac
done
