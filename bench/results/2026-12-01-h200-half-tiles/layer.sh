# Device run 2 (after tests.sh passed): the layer, base (.carry/old) and branch (.carry/cache) in turn, random
# (uniform) and whole-tile (balanced) routing: DeepSeek-V3 EP2's per-GPU work forward + backward, then qwen3 and
# deepseek-v2-lite forward; each run prints the random / whole-tile ratio (megamoe-bench layer, "ragged").
set -uo pipefail
OUT=${OUT:-/tmp/o}; ab=$OUT/layer; mkdir -p $ab
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so PYTHONPATH=$PWD/python
bench="python3 tools/megamoe-bench/megamoe-bench layer --lib .carry/lib/libmegamoe.so --nproc 1 --routings uniform,balanced --reps 5 --graph-replays 5"
for v in old cache; do
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 150 $bench --experts 128 --backward --json $ab/dsv3-$v.json > $ab/dsv3-$v.txt 2>&1
  echo "dsv3 $v: exit $?"; grep -E "^(uniform|balanced)|layer |random / whole|correctness" $ab/dsv3-$v.txt
done
for v in old cache; do for p in "qwen3-235b-a22b 64" "deepseek-v2-lite 32"; do set -- $p
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 90 $bench --preset $1 --experts $2 --json $ab/$1-$v.json > $ab/$1-$v.txt 2>&1
  echo "$1 $v: exit $?"; grep -E "random / whole|correctness" $ab/$1-$v.txt
done; done
tar czf $OUT/layer.tgz -C $OUT layer && rm -rf $ab
