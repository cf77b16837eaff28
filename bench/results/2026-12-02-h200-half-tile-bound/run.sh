# Device run: what bounds a half tile. main's standalone NT TMA kernels (.carry/base-main) against the same
# kernels with 3 ring stages instead of 4 (.carry/probe3, branch probe-stages3), both on main's runtime
# (.carry/lib-main), alternating, two rounds: DeepSeek-V3 L1 with equal and random groups, and every group one
# half tile of 8 or 64 rows more (dsv3-l1-rows520, -rows576) or one whole tile more (-rows640).
set -uo pipefail
OUT=${OUT:-/tmp/o}; ab=$OUT/bound2; mkdir -p $ab
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python MEGAMOE_LIB=$PWD/.carry/lib-main/libmegamoe.so
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > $ab/machine.txt
for r in 1 2; do for v in base-main probe3; do
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 80 python3 tools/megamoe-bench/megamoe-bench gemm --lib $MEGAMOE_LIB --cases dsv3-ep2-l1,dsv3-l1-rows520,dsv3-l1-rows576,dsv3-l1-rows640,dsv3-ep2-l1-random --reps 5 --json $ab/gemm-$v-$r.json > $ab/gemm-$v-$r.txt 2>&1
  echo "gemm $v run $r: exit $?"; grep -E "^[a-z0-9-]+ |  (tma|pairs) " $ab/gemm-$v-$r.txt
done; done
tar czf $OUT/bound2.tgz -C $OUT bound2 && rm -rf $ab
