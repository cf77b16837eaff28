#!/usr/bin/env bash
# CPU machine, clean tree on branch tn-held-rows: stages .carry/ for tests.sh and layer.sh:
#   .carry/cache       the branch's kernels (GPU tests, benchmarks), binaries and libmegamoe.so (scripts/gpu-stage.sh)
#   .carry/base-main   main's benchmark kernels (the runtime is unchanged: the branch's lib runs both)
#   .carry/cache-s1    the branch's, TN kernels regenerated with the held rows stored in one share
#   .carry/cache-h4    the branch's, TN kernels regenerated holding 4 vectors (of 16) in one share
# and prints the static facts (registers, spills) of the TN kernels of each.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
branch=$(git rev-parse --abbrev-ref HEAD)
[ -z "$(git status --porcelain --untracked-files=no)" ] || { echo "prepare.sh: commit or stash first" >&2; exit 2; }
# TN kernels of the variants: those of the bench's TN cases and the layer's dW1 (dispatch_grouped_gemm layout=2),
# regenerated (--force) into cache dir $1; prints their registers and scratch (spill) bytes.
tn() {
  for ks in grouped_gemm_tn_tma:E=128,N=4096,M=7168,pairs=0 grouped_gemm_tn_tma:E=128,N=2048,M=7168,pairs=0 \
            grouped_gemm_tn_tma:E=16,N=512,M=1024,pairs=0 \
            dispatch_grouped_gemm:E=256,ranks=2,topk=8,H=7168,I=2048,clamp_milli=0,layout=2,save_h=0,dedup=0; do
    build/bin/megamoe-cache generate --targets sm_90a --cache-dir "$1" --quiet --force --kernel "${ks%%:*}" \
      --spec "${ks#*:}" | grep -E "^(grouped_gemm_tn_tma|dispatch_grouped_gemm)\["
  done
}
staged=$(mktemp -d)
git checkout -q main
cmake --build build --target megamoe-cache >/dev/null
scripts/gen-bench-cache.sh "$staged/base-main" >/dev/null
echo "== base-main"; tn "$staged/base-main"
git checkout -q "$branch"
cmake --build build >/dev/null
scripts/gpu-stage.sh
mv "$staged"/base-main .carry/
echo "== cache (8 held, 2 shares)"; tn .carry/cache
echo "== cache-s1 (8 held, 1 share)"; cp -r .carry/cache .carry/cache-s1 && MEGAMOE_HELD_SHARES=1 tn .carry/cache-s1
echo "== cache-h4 (4 held, 1 share)"; cp -r .carry/cache .carry/cache-h4 && MEGAMOE_HELD_SHARES=1 MEGAMOE_HELD_VECTORS=4 tn .carry/cache-h4
# NT / NN entries must be the same objects as main's (the change is TN's alone).
/usr/bin/python3 - <<'PY'
import json, pathlib, hashlib
def objs(d):
    out = {}
    for m in pathlib.Path(d, "entries").glob("*/manifest.json"):
        j = json.loads(m.read_text())
        blobs = sorted(p for p in m.parent.iterdir() if p.name != "manifest.json")
        out[(j.get("kernel"), json.dumps(j.get("spec")))] = hashlib.sha256(b"".join(p.read_bytes() for p in blobs)).hexdigest()
    return out
a, b = objs(".carry/base-main"), objs(".carry/cache")
same = [k for k in a if k in b and a[k] == b[k]]
diff = sorted({k[0] for k in a if k in b and a[k] != b[k]})
print(f"entries of main's bench cache: {len(a)}; identical objects on the branch: {len(same)}; differing: {diff}")
PY
du -sh .carry/*
