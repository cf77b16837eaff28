#!/usr/bin/env bash
# CPU machine, clean tree on main (built): stages .carry/ for run.sh - main's bench kernels (.carry/diag, by
# 2026-12-02-h200-tn-steps/prepare.sh), then change.diff applied for a copy (.carry/s3) with TN's two bench
# kernels regenerated at 3 ring stages, and the patch taken back out.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
d=bench/results/2026-12-02-h200-tn-3stages
[ -z "$(git status --porcelain --untracked-files=no)" ] || { echo "prepare.sh: commit or stash first" >&2; exit 2; }
bash bench/results/2026-12-02-h200-tn-steps/prepare.sh
p=$(mktemp)  # change.diff is on branch lab-notebook (main at 4f6a656; bench/results/INDEX.md)
git show lab-notebook:$d/change.diff > $p 2>/dev/null || git show 4f6a656:$d/change.diff > $p
git apply $p
trap 'git apply -R '$p'; rm -f '$p'; cmake --build build --target megamoe-cache >/dev/null' EXIT
cmake --build build --target megamoe-cache >/dev/null
rm -rf .carry/s3 && cp -r .carry/diag .carry/s3
for s in E=128,N=4096,M=7168,pairs=0 E=128,N=2048,M=7168,pairs=0; do
  build/bin/megamoe-cache generate --targets sm_90a --cache-dir .carry/s3 --quiet --force \
    --kernel grouped_gemm_tn_tma --spec $s | grep -E "^grouped_gemm_tn_tma\["
done
du -sh .carry
