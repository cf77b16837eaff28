# Device run 2 and 3 (after tests.sh passed): the layer, each base (.carry/base-*) and the branch (.carry/cache) in
# turn, random (uniform) and whole-tile (balanced) routing; each run prints the random / whole-tile ratio
# (megamoe-bench layer, "ragged"). `layer.sh dsv3`: DeepSeek-V3 EP2's per-GPU work, forward + backward;
# `layer.sh presets`: qwen3 and deepseek-v2-lite (EP1 with half their experts), forward. ~2 min per layer run.
set -uo pipefail
part=${1:-dsv3}
OUT=${OUT:-/tmp/o}; ab=$OUT/layer-$part; mkdir -p $ab
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so PYTHONPATH=$PWD/python
bench="python3 tools/megamoe-bench/megamoe-bench layer --lib .carry/lib/libmegamoe.so --nproc 1 --routings uniform,balanced --reps 5 --graph-replays 5"
for v in $(cd .carry && ls -d base-*) cache; do
  if [ "$part" = dsv3 ]; then
    MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 170 $bench --experts 128 --backward --json $ab/dsv3-$v.json > $ab/dsv3-$v.txt 2>&1
    echo "dsv3 $v: exit $?"; grep -E "layer |random / whole|correctness" $ab/dsv3-$v.txt
  else
    for p in "qwen3-235b-a22b 64" "deepseek-v2-lite 32"; do set -- $p
      MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 90 $bench --preset $1 --experts $2 --json $ab/$1-$v.json > $ab/$1-$v.txt 2>&1
      echo "$1 $v: exit $?"; grep -E "random / whole|correctness" $ab/$1-$v.txt
    done
  fi
done
tar czf $OUT/layer-$part.tgz -C $OUT layer-$part && rm -rf $ab
