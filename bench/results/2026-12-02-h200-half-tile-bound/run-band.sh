# Device run: an expert's last m-tile in its last band (branch tail-in-band, .carry/band) against main
# (.carry/base-main), both on main's runtime, alternating, two rounds.
# Predicted (tma): the 8-row tail 0.85 -> 0.6-0.7 of a fifth tile, the fifth whole tile 1.12-1.25 -> ~1.0 of an
# average one, random L1 +2-4%, random L2 +1-3%, equal groups (4 m-tiles: nothing merges) level.
set -uo pipefail
OUT=${OUT:-/tmp/o}; ab=$OUT/bound3; mkdir -p $ab
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python MEGAMOE_LIB=$PWD/.carry/lib-main/libmegamoe.so
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv > $ab/machine.txt
for r in 1 2; do for v in base-main band; do
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 80 python3 tools/megamoe-bench/megamoe-bench gemm --lib $MEGAMOE_LIB --cases dsv3-ep2-l1,dsv3-l1-rows520,dsv3-l1-rows640,dsv3-ep2-l1-random,dsv3-ep2-l2-random --reps 5 --json $ab/gemm-$v-$r.json > $ab/gemm-$v-$r.txt 2>&1
  echo "gemm $v run $r: exit $?"; grep -E "^[a-z0-9-]+ |  (tma|pairs) " $ab/gemm-$v-$r.txt
done; done
tar czf $OUT/bound3.tgz -C $OUT bound3 && rm -rf $ab
