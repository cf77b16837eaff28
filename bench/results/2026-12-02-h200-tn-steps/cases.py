# megamoe-bench gemm with extra cases for this diagnostic (the bench's own CASES stay as they are): the same
# 65536 rows and dW1 shape with more tokens an expert (more K steps a TN tile), and NT with 8 K steps a tile.
#   python3 bench/results/2026-12-02-h200-tn-steps/cases.py gemm --cases ... (megamoe-bench's arguments)
import os
import sys

bench = os.path.join(os.path.dirname(__file__), "../../../tools/megamoe-bench/megamoe-bench")
g = {"__name__": "megamoe_bench", "__file__": os.path.abspath(bench)}
exec(compile(open(bench).read(), bench, "exec"), g)
g["CASES"].update({
    "tn-16steps": ("tn", 64, 4096, 7168, 65536, "uniform"),   # 1024 tokens an expert: 16 K steps a tile
    "tn-64steps": ("tn", 16, 4096, 7168, 65536, "uniform"),   # 4096 tokens an expert: 64 K steps a tile
    "nt-8steps": ("nt", 128, 4096, 512, 65536, "uniform"),    # NT with K = 512: 8 K steps a tile, like dW1
})
sys.argv = [bench] + sys.argv[1:]
sys.exit(g["main"]())
