# Device run (after tests.sh passed): the standalone GEMMs, each base (.carry/base-*) and the branch (.carry/cache)
# alternating, two rounds (~1 min per variant and round).
set -uo pipefail
OUT=${OUT:-/tmp/o}
export PYTHONUNBUFFERED=1 MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so PYTHONPATH=$PWD/python
ab=$OUT/gemm; mkdir -p $ab
for r in 1 2; do for v in $(cd .carry && ls -d base-*) cache; do
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 100 python3 tools/megamoe-bench/megamoe-bench gemm --lib .carry/lib/libmegamoe.so --cases dsv3-ep2-dw1,dsv3-ep2-dw1-random,dsv3-ep2-dw2-random,ragged-tn --reps 5 --json $ab/gemm-$v-$r.json > $ab/gemm-$v-$r.txt 2>&1
  echo "gemm $v run $r: exit $?"; grep -E "tma|pairs" $ab/gemm-$v-$r.txt | head -12
done; done
tar czf $OUT/gemm.tgz -C $OUT gemm && rm -rf $ab
