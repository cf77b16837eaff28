# Device call 2 (after tests.sh passed): the DeepSeek-V3 layer (EP2's per-GPU work on one rank, fwd+bwd, uniform
# and balanced routing, with the timeline: each kernel's time in the step), main against the branch, alternating,
# two rounds; then ncu's tensor-pipe activity of the standalone TN kernel (dw1-random), main and branch (~6 min).
set -uo pipefail
OUT=${OUT:-/tmp/o}; t=$OUT/layer; mkdir -p $t
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python MEGAMOE_LIB=$PWD/.carry/lib/libmegamoe.so
for r in 1 2; do for v in base-main cache; do
  [ $SECONDS -gt 420 ] && break 2
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 150 python3 tools/megamoe-bench/megamoe-bench layer --lib $MEGAMOE_LIB --nproc 1 --experts 128 --backward --routings uniform,balanced --timeline --reps 5 --graph-replays 5 --json $t/dsv3-$v-$r.json > $t/dsv3-$v-$r.txt 2>&1
  echo "dsv3 $v run $r: exit $? at ${SECONDS}s"; grep -E "fwd\+bwd layer|random / whole|correctness" $t/dsv3-$v-$r.txt
  python3 -c "
import json, sys
j = json.load(open(sys.argv[1]))
for r in j['runs'][0]['routings']:
    k = r['backward']['timeline']['by_kernel']
    print('  ', r.get('routing', ''), {n: round(v['ms'], 3) for n, v in k.items() if 'tn' in n or 'dispatch' in n})
" $t/dsv3-$v-$r.json 2>&1 | head -4
done; done
for v in base-main cache; do
  [ $SECONDS -gt 500 ] && break
  MEGAMOE_CACHE_DIR=$PWD/.carry/$v timeout 60 ncu --kernel-name grouped_gemm_tn_tma --launch-skip 0 --launch-count 1 --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum python3 tools/megamoe-bench/megamoe-bench gemm --lib $MEGAMOE_LIB --cases dsv3-ep2-dw1-random --reps 1 > $t/ncu-$v.txt 2>&1
  echo "ncu $v: exit $?"; grep -E "hmma|duration" $t/ncu-$v.txt | head -4
done
tar czf $OUT/layer.tgz -C $OUT layer && rm -rf $t
