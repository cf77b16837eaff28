#!/usr/bin/env bash
# CPU machine, clean tree on main: stages .carry/ for run.sh .. run4.sh - main's bench kernels and the extra cases'
# (.carry/diag, by 2026-12-02-h200-tn-steps/prepare.sh), then the probe patch (change.diff) applied to the work tree
# for the copies .carry/pN with dW1's TMA kernel regenerated under MEGAMOE_TN_PROBE=N (probe 0 is main's object
# byte for byte), and the patch taken back out.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
d=bench/results/2026-12-02-h200-tn-epilogue-parts
[ -z "$(git status --porcelain --untracked-files=no)" ] || { echo "prepare.sh: commit or stash first" >&2; exit 2; }
bash bench/results/2026-12-02-h200-tn-steps/prepare.sh
p=$(mktemp)  # change.diff is on branch lab-notebook (main at 4f6a656; bench/results/INDEX.md)
git show lab-notebook:$d/change.diff > $p 2>/dev/null || git show 4f6a656:$d/change.diff > $p
git apply $p
trap 'git apply -R '$p'; rm -f '$p'; cmake --build build --target megamoe-cache >/dev/null' EXIT
cmake --build build --target megamoe-cache >/dev/null
for v in ${PROBES:-1 2 3 4 8 16 32}; do
  rm -rf .carry/p$v && cp -r .carry/diag .carry/p$v
  MEGAMOE_TN_PROBE=$v build/bin/megamoe-cache generate --targets sm_90a --cache-dir .carry/p$v --quiet --force \
    --kernel grouped_gemm_tn_tma --spec E=128,N=4096,M=7168,pairs=0 | grep -E "^grouped_gemm_tn_tma\["
done
du -sh .carry
