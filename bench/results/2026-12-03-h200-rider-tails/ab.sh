# Device run (after tests.sh passed): main (.carry/base-main) against the branch (.carry/cache), both on main's
# runtime (.carry/lib-main; the argument signatures are the same), alternating, two rounds.
set -uo pipefail
OUT=${OUT:-/tmp/o}; ab=$OUT/rider; mkdir -p $ab
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python MEGAMOE_LIB=$PWD/.carry/lib-main/libmegamoe.so
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > $ab/machine.txt
for r in 1 2; do for v in base-main cache; do
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 80 python3 tools/megamoe-bench/megamoe-bench gemm --lib $MEGAMOE_LIB --cases dsv3-ep2-l1,dsv3-l1-rows520,dsv3-l1-rows576,dsv3-l1-rows640,dsv3-ep2-l1-random,dsv3-ep2-l2-random --reps 5 --json $ab/gemm-$v-$r.json > $ab/gemm-$v-$r.txt 2>&1
  echo "gemm $v run $r: exit $?"; grep -E "^[a-z0-9-]+ |  (tma|pairs) " $ab/gemm-$v-$r.txt
done; done
tar czf $OUT/rider.tgz -C $OUT rider && rm -rf $ab
