#!/usr/bin/env python3
"""Bank accesses a clock an SM for each kernel launch in ncu's --csv metrics output (run.sh): (bank reads + bank
writes) / SMs / the SM's elapsed cycles, against shared memory's 32 (128 bytes) a clock. Usage: banks.py NCU.csv"""
import collections
import csv
import sys

SMS = 132


def launches(path):
    lines = [l for l in open(path) if l.startswith('"')]
    rows = list(csv.DictReader(lines))
    by = collections.OrderedDict()
    for r in rows:
        key = (r["ID"], r["Kernel Name"])
        by.setdefault(key, {})[r["Metric Name"]] = (float(r["Metric Value"].replace(",", "")), r["Metric Unit"])
    return by


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    for (i, name), m in launches(sys.argv[1]).items():
        v = {k: x[0] for k, x in m.items()}
        banks = (v["l1tex__data_bank_reads.sum"] + v["l1tex__data_bank_writes.sum"]) / SMS / v["sm__cycles_elapsed.avg"]
        t, unit = m["gpu__time_duration.sum"]
        print(f"{i:>3} {name[:40]:40} {t:9.3f} {unit:8} tensor pipe "
              f"{v['sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active']:5.1f}%  "
              f"banks {banks:5.2f} / 32 a clock an SM")
