# Device run (after tests.sh of 2026-12-01-h200-half-tiles passed): main (.carry/base-main with .carry/lib-main, its
# own runtime, since the A map's box is part of the argument signature) against the branch (.carry/cache with
# .carry/lib), alternating: the standalone GEMMs three rounds, then the layer (DeepSeek-V3 EP2 per GPU, fwd+bwd,
# random and whole-tile routing), a second layer round while time is left.
set -uo pipefail
OUT=${OUT:-/tmp/o}; ab=$OUT/ab; mkdir -p $ab
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python
lib() { [ "$1" = cache ] && echo $PWD/.carry/lib/libmegamoe.so || echo $PWD/.carry/lib-main/libmegamoe.so; }
for r in 1 2 3; do for v in base-main cache; do
  MEGAMOE_LIB=$(lib $v) MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 60 python3 tools/megamoe-bench/megamoe-bench gemm --lib $(lib $v) --cases dsv3-ep2-l1,dsv3-ep2-l1-random,dsv3-ep2-l2-random,dsv3-ep2-l1-dgrad,ragged-nt --reps 5 --json $ab/gemm-$v-$r.json > $ab/gemm-$v-$r.txt 2>&1
  echo "gemm $v run $r: exit $?"; grep -E "^[a-z0-9-]+ |  tma " $ab/gemm-$v-$r.txt | head -12
done; done
for r in 1 2; do for v in base-main cache; do
  [ $r = 2 ] && [ $SECONDS -gt 300 ] && break 2
  MEGAMOE_LIB=$(lib $v) MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 140 python3 tools/megamoe-bench/megamoe-bench layer --lib $(lib $v) --nproc 1 --routings uniform,balanced --reps 5 --graph-replays 5 --experts 128 --backward --json $ab/dsv3-$v-$r.json > $ab/dsv3-$v-$r.txt 2>&1
  echo "dsv3 $v run $r: exit $? at ${SECONDS}s"; grep -E "layer |random / whole|correctness|interleav" $ab/dsv3-$v-$r.txt
done; done
tar czf $OUT/ab.tgz -C $OUT ab && rm -rf $ab
