"""The layer as a PyTorch user writes it, which the layer bench times ours against (all_to_all_single,
torch._grouped_mm, index_add_; with autograd for the backward), and the distributed fp32 reference of forward and
backward written the same way."""
import torch
import torch.distributed as dist
import torch.nn.functional as F


def counts_of(bucket, n):
    """Histogram of int64 bucket ids on the device, without a host sync (torch.bincount synchronises)."""
    return torch.zeros(n, dtype=torch.long, device=bucket.device).scatter_add_(0, bucket, torch.ones_like(bucket))


def exchange(inp, n_out, out_splits, in_splits, differentiable=False):
    """all_to_all_single of the rows of inp (in_splits rows to each rank), n_out rows back (out_splits from each).
    differentiable: torch.distributed.nn's all_to_all_single, whose backward is the exchange the other way."""
    out = inp.new_empty((n_out,) + tuple(inp.shape[1:]))
    if differentiable:
        import torch.distributed.nn.functional as dist_nn
        return dist_nn.all_to_all_single(out, inp, out_splits, in_splits)
    dist.all_to_all_single(out, inp, out_splits, in_splits)
    return out


class Routing:
    """The pipeline's routing: picks sorted by (owner rank, expert) with the -1 picks last, all_to_all_single of the
    counts (one host sync for the split sizes) and of the local expert ids. token / pick: of each row sent (in send
    order); local: the local expert of each row received; order: the received rows sorted by local expert; sizes:
    rows per local expert (a device tensor)."""

    def __init__(self, idx, own):
        world = dist.get_world_size()
        K = idx.shape[1]
        flat = idx.reshape(-1).long()
        expert, pick = torch.sort(torch.where(flat >= 0, flat, own * world), stable=True)  # the -1 picks last
        counts = counts_of(expert // own, world + 1)  # per owner rank, then the -1 picks
        recv = torch.empty(world, dtype=torch.long, device=idx.device)
        dist.all_to_all_single(recv, counts[:world])
        splits = torch.cat([counts[:world], recv]).tolist()
        self.send_splits, self.recv_splits = splits[:world], splits[world:]
        self.n_send, self.n_recv = sum(self.send_splits), sum(self.recv_splits)
        expert, self.pick = expert[:self.n_send], pick[:self.n_send]
        self.token = self.pick // K
        self.local = exchange(expert % own, self.n_recv, self.recv_splits, self.send_splits)
        self.order = torch.argsort(self.local, stable=True)
        self.sizes = counts_of(self.local, own)

    def send(self, rows, differentiable=False):
        """Rows in send order to their owners."""
        return exchange(rows, self.n_recv, self.recv_splits, self.send_splits, differentiable)

    def back(self, rows, differentiable=False):
        """Received rows back to their home ranks (in send order there)."""
        return exchange(rows, self.n_send, self.send_splits, self.recv_splits, differentiable)


def torch_moe(x, idx, wts, w1, w2, experts, differentiable=False):
    """The layer as a PyTorch user writes it: Routing, then all_to_all_single of the rows; experts(rows, sizes, w1,
    w2) on the rows sorted by local expert; all_to_all_single back; weighted sum in fp32. Returns y fp32 [T, H].
    differentiable: the exchanges through torch.distributed.nn (autograd reaches x, wts, w1, w2)."""
    T, H = x.shape
    rt = Routing(idx, w1.shape[0])
    rows = rt.send(x[rt.token], differentiable)
    out_sorted = experts(rows[rt.order], rt.sizes, w1, w2)
    out = torch.empty_like(out_sorted)
    out[rt.order] = out_sorted
    back = rt.back(out, differentiable)
    y = torch.zeros(T, H, dtype=torch.float32, device=x.device)
    y.index_add_(0, rt.token, back * wts.reshape(-1)[rt.pick, None])  # bf16 x fp32 -> fp32 in one pass, no copy
    return y


def torch_forward(x, idx, wts, w1, w2, experts, differentiable=False):
    """torch_moe's y in the layer's dtype (bf16): the PyTorch pipeline as every timing of it runs it."""
    return torch_moe(x, idx, wts, w1, w2, experts, differentiable).to(torch.bfloat16)


def reference_fwd_bwd(x, idx, wts, dy, w1, w2, per_expert):
    """The layer's forward and backward in fp32, distributed as torch_moe: x's and dy's rows and the picks' routing
    weights go to the owners; there, autograd of each expert's share of <dy, y> (sum over its rows of
    w <dy, (silu(gate) * up) . w2[e]^T>, [gate|up] = x . w1[e]^T) gives each row's dx and d_topk_weight and the
    expert's dW1, dW2 (fp32, handed to per_expert(e, rows, dw1, dw2) one expert at a time: no fp32 copy of the
    weights or their gradients is kept); the rows' dx and d_topk_weights go back home, where dx is summed per token
    (the adjoints of the exchange and of the gather x[token]). Returns y, dx fp32 [T, H], d_topk_weights fp32
    [T, topk] (0 for the -1 picks)."""
    T, K = idx.shape
    H, I = x.shape[1], w2.shape[2]
    rt = Routing(idx, w1.shape[0])
    rows, dy_rows = rt.send(x[rt.token]), rt.send(dy[rt.token])
    w_rows = rt.send(wts.reshape(-1)[rt.pick].contiguous())
    out = torch.zeros(rt.n_recv, H, dtype=torch.float32, device=x.device)
    dx_rows, dw_rows = torch.zeros_like(out), torch.zeros(rt.n_recv, dtype=torch.float32, device=x.device)
    lo = 0
    for e, n in enumerate(rt.sizes.tolist()):
        sel = rt.order[lo:lo + n]
        lo += n
        leaves = [t.requires_grad_() for t in (rows[sel].float(), w_rows[sel], w1[e].float(), w2[e].float())]
        xe, we, w1e, w2e = leaves
        with torch.enable_grad():
            h = xe @ w1e.t()
            o = ((F.silu(h[:, :I]) * h[:, I:]) @ w2e.t()) * we[:, None]
            gx, gw, g1, g2 = torch.autograd.grad((o * dy_rows[sel].float()).sum(), leaves)
        out[sel], dx_rows[sel], dw_rows[sel] = o.detach(), gx, gw
        per_expert(e, n, g1, g2)
        del leaves, xe, we, w1e, w2e, h, o, gx, gw, g1, g2
    y = torch.zeros(T, H, dtype=torch.float32, device=x.device).index_add_(0, rt.token, rt.back(out))
    dx = torch.zeros(T, H, dtype=torch.float32, device=x.device).index_add_(0, rt.token, rt.back(dx_rows))
    dw = torch.zeros(T * K, dtype=torch.float32, device=x.device)
    dw[rt.pick] = rt.back(dw_rows)
    return y, dx, dw.view(T, K)


def experts_fp32(rows, sizes, w1, w2):
    """The reference's expert MLP: one fp32 matmul pair per expert, SwiGLU in fp32."""
    I = w2.shape[2]
    out = torch.empty(rows.shape[0], w2.shape[1], dtype=torch.float32, device=rows.device)
    lo = 0
    for e, n in enumerate(sizes.tolist()):
        if n:
            h = rows[lo:lo + n].float() @ w1[e].float().t()
            out[lo:lo + n] = (F.silu(h[:, :I]) * h[:, I:]) @ w2[e].float().t()
        lo += n
    return out


class GroupedMMBackward(torch.autograd.Function):
    """torch._grouped_mm(a, b, offs) (a [rows, K], b [E, K, N], offs the group ends) with the backward written by
    hand the way a user writes it in grouped GEMMs, for a torch whose _grouped_mm has none: dgrad da = dc . b[e]^T
    (the weights transposed), wgrad db[e] = a_e^T dc_e (the 2d x 2d form)."""

    @staticmethod
    def forward(ctx, a, b, offs):
        ctx.save_for_backward(a, b, offs)
        return torch._grouped_mm(a, b, offs=offs)

    @staticmethod
    def backward(ctx, dc):
        a, b, offs = ctx.saved_tensors
        dc = dc.contiguous()
        da = db = None
        if ctx.needs_input_grad[0]:
            da = torch._grouped_mm(dc, b.transpose(-2, -1), offs=offs)
        if ctx.needs_input_grad[1]:
            try:  # A^T as a view: leading dimension K, any row count
                db = torch._grouped_mm(a.t(), dc, offs=offs)
            except RuntimeError:  # a torch that wants A^T row-major
                db = torch._grouped_mm(a.t().contiguous(), dc, offs=offs)
        return da, db, None


class GroupedMM:
    """torch._grouped_mm over groups whose sizes are a device tensor. If this torch refuses group ends that are not
    multiples of 16, every group is padded to a multiple of 16 rows with zero rows (padded then says so; pad=True:
    from the start). backward: "torch" (autograd of torch._grouped_mm itself) or "manual" (GroupedMMBackward)."""

    def __init__(self, backward="torch", pad=False):
        self.padded = pad
        self.backward = backward

    def mm(self, a, bt, offs):
        if self.backward == "manual" and torch.is_grad_enabled() and (a.requires_grad or bt.requires_grad):
            return GroupedMMBackward.apply(a, bt, offs)
        return torch._grouped_mm(a, bt, offs=offs)

    def __call__(self, a, bt, sizes):
        if not self.padded:
            try:
                return self.mm(a, bt, torch.cumsum(sizes, 0).to(torch.int32))
            except RuntimeError:
                pass
        out = self.padded_mm(a, bt, sizes)
        self.padded = True
        return out

    def padded_mm(self, a, bt, sizes):
        padded = (sizes + 15) // 16 * 16
        ends = torch.cumsum(padded, 0)
        n = a.shape[0]
        group = torch.repeat_interleave(torch.arange(len(sizes), device=a.device), sizes, output_size=n)
        pos = (ends - padded)[group] + torch.arange(n, device=a.device) - (torch.cumsum(sizes, 0) - sizes)[group]
        ap = a.new_zeros(int(ends[-1]), a.shape[1])
        ap[pos] = a
        return self.mm(ap, bt, ends.to(torch.int32))[pos]

    def experts(self, rows, sizes, w1, w2):
        """The pipeline's expert MLP in bf16: two grouped GEMMs, SwiGLU between."""
        I = w2.shape[2]
        h = self(rows, w1.transpose(-2, -1), sizes)
        return self(F.silu(h[:, :I]) * h[:, I:], w2.transpose(-2, -1), sizes)


def grouped_mm_for_backward():
    """The GroupedMM of the PyTorch pipeline's forward + backward, and why: the first of autograd of torch._grouped_mm,
    then the backward written by hand (GroupedMMBackward), each unpadded then padded, that runs and agrees with an
    fp32 reference on a small expert MLP (groups of 16 and 37 rows: ends that are not multiples of 16)."""
    E, H, I = 2, 64, 32
    sizes = torch.tensor([16, 37], device="cuda")
    n = int(sizes.sum())
    bf16 = lambda *shape: torch.randn(*shape, device="cuda").to(torch.bfloat16)
    inputs, dout = (bf16(n, H), bf16(E, 2 * I, H), bf16(E, H, I)), bf16(n, H)
    leaves = [t.float().requires_grad_() for t in inputs]
    with torch.enable_grad():
        ref = torch.autograd.grad(experts_fp32(leaves[0], sizes, leaves[1], leaves[2]), leaves, dout.float())
    tried = []
    for mode, pad in (("torch", False), ("torch", True), ("manual", False), ("manual", True)):
        gmm = GroupedMM(mode, pad)
        what = "%s%s" % ("autograd of torch._grouped_mm" if mode == "torch" else "the backward written by hand",
                         " (groups padded to 16 rows)" if pad else "")
        try:
            leaves = [t.clone().requires_grad_() for t in inputs]
            with torch.enable_grad():
                grads = torch.autograd.grad(gmm.experts(leaves[0], sizes, leaves[1], leaves[2]), leaves, dout)
            err = max(float((g.float() - r).norm() / r.norm()) for g, r in zip(grads, ref))
        except Exception as e:
            tried.append("%s failed: %s" % (what, ("%s: %s" % (type(e).__name__, e)).splitlines()[0]))
            continue
        if err <= 5e-2:
            return gmm, "; ".join(tried + ["%s (probe err vs fp32 %.1e)" % (what, err)])
        tried.append("%s: probe err vs fp32 %.1e" % (what, err))
    raise RuntimeError("no backward for the PyTorch pipeline: " + "; ".join(tried))
