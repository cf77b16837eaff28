"""What the benches run: the gemm bench's cases (CASES, FP8_CASES) and their group sizes; the layer bench's model
presets (the model table's, through libmegamoe), routings and token cases, and the draws of its routings (Zipf popularity, whole-tile picks)."""
import torch


# (name, layout, experts, N, K-or-M, total rows/tokens, distribution)
CASES = {
    "dsv3-ep2-l1": ("nt", 128, 4096, 7168, 65536, "uniform"),
    "dsv3-ep2-l2": ("nt", 128, 7168, 2048, 65536, "uniform"),
    "dsv3-ep8-l1": ("nt", 32, 4096, 7168, 16384, "uniform"),
    "dsv3-ep2-l1-zipf": ("nt", 128, 4096, 7168, 65536, "zipf"),
    # Group sizes as the layer sees them: every row's expert drawn uniformly (sizes ~ 512 +- 22, not multiples of 128).
    "dsv3-ep2-l1-random": ("nt", 128, 4096, 7168, 65536, "random"),
    "dsv3-ep2-l2-random": ("nt", 128, 7168, 2048, 65536, "random"),
    "dsv3-ep2-l2-dgrad": ("nn", 128, 2048, 7168, 65536, "uniform"),
    "dsv3-ep2-l1-dgrad": ("nn", 128, 7168, 4096, 65536, "uniform"),
    "dsv3-ep2-dw1": ("tn", 128, 4096, 7168, 65536, "uniform"),
    # The weight gradients at the layer's group sizes: most groups end inside a 64-token K step.
    "dsv3-ep2-dw1-random": ("tn", 128, 4096, 7168, 65536, "random"),
    "dsv3-ep2-dw2-random": ("tn", 128, 2048, 7168, 65536, "random"),
    # What an expert's last m-tile costs by its rows: DeepSeek-V3 L1 (512 rows an expert: 4 whole m-tiles) with 8
    # or 64 rows more an expert (a half tile each) or 128 more (a fifth whole tile).
    "dsv3-l1-rows520": ("nt", 128, 4096, 7168, 66560, "uniform"),
    "dsv3-l1-rows576": ("nt", 128, 4096, 7168, 73728, "uniform"),
    "dsv3-l1-rows640": ("nt", 128, 4096, 7168, 81920, "uniform"),
    "tiny": ("nt", 8, 256, 512, 256, "uniform"),
    # Ragged groups: sizes of any value, empty groups and sizes that are not multiples of 16 or BLOCK_M included.
    # torch._grouped_mm may refuse such offsets: then only correctness is reported.
    "ragged-nt": ("nt", 16, 512, 1024, 3001, "ragged"),
    "ragged-nn": ("nn", 16, 512, 1024, 3001, "ragged"),
    "ragged-tn": ("tn", 16, 512, 1024, 3001, "ragged"),
    "qwen3-l1": ("nt", 128, 3072, 4096, 65536, "uniform"),
    "mixtral-l1": ("nt", 8, 28672, 4096, 16384, "uniform"),
}
FP8_CASES = ("dsv3-ep2-l1", "dsv3-ep2-l2", "dsv3-ep8-l1", "dsv3-ep2-l1-random", "dsv3-ep2-l2-random", "qwen3-l1",
             "mixtral-l1", "tiny", "ragged-nt")  # CASES' NT shapes with N, K multiples of 128 and K >= 256


def group_sizes(dist, total, E, gen):
    """The rows of each of E groups of a CASES entry (distribution `dist`, about `total` rows in all)."""
    if dist == "zipf":
        return zipf_sizes(total, E, 1.2, 16, gen)
    if dist == "random":
        return torch.bincount(torch.randint(0, E, (total,), generator=gen), minlength=E)
    if dist == "ragged":
        sizes = torch.randint(0, 2 * total // E, (E,), generator=gen)
        sizes[torch.randperm(E, generator=gen)[:3]] = 0  # three empty groups
        sizes[-1] = 0
        sizes[0] += total - int(sizes.sum()) if int(sizes.sum()) < total else 0
        return sizes
    return torch.full((E,), total // E, dtype=torch.long)


def zipf_weights(experts, s, gen):
    """Zipf popularity 1 / rank^s over the experts in a random order; sums to 1."""
    w = torch.tensor([1.0 / (i + 1) ** s for i in range(experts)])
    w = w[torch.randperm(experts, generator=gen)]
    return w / w.sum()


def zipf_sizes(total, experts, s, align, gen):
    sizes = torch.floor(zipf_weights(experts, s, gen) * total / align).long() * align
    sizes[torch.argmax(sizes)] += total - int(sizes.sum())
    return sizes


def presets(lib=None):
    """The layer bench's model shapes, {name: {hidden, intermediate, experts, topk}}: every model of the model table
    (compiler/abi/Models.h, read from libmegamoe at `lib`, default the package's search; `megamoe-cache presets`
    prints the same table); --hidden / --intermediate / --experts / --topk override a preset's."""
    from .._lib import Library
    return {m["name"]: {k: m[k] for k in ("hidden", "intermediate", "experts", "topk")}
            for m in Library.get(lib).models()}


ROUTINGS = ("uniform", "remote", "zipf", "hot")
# balanced: token t of rank r (global position g = r * T + t) picks experts (g * topk + j) mod E, so that every
# expert receives the same rows, whole 128-row tiles where T * topk * ranks / E is a multiple of 128: the anchor
# random routing is compared with (issue 24: ragged groups). shuffled: the same positions drawn in a random order
# (one permutation of all ranks' positions) and the experts relabelled at random, so every expert still receives the
# same rows, but each token's picks and each expert's tokens are as scattered as under uniform routing (balanced
# gives token t experts t * topk .. + topk - 1, every 16th token to one expert). Neither is in the default list.
OPTIONAL_ROUTINGS = ("balanced", "shuffled")
TOKEN_CASES = ((777, 8192), (0, 1), (1, 0), (8192, 0))  # (rank 0, other ranks), clipped to --tokens


def whole_tile_picks(kind, rank, world, n, experts, topk, gen):
    """topk_idx (int64, CPU) of rank `rank`'s n tokens under balanced or shuffled routing (OPTIONAL_ROUTINGS): global
    position g = rank * n + t picks experts (g * topk + j) mod E; shuffled first maps g through one permutation of
    all world * n positions and then relabels the experts, both drawn from gen (the same draws on every rank)."""
    g = torch.arange(n, dtype=torch.int64) + rank * n
    if kind == "shuffled":
        positions = torch.randperm(world * n, generator=gen)
        labels = torch.randperm(experts, generator=gen)
        g = positions[g]
    idx = (g.unsqueeze(1) * topk + torch.arange(topk)) % experts
    return labels[idx] if kind == "shuffled" else idx
