#!/usr/bin/env python3
"""Where TN's MMA warpgroups wait, from ncu's stall sampling by SASS instruction (--page source --print-source sass
--csv): each MMA warpgroup's samples split into its ring-slot waits (the K loop's mbarrier spin), its waits for its
own wgmma groups (WARPGROUP.DEPBAR), staging stores, global stores and the rest, as shares of its own samples.
Usage: stalls.py SASS.csv [...] (e.g. sass-diag.csv from stalls3.tgz here, sass-smc.csv from
../2026-12-02-h200-stmatrix-staging/sm2.tgz, sass-k32.csv from ../2026-12-02-h200-tn-k32/k32s.tgz; the archives are
on branch lab-notebook: git show lab-notebook:bench/results/2026-12-02-h200-tn-bulk-rows/stalls3.tgz > stalls3.tgz)."""
import csv
import sys


def rows_of(path):
    lines = open(path).readlines()
    start = next(i for i, l in enumerate(lines) if l.startswith('"Address"'))
    table = list(csv.reader(lines[start:]))
    head = table[0]
    return head, [r for r in table[1:] if len(r) == len(head)]


def split(path):
    head, rows = rows_of(path)
    col = {k: i for i, k in enumerate(head)}
    samples = [int(r[col["Warp Stall Sampling (All Samples)"]]) for r in rows]
    executed = [int(r[col["Instructions Executed"]]) for r in rows]
    src = [r[col["Source"]].strip() for r in rows]
    # The K loop's wgmma runs most often; the two MMA warpgroups' copies of it are the two runs of that count.
    kloop = max(e for e, s in zip(executed, src) if "HGMMA" in s)
    hg = [i for i, (e, s) in enumerate(zip(executed, src)) if "HGMMA" in s and e == kloop]
    second = next(i for i in hg if i > hg[0] + 100)
    sleep = next(i for i, s in enumerate(src) if "NANOSLEEP" in s)  # the out-of-line wait loops start here
    total = sum(samples)
    out = {}
    for name, (a, b) in {"warpgroup 0": (hg[0] - 30, second - 30), "warpgroup 1": (second - 30, sleep - 1)}.items():
        part = {"ring-slot waits": 0, "wgmma waits": 0, "staging stores": 0, "global stores": 0, "rest": 0}
        for i in range(a, b):
            s = src[i]
            if "BRA" in s and executed[i] == kloop:
                key = "ring-slot waits"
            elif "DEPBAR" in s:
                key = "wgmma waits"
            elif s.startswith(("STS", "STSM")) or "FENCE.VIEW" in s:
                key = "staging stores"
            elif s.startswith("STG"):
                key = "global stores"
            else:
                key = "rest"
            part[key] += samples[i]
        own = sum(part.values())
        out[name] = (100.0 * own / total, {k: 100.0 * v / own for k, v in part.items()})
    return out


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for path in sys.argv[1:]:
        for name, (share, part) in split(path).items():
            print(f"{path}: {name} ({share:.1f}% of all samples): " +
                  ", ".join(f"{k} {v:.1f}%" for k, v in part.items()))
