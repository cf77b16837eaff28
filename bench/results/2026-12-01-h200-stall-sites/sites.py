# Reads `ncu --page source --csv --print-source sass` output (argv[1]) and prints the instructions with the most
# warp-stall samples, their share of all samples, and the stall reasons that dominate each.
import csv, sys
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
head_i = next(i for i, r in enumerate(rows) if any("Source" == c or "Address" == c for c in r))
head = rows[head_i]; body = [r for r in rows[head_i + 1:] if len(r) == len(head)]
col = lambda key: next((i for i, h in enumerate(head) if h.startswith(key)), None)
src, samp = col("Source"), col("Warp Stall Sampling (All")
print("columns:", "|".join(head)[:1500])
if src is None or samp is None: sys.exit("no source / sampling column")
num = lambda s: float(s.replace(",", "") or 0)
tot = sum(num(r[samp]) for r in body) or 1
print("total samples", tot, "instructions", len(body))
for r in sorted(body, key=lambda r: -num(r[samp]))[:45]:
    print("%6.2f%%  %s" % (100 * num(r[samp]) / tot, r[src][:110]))
