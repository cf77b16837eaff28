# Device run: main's kernels (.carry/base-main, .carry/lib-main) at the two other presets (EP1, half their
# experts; forward) and DeepSeek-V3 EP2 per GPU (fwd+bwd), two runs each: the first GPU runs of the interleaved
# random / whole-tile ratio (megamoe-bench layer, "steps in turns") at the presets.
set -uo pipefail
OUT=${OUT:-/tmp/o}; ab=$OUT/presets; mkdir -p $ab
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python MEGAMOE_LIB=$PWD/.carry/lib-main/libmegamoe.so MEGAMOE_CACHE_DIR=$PWD/.carry/base-main
bench="python3 tools/megamoe-bench/megamoe-bench layer --lib $MEGAMOE_LIB --nproc 1 --routings uniform,balanced --reps 5 --graph-replays 5"
for r in 1 2; do
  for p in "qwen3-235b-a22b 64" "deepseek-v2-lite 32"; do set -- $p
    timeout 90 $bench --preset $1 --experts $2 --json $ab/$1-$r.json > $ab/$1-$r.txt 2>&1
    echo "$1 run $r: exit $?"; grep -E "random / whole|correctness" $ab/$1-$r.txt
  done
  timeout 120 $bench --experts 128 --backward --json $ab/dsv3-$r.json > $ab/dsv3-$r.txt 2>&1
  echo "dsv3 run $r: exit $?"; grep -E "random / whole|correctness" $ab/dsv3-$r.txt
done
tar czf $OUT/presets.tgz -C $OUT presets && rm -rf $ab
