"""The package's CPU tier (no GPU): it imports, checks arguments at the boundary, and its bindings drive the C ABI
against the fake HIP backend (tests/host/runtime/FakeHip.cpp; its "device memory" is host memory) with stand-in
layer kernels (megamoe_fake_layer_cache): workspaces, layers, forward and backward calls, saved state, errors."""
import ctypes
import logging
import math
import os
import re
import stat
import subprocess
import sys

import pytest

from conftest import BUILD

torch = pytest.importorskip("torch")
import megamoe  # noqa: E402
from megamoe import _lib  # noqa: E402

FAKE_HIP = os.path.join(BUILD, "lib", "libamdhip64_fake.so")
FAKE_CACHE = os.path.join(BUILD, "bin", "megamoe_fake_layer_cache")
LIB = os.path.join(BUILD, "lib", "libmegamoe.so")
SHAPE = dict(hidden=512, intermediate=256, experts=16, topk=4)
MAX_TOKENS = 64

if not all(os.path.exists(p) for p in (FAKE_HIP, FAKE_CACHE, LIB)):
    pytest.skip("the build folder %s lacks libmegamoe.so, the fake HIP library or megamoe_fake_layer_cache "
                "(build it first)" % BUILD, allow_module_level=True)


@pytest.fixture(autouse=True)
def fake_env(monkeypatch, tmp_path):
    monkeypatch.setenv("MEGAMOE_LIB", LIB)
    monkeypatch.setenv("MEGAMOE_HIP_LIBRARY", FAKE_HIP)
    monkeypatch.setenv("MEGAMOE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MEGAMOE_JIT", "0")
    yield tmp_path / "cache"


def fill_cache(cache, hidden=512, intermediate=256, experts=16, topk=4, ranks=1):
    subprocess.run([FAKE_CACHE, str(cache), str(hidden), str(intermediate), str(experts), str(topk),
                    str(MAX_TOKENS), str(ranks)], check=True)


@pytest.fixture
def ws(fake_env):
    fill_cache(fake_env)
    w = megamoe.Workspace(max_tokens=MAX_TOKENS, backend="hip", _host_tensors=True, **SHAPE)
    yield w
    w.close()


def fake_launches():
    return ctypes.CDLL(FAKE_HIP).fakehip_launch_count()


def inputs(T=10, idx_dtype=torch.int32, grad=True):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(T, 512, generator=g).to(torch.bfloat16).requires_grad_(grad)
    idx = torch.stack([torch.randperm(16, generator=g)[:4] for _ in range(max(T, 1))])[:T].to(idx_dtype)
    w = torch.rand(T, 4, generator=g).requires_grad_(grad)
    w1 = torch.randn(16, 512, 512, generator=g).to(torch.bfloat16).requires_grad_(grad)
    w2 = torch.randn(16, 512, 256, generator=g).to(torch.bfloat16).requires_grad_(grad)
    return x, idx, w, w1, w2


# ---- the bindings ----

def test_library_found_and_versioned():
    lib = _lib.Library.get(LIB)
    assert lib.version() == megamoe.__version__
    assert lib.status_name(_lib.KERNEL_NOT_FOUND) == "kernel not found"
    assert _lib.library_candidates()[0] == LIB  # $MEGAMOE_LIB first


def test_missing_library_names_every_place_tried(monkeypatch):
    monkeypatch.delenv("MEGAMOE_LIB", raising=False)
    monkeypatch.setattr(_lib, "library_candidates", lambda: ["/nonexistent/a/libmegamoe.so", "/nonexistent/b.so"])
    monkeypatch.setattr(ctypes, "CDLL", lambda name: (_ for _ in ()).throw(OSError("loader: no " + name)))
    with pytest.raises(OSError, match="libmegamoe.so not found; tried: /nonexistent/a/libmegamoe.so "
                                      r"\(no such file\); /nonexistent/b.so \(no such file\); libmegamoe.so.0 "
                                      "through the dynamic loader"):
        _lib.Library()


def test_a_library_asked_for_is_that_one_or_an_error_naming_it(monkeypatch):
    # A missing MEGAMOE_LIB never falls back to another libmegamoe.so (here build/lib's, which exists).
    monkeypatch.setenv("MEGAMOE_LIB", "/nonexistent/libmegamoe.so")
    with pytest.raises(OSError, match=r"the library MEGAMOE_LIB names cannot be loaded: "
                                      r"/nonexistent/libmegamoe.so \(no such file\)"):
        _lib.Library()
    with pytest.raises(OSError, match=r"the library asked for cannot be loaded: /nonexistent/x.so \(no such file\)"):
        _lib.Library("/nonexistent/x.so")
    # A shared library that is not megamoe's (the fake HIP runtime) is refused by name, not bound and called.
    monkeypatch.setenv("MEGAMOE_LIB", FAKE_HIP)
    with pytest.raises(OSError, match="the library MEGAMOE_LIB names cannot be loaded: %s \\(not libmegamoe"
                                      % re.escape(FAKE_HIP)):
        _lib.Library()
    monkeypatch.setenv("MEGAMOE_LIB", LIB)
    assert _lib.Library().path == LIB


def test_the_packages_variables_are_as_strict_as_the_runtimes(monkeypatch, tmp_path):
    from megamoe import kernels
    for value, on in (("0", False), ("1", True)):
        monkeypatch.setenv("MEGAMOE_JIT", value)
        assert kernels.jit_enabled() is on
    for value in ("false", "off", "", "yes"):
        monkeypatch.setenv("MEGAMOE_JIT", value)
        with pytest.raises(megamoe.MegamoeError, match="MEGAMOE_JIT='%s' is invalid: expected 0 or 1" % value) as e:
            kernels.jit_enabled()
        assert e.value.status == _lib.INVALID_ENV
    plain = tmp_path / "megamoe-cache"
    plain.write_text("#!/bin/sh\n")
    for path, why in ((plain, "not executable"), (tmp_path / "absent", "no such file")):
        monkeypatch.setenv("MEGAMOE_CACHE_TOOL", str(path))
        with pytest.raises(megamoe.MegamoeError, match="MEGAMOE_CACHE_TOOL='%s' is invalid: .*%s" % (path, why)):
            kernels.cache_tool()
    plain.chmod(0o755)
    monkeypatch.setenv("MEGAMOE_CACHE_TOOL", str(plain))
    assert kernels.cache_tool() == str(plain)


def test_a_cpu_only_torch_is_refused_by_name(monkeypatch):
    import torch
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    with pytest.raises(megamoe.MegamoeError, match="Workspace needs a CUDA or ROCm build of PyTorch; this torch .* "
                                                   "is built for the CPU only") as e:
        megamoe.Workspace(hidden=64, intermediate=64, experts=4, topk=2, max_tokens=16)
    assert e.value.status == _lib.UNSUPPORTED


def test_layer_config_matches_the_header():
    # megamoe.h's megamoe_layer_config: struct_size, then its int64 fields in order, each one the package knows.
    import re
    header = open(os.path.join(os.path.dirname(__file__), "..", "..", "..", "runtime", "include", "megamoe",
                               "megamoe.h")).read()
    body = header[header.index("typedef struct megamoe_layer_config {"):header.index("} megamoe_layer_config;")]
    assert tuple(re.findall(r"^\s*int64_t (\w+);", body, re.M)) == _lib.CONFIG_FIELDS
    assert ctypes.sizeof(_lib.LayerConfig) == 8 + len(_lib.CONFIG_FIELDS) * 8
    assert _lib.LayerConfig(hidden=1).struct_size == ctypes.sizeof(_lib.LayerConfig)


def test_fake_devices_and_runtime():
    lib = _lib.Library.get(LIB)
    assert lib.device_count("hip") == 4  # the fake's default
    rt = _lib.Runtime("hip", 1, lib)
    assert rt.target == "gfx950"
    rt.close()
    with pytest.raises(megamoe.MegamoeError) as e:
        _lib.Runtime("hip", 7, lib)
    assert e.value.status != _lib.OK


def test_sizes_before_allocation():
    lib = _lib.Library.get(LIB)
    train = _lib.LayerConfig(max_tokens=MAX_TOKENS, training=1, **SHAPE)
    infer = _lib.LayerConfig(max_tokens=MAX_TOKENS, training=0, **SHAPE)
    heap, buffers = lib.workspace_bytes(train, 1)
    heap0, buffers0 = lib.workspace_bytes(infer, 1)
    assert heap > 0 and buffers > buffers0  # training adds dh
    saved = lib.saved_bytes(train, 1)
    assert saved > 0 and saved % (2 * 256 * 2) == 0  # received rows x 2I bf16
    assert lib.saved_bytes(infer, 1) == 0
    assert lib.saved_bytes(_lib.LayerConfig(max_tokens=2 * MAX_TOKENS, training=1, **SHAPE), 1) > saved


def test_invalid_config_names_the_field():
    lib = _lib.Library.get(LIB)
    with pytest.raises(megamoe.MegamoeError) as e:
        lib.workspace_bytes(_lib.LayerConfig(hidden=12, intermediate=256, experts=16, topk=4, max_tokens=64), 1)
    assert e.value.status == _lib.INVALID_ARGUMENT and "hidden=12" in str(e.value)


def test_config_fields_are_integers_in_the_int64_range():
    # int(v) and ctypes' int64 used to make hidden=2**64+512 into 512, 512.9 into 512 and a clamp of 2**64 into 0 (off)
    base = dict(SHAPE, max_tokens=MAX_TOKENS)
    with pytest.raises(ValueError, match="LayerConfig.hidden=18446744073709552128 is out of range"):
        _lib.LayerConfig(**dict(base, hidden=2 ** 64 + 512))
    with pytest.raises(TypeError, match="LayerConfig.hidden must be an integer"):
        _lib.LayerConfig(**dict(base, hidden=512.9))
    with pytest.raises(ValueError, match="LayerConfig.swiglu_clamp_milli=18446744073709551616 is out of range"):
        _lib.LayerConfig(**dict(base, swiglu_clamp_milli=2 ** 64))
    with pytest.raises(ValueError, match="LayerConfig.max_tokens"):
        _lib.LayerConfig(**dict(base, max_tokens=-2 ** 63 - 1))
    ok = _lib.LayerConfig(**dict(base, training=True, hidden=torch.tensor(512), swiglu_clamp_milli=2 ** 63 - 1))
    assert ok.training == 1 and ok.hidden == 512 and ok.swiglu_clamp_milli == 2 ** 63 - 1


def test_int_arguments_of_the_c_abi_are_range_checked(fake_env):
    lib = _lib.Library.get(LIB)
    cfg = _lib.LayerConfig(max_tokens=MAX_TOKENS, training=1, **SHAPE)
    with pytest.raises(ValueError, match="ranks=4294967297 is out of range"):
        lib.workspace_bytes(cfg, 2 ** 32 + 1)
    with pytest.raises(TypeError, match="ranks must be an integer"):
        lib.saved_bytes(cfg, 1.5)
    with pytest.raises(ValueError, match="device ordinal=4294967296 is out of range"):
        _lib.Runtime("hip", 2 ** 32, lib)
    rt = _lib.Runtime("hip", 0, lib)
    try:
        with pytest.raises(ValueError, match="rank=4294967296 is out of range"):
            _lib.WorkspaceHandle.create(rt, cfg, 2 ** 32, 1)
        with pytest.raises(ValueError, match="tokens=18446744073709551617 is out of range"):
            _lib.LayerHandle(lib, ctypes.c_void_p(), cfg).forward(0, 2 ** 64 + 1, 0, 0, 0, 0, 0, 0)
    finally:
        rt.close()
    with pytest.raises(TypeError, match="max_tokens must be an integer"):
        megamoe.Workspace(max_tokens=64.5, backend="hip", _host_tensors=True, **SHAPE)


def test_launch_by_name_refuses_unknown_and_missing_arguments(fake_env):
    fill_cache(fake_env)
    rt = _lib.Runtime("hip", 0)
    k = rt.kernel("epoch_advance", [])
    names = [n for n, _ in k.signature]
    assert names  # declared in compiler/abi/Kernels.def
    with pytest.raises(TypeError, match="missing"):
        rt.launch(k, (1, 1, 1), 0)
    with pytest.raises(TypeError, match="unknown \\['bogus'\\]"):
        rt.launch(k, (1, 1, 1), 0, bogus=1, **{n: 0 for n in names})
    before = fake_launches()
    rt.launch(k, (1, 1, 1), 0, **{n: 0 for n in names})
    assert fake_launches() == before + 1
    # A kernel that declares an argument named grid (topk_idx_narrow, the grouped GEMMs): it is the kernel's, not
    # the launch's grid.
    narrow = rt.kernel("topk_idx_narrow", [])
    assert "grid" in [n for n, _ in narrow.signature]
    rt.launch(narrow, (2, 1, 1), 0, **{n: 0 for n, _ in narrow.signature})
    assert fake_launches() == before + 2
    # Values outside their kind's range are refused by name (ctypes would wrap 2^31 into -2^31), as is a grid
    # outside [1, 2^31).
    kinds = dict(narrow.signature)
    i32 = next(n for n, kind in kinds.items() if kind == _lib.ARG_I32)
    with pytest.raises(ValueError, match="topk_idx_narrow: %s=2147483648 must be an int in" % i32):
        rt.launch(narrow, (2, 1, 1), 0, **dict({n: 0 for n in kinds}, **{i32: 2 ** 31}))
    ptr = next(n for n, kind in kinds.items() if kind == _lib.ARG_PTR)
    with pytest.raises(ValueError, match="%s=-1 must be an int" % ptr):
        rt.launch(narrow, (2, 1, 1), 0, **dict({n: 0 for n in kinds}, **{ptr: -1}))
    with pytest.raises(ValueError, match=r"grid must be three ints in \[1, 2\^31\)"):
        rt.launch(narrow, (2 ** 32 + 3, 1, 1), 0, **{n: 0 for n in kinds})
    assert fake_launches() == before + 2
    rt.close()


# ---- the workspace and the op on the fake backend ----

def test_cache_miss_names_the_whole_layer_command():
    with pytest.raises(megamoe.MegamoeError) as e:
        megamoe.Workspace(max_tokens=MAX_TOKENS, backend="hip", _host_tensors=True, **SHAPE)
    assert e.value.status == _lib.KERNEL_NOT_FOUND
    assert ("megamoe-cache generate --hidden 512 --intermediate 256 --experts 16 --topk 4 --ep 1 --targets gfx950"
            in str(e.value))


def test_jit_compiles_on_a_miss_and_says_so(fake_env, tmp_path, monkeypatch, caplog):
    # A stand-in megamoe-cache: `generate --hidden H --intermediate I --experts E --topk K --ep R ...` fills the cache.
    tool = tmp_path / "megamoe-cache"
    tool.write_text("#!/bin/sh\n# $1=generate\nshift\nwhile [ $# -gt 0 ]; do case $1 in --hidden) H=$2;; "
                    "--intermediate) I=$2;; --experts) E=$2;; --topk) K=$2;; --ep) R=$2;; esac; shift; done\n"
                    "exec %s \"$MEGAMOE_CACHE_DIR\" $H $I $E $K %d $R\n" % (FAKE_CACHE, MAX_TOKENS))
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("MEGAMOE_CACHE_TOOL", str(tool))
    monkeypatch.setenv("MEGAMOE_JIT", "1")
    with caplog.at_level(logging.WARNING, logger="megamoe"):
        w = megamoe.Workspace(max_tokens=MAX_TOKENS, backend="hip", _host_tensors=True, **SHAPE)
    assert any("compiling them now (JIT)" in r.getMessage() for r in caplog.records)
    assert len(w.layers) == 4  # inference and training, int32 and int64 topk_idx
    w.close()


def test_jit_rebuilds_kernels_only_another_generator_made(tmp_path, monkeypatch):
    # The runtime refuses cache entries of another kernel generator (STALE_KERNEL): with a compiler installed the
    # package generates them again, as for a miss, and loads once more.
    args = tmp_path / "args"
    tool = tmp_path / "megamoe-cache"
    tool.write_text("#!/bin/sh\necho \"$@\" > %s\n" % args)
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("MEGAMOE_CACHE_TOOL", str(tool))
    monkeypatch.setenv("MEGAMOE_JIT", "1")
    calls = []

    def load():
        calls.append(1)
        if len(calls) == 1:
            raise _lib.MegamoeError(_lib.STALE_KERNEL, "built by kernel generator 0123456789abcdef")
        return "loaded"
    assert megamoe.kernels.with_kernels(load, "megamoe-cache generate --kernel k", "the layer") == "loaded"
    assert args.read_text().split() == ["generate", "--kernel", "k", "--quiet"]
    monkeypatch.setenv("MEGAMOE_JIT", "0")
    calls.clear()
    with pytest.raises(_lib.MegamoeError, match="generate them with"):
        megamoe.kernels.with_kernels(load, "megamoe-cache generate --kernel k", "the layer")


def test_forward_and_backward_launch_on_the_fake(ws):
    x, idx, wts, w1, w2 = inputs()
    before = fake_launches()
    y = megamoe.fused_moe(x, idx, wts, w1, w2, ws)
    forward_launches = fake_launches() - before
    assert y.shape == x.shape and y.dtype == torch.bfloat16 and y.requires_grad
    assert forward_launches >= 3  # prologue, dispatch + L1, L2 + combine, epoch
    y.float().sum().backward()
    assert fake_launches() - before > 2 * forward_launches  # the backward's five stages
    for t in (x, wts, w1, w2):
        assert t.grad is not None and t.grad.shape == t.shape and t.grad.dtype == t.dtype


def test_inference_uses_the_layer_without_saved_state(ws, monkeypatch):
    x, idx, wts, w1, w2 = inputs(grad=False)
    used = []
    for key, layer in ws.layers.items():
        orig = layer.handle.forward
        monkeypatch.setattr(layer.handle, "forward",
                            lambda *a, key=key, orig=orig, **k: (used.append((key, k.get("saved"))), orig(*a, **k)))
    megamoe.fused_moe(x, idx, wts, w1, w2, ws)
    with torch.no_grad():
        megamoe.fused_moe(x, idx.long(), wts, w1, w2, ws)
    assert [(k[4], k[5], s) for k, s in used] == [(False, 32, None), (False, 64, None)]


def test_saved_state_is_a_torch_tensor_per_forward_and_backwards_run_in_any_order(ws, monkeypatch):
    layer = ws.layer(training=True, topk_idx_bits=32, **SHAPE)
    seen = {"forward": [], "backward": []}
    for name in seen:
        orig = getattr(layer.handle, name)
        monkeypatch.setattr(layer.handle, name,
                            lambda *a, name=name, orig=orig, **k: (seen[name].append(k["saved"]), orig(*a, **k)))
    ys = []
    for i in range(3):
        x, idx, wts, w1, w2 = inputs()
        ys.append(megamoe.fused_moe(x, idx, wts, w1, w2, ws))
    assert len(set(seen["forward"])) == 3 and all(seen["forward"])  # three distinct saved tensors in flight
    for i in (1, 2, 0):
        ys[i].float().sum().backward()
    assert seen["backward"] == [seen["forward"][i] for i in (1, 2, 0)]  # each backward reads its own forward's


def test_saved_tensor_has_the_layers_saved_bytes(ws):
    from megamoe.ops import _fused_moe_call
    x, idx, wts, w1, w2 = inputs()
    layer = ws.layer(training=True, topk_idx_bits=32, **SHAPE)
    cfg = _lib.LayerConfig(max_tokens=MAX_TOKENS, training=1, **SHAPE)
    y, saved = _fused_moe_call(x, idx, wts, w1, w2, layer.id, True)
    assert saved.dtype == torch.uint8 and saved.numel() == layer.saved_bytes == ws.lib.saved_bytes(cfg, 1)
    assert not saved.requires_grad and saved.data_ptr() % 16 == 0


def test_zero_tokens_still_call_the_layer(ws):
    x, idx, wts, w1, w2 = inputs(T=0)
    before = fake_launches()
    y = megamoe.fused_moe(x, idx, wts, w1, w2, ws)
    assert y.shape == (0, 512) and fake_launches() > before  # an empty rank still takes part in the exchange


def test_four_layers_on_one_workspace(ws):
    layers = [megamoe.MoeExperts(512, 256, 16, 4, ws) for _ in range(4)]
    x, idx, wts, _, _ = inputs()
    h = x
    for m in layers:
        h = m(h, idx, wts)
    h.float().sum().backward()
    assert all(m.w1.grad is not None and m.w2.grad is not None for m in layers)
    assert len(ws.layers) == 4  # one shape: the modules share the workspace's layers


def test_smaller_layer_fits_the_workspace(ws, fake_env):
    fill_cache(fake_env, 256, 128, 16, 2)
    m = megamoe.MoeExperts(256, 128, 16, 2, ws)
    assert (256, 128, 16, 2, True, 32, "bf16") in ws.layers
    x = torch.randn(3, 256).bfloat16()
    idx = torch.tensor([[0, 15], [1, 2], [3, -1]], dtype=torch.int32)
    assert m(x, idx, torch.rand(3, 2)).shape == x.shape
    with pytest.raises(megamoe.MegamoeError, match="experts=32 exceeds the workspace's experts=16"):
        megamoe.MoeExperts(512, 256, 32, 4, ws)
    # The arrival counters are laid out by the workspace's experts: fewer would read another layer's stale counts.
    fill_cache(fake_env, 256, 128, 8, 2)
    with pytest.raises(megamoe.MegamoeError, match="experts=8 must equal the workspace's experts=16"):
        megamoe.MoeExperts(256, 128, 8, 2, ws)


# ---- boundary checks ----

def check_error(ws, match, **changes):
    args = dict(zip(("x", "topk_idx", "topk_weights", "w1", "w2"), inputs(grad=False)))
    args.update(changes)
    with pytest.raises(megamoe.ArgumentError, match=match):
        megamoe.fused_moe(args["x"], args["topk_idx"], args["topk_weights"], args["w1"], args["w2"], ws)


def test_dtype_rules(ws):
    x, idx, wts, w1, w2 = inputs(grad=False)
    check_error(ws, r"fused_moe: x must be bfloat16 \(got float32\)", x=x.float())
    check_error(ws, r"topk_idx must be int32 or int64 \(got float32\)", topk_idx=idx.float())
    check_error(ws, r"topk_weights must be float32 \(got bfloat16\)", topk_weights=wts.bfloat16())
    check_error(ws, r"w1 must be bfloat16", w1=w1.float())
    check_error(ws, r"w2 must be bfloat16", w2=w2.half())
    check_error(ws, r"x must be a torch.Tensor \(got list\)", x=[1, 2])


def test_shape_rules(ws):
    x, idx, wts, w1, w2 = inputs(grad=False)
    check_error(ws, r"x must have 2 dimensions \[tokens, hidden\]", x=x[None])
    check_error(ws, r"topk_idx must have one row per token of x", topk_idx=idx[:5])
    check_error(ws, r"topk_weights must have topk_idx's shape", topk_weights=wts[:, :3])
    check_error(ws, r"w1 must be \[local experts, 2 \* intermediate, hidden=512\]", w1=w1[:, :, :256])
    check_error(ws, r"w2 must be \[local experts=16, hidden=512, intermediate=256\]", w2=w2[:, :, :128])
    check_error(ws, r"w1's second dimension must be even", w1=w1[:, :511])


def test_tokens_above_the_maximum(ws):
    x, idx, wts, _, _ = inputs(T=MAX_TOKENS + 1, grad=False)
    check_error(ws, r"x has 65 tokens, above the workspace's max_tokens=64", x=x, topk_idx=idx, topk_weights=wts)


def test_layer_larger_than_the_workspace(ws):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 1024, generator=g).bfloat16()
    idx = torch.zeros(4, 4, dtype=torch.int32)
    wts = torch.rand(4, 4)
    w1 = torch.zeros(16, 512, 1024, dtype=torch.bfloat16)
    w2 = torch.zeros(16, 1024, 256, dtype=torch.bfloat16)
    check_error(ws, r"hidden=1024 \(from the arguments' shapes\) exceeds the workspace's hidden=512", x=x,
                topk_idx=idx, topk_weights=wts, w1=w1, w2=w2)


def test_contiguity_rule(ws):
    x, idx, wts, w1, w2 = inputs(grad=False)
    check_error(ws, r"w2 must be contiguous \(got strides", w2=w2.transpose(1, 2).contiguous().transpose(1, 2))
    check_error(ws, r"topk_idx must be contiguous", topk_idx=idx.t().contiguous().t())


def test_device_rule(ws):
    x, idx, wts, w1, w2 = inputs(grad=False)
    check_error(ws, r"w1 must be on cpu, the workspace's device \(got meta\)", w1=w1.to("meta"))


def test_alignment_rule(ws):
    x, *_ = inputs(grad=False)
    flat = torch.empty(x.numel() + 1, dtype=torch.bfloat16)
    shifted = flat[1:].view(x.shape)  # 2 bytes past an aligned address
    check_error(ws, r"x must be 16-byte aligned", x=shifted)


def test_the_ops_check_their_arguments_against_the_layer(ws):
    # torch.ops.megamoe.fused_moe (and a compiled or exported graph) reaches the op without fused_moe's checks.
    from megamoe.ops import _fused_moe_backward, _fused_moe_call
    x, idx, wts, w1, w2 = inputs(grad=False)
    layer = ws.layer(training=True, topk_idx_bits=32, **SHAPE)
    before = fake_launches()
    with pytest.raises(megamoe.ArgumentError, match="fused_moe: x must be contiguous"):
        _fused_moe_call(torch.randn(512, 10).bfloat16().t(), idx, wts, w1, w2, layer.id, True)
    with pytest.raises(megamoe.ArgumentError, match=r"\(256, 256, 16, 2, 32\) differ from layer %d's "
                                                    r"\(512, 256, 16, 4, 32\)" % layer.id):
        _fused_moe_call(x[:, :256].contiguous(), idx[:, :2].contiguous(), wts[:, :2].contiguous(),
                        w1[:, :, :256].contiguous(), w2[:, :256].contiguous(), layer.id, True)
    with pytest.raises(megamoe.ArgumentError, match="topk_idx bits"):
        _fused_moe_call(x, idx.long(), wts, w1, w2, layer.id, True)
    with pytest.raises(megamoe.ArgumentError, match="training=False but layer %d was made with training=True" %
                       layer.id):
        _fused_moe_call(x, idx, wts, w1, w2, layer.id, False)
    y, saved = _fused_moe_call(x, idx, wts, w1, w2, layer.id, True)
    with pytest.raises(megamoe.ArgumentError, match=r"fused_moe backward: dy must have x's shape \[10, 512\]"):
        _fused_moe_backward(y[:2], x, idx, wts, w1, w2, saved, layer.id)
    with pytest.raises(megamoe.ArgumentError, match="fused_moe backward: dy must be bfloat16"):
        _fused_moe_backward(y.float(), x, idx, wts, w1, w2, saved, layer.id)
    assert fake_launches() - before == 4  # the one forward that was allowed: prologue, dispatch, combine, epoch


def test_a_dropped_workspace_is_freed_at_once(fake_env):
    import gc
    import weakref
    fill_cache(fake_env)
    w = megamoe.Workspace(max_tokens=MAX_TOKENS, backend="hip", _host_tensors=True, **SHAPE)
    ids = [layer.id for layer in w.layers.values()]
    gone = weakref.ref(w)
    live = ctypes.CDLL(FAKE_HIP).fakehip_live_allocations
    before = live()
    gc.disable()  # no cycle may hold it: freed when the last reference goes, not at the next collection
    try:
        del w
        assert gone() is None, "a reference cycle or the layer registry kept the workspace alive"
        assert live() < before, "its device memory was not freed"
    finally:
        gc.enable()
    with pytest.raises(ValueError, match="names no live layer"):
        megamoe.workspace.layer_of(ids[0])


def test_a_pending_backward_keeps_its_workspace(fake_env):
    fill_cache(fake_env)
    w = megamoe.Workspace(max_tokens=MAX_TOKENS, backend="hip", _host_tensors=True, **SHAPE)
    x, idx, wts, w1, w2 = inputs()
    y = megamoe.fused_moe(x, idx, wts, w1, w2, w)
    del w
    y.float().sum().backward()
    assert w1.grad is not None


def test_close_from_inside_a_call_is_refused_not_a_hang(ws, monkeypatch):
    import threading
    orig = _lib.LayerHandle.forward
    seen = {}

    def closing_forward(self, *a, **k):  # a hook inside the call that closes the workspace
        try:
            ws.close()
        except RuntimeError as e:
            seen["error"] = str(e)
        return orig(self, *a, **k)

    monkeypatch.setattr(_lib.LayerHandle, "forward", closing_forward)
    x, idx, wts, w1, w2 = inputs(grad=False)
    caller = threading.Thread(target=lambda: megamoe.fused_moe(x, idx, wts, w1, w2, ws), daemon=True)
    caller.start()
    caller.join(30)
    assert not caller.is_alive(), "close() from inside a forward waited for itself"
    assert "close() was called from inside a call on this workspace" in seen.get("error", ""), seen
    assert ws.handle is not None
    monkeypatch.setattr(_lib.LayerHandle, "forward", orig)
    ws.close()
    assert ws.handle is None


def test_close_waits_for_a_call_in_flight_and_later_calls_are_refused(ws, monkeypatch):
    import threading
    entered, release = threading.Event(), threading.Event()
    orig = _lib.LayerHandle.forward

    def slow_forward(self, *a, **k):
        entered.set()
        assert release.wait(30)
        return orig(self, *a, **k)

    monkeypatch.setattr(_lib.LayerHandle, "forward", slow_forward)
    x, idx, wts, w1, w2 = inputs(grad=False)
    results = {}

    def run():
        try:
            results["y"] = megamoe.fused_moe(x, idx, wts, w1, w2, ws)
        except BaseException as e:  # noqa: B902 -- reported below
            results["error"] = e

    caller = threading.Thread(target=run)
    caller.start()
    assert entered.wait(30)
    closer = threading.Thread(target=ws.close)
    closer.start()
    closer.join(0.5)
    assert closer.is_alive(), "close() returned while a forward was in flight"
    assert ws.handle is not None
    release.set()
    caller.join(30)
    closer.join(30)
    assert not caller.is_alive() and not closer.is_alive()
    assert "error" not in results, results.get("error")
    assert results["y"].shape == x.shape
    assert ws.handle is None
    for call in (ws.check_errors, ws.dropped_picks, lambda: megamoe.fused_moe(x, idx, wts, w1, w2, ws),
                 lambda: ws.layer(training=False, **SHAPE)):
        with pytest.raises(RuntimeError, match="the workspace is closed"):
            call()


def test_check_errors_on_a_workspace_without_layers_says_it_is_closed(ws):
    layers, ws.layers = ws.layers, {}  # what a closed workspace has; was a bare StopIteration
    try:
        with pytest.raises(RuntimeError, match="the workspace is closed"):
            ws.check_errors()
        with pytest.raises(RuntimeError, match="the workspace is closed"):
            ws.dropped_picks()
    finally:
        ws.layers = layers


def test_a_deep_copy_of_a_model_shares_the_workspace(ws):
    import copy
    m = megamoe.MoeExperts(512, 256, 16, 4, ws)
    twin = copy.deepcopy(m)
    assert twin.workspace is ws and twin.w1 is not m.w1 and torch.equal(twin.w1, m.w1)
    x, idx, wts, _, _ = inputs(grad=False)
    assert twin(x, idx, wts).shape == x.shape
    import pickle
    with pytest.raises(TypeError, match="megamoe.Workspace cannot be pickled"):
        pickle.dumps(ws)


def test_group_starts_are_clamped_and_non_decreasing():
    from megamoe.ops import group_starts
    offs = torch.tensor([50, 400, 30, 200, -5, 300], dtype=torch.int32)
    starts = group_starts(offs, 300)
    assert starts.dtype == torch.int32
    assert starts.tolist() == [0, 50, 300, 300, 300, 300, 300]  # past rows: clamped; a backward step: empty
    assert group_starts(torch.tensor([10, 20], dtype=torch.int32), 64).tolist() == [0, 10, 20]


def test_empty_n_or_m_is_refused_by_rule():
    from megamoe.ops import _grouped_rules
    with pytest.raises(megamoe.ArgumentError, match="N=0 must be a positive multiple of 128"):
        _grouped_rules("grouped_mm_nt", "nt", 0, 128)
    with pytest.raises(megamoe.ArgumentError, match="M=0 must be a positive multiple of 128"):
        _grouped_rules("grouped_mm_tn", "tn", 128, 0)


def test_gradient_rules_are_checked_before_the_forward():
    from megamoe.ops import check_grad_rules
    check_grad_rules("nt", 256, 192, (False, False))  # K = 192 serves the forward
    with pytest.raises(megamoe.ArgumentError, match=r"grouped_mm_nt's gradient of a \(grouped_mm_nn\): N=192"):
        check_grad_rules("nt", 256, 192, (True, False))
    with pytest.raises(megamoe.ArgumentError, match=r"grouped_mm_nt's gradient of b \(grouped_mm_tn\): N=192"):
        check_grad_rules("nt", 256, 192, (False, True))
    check_grad_rules("nn", 256, 256, (True, True))
    with pytest.raises(megamoe.ArgumentError, match=r"grouped_mm_tn's gradient of b \(grouped_mm_nn\): K=64"):
        check_grad_rules("tn", 256, 64, (False, True))


def test_int64_topk_idx_accepted(ws):
    x, idx, wts, w1, w2 = inputs(idx_dtype=torch.int64)
    y = megamoe.fused_moe(x, idx, wts, w1, w2, ws)
    y.float().sum().backward()
    assert wts.grad is not None


def test_training_needs_a_training_workspace(fake_env):
    fill_cache(fake_env)
    w = megamoe.Workspace(max_tokens=MAX_TOKENS, training=False, backend="hip", _host_tensors=True, **SHAPE)
    x, idx, wts, w1, w2 = inputs()
    with pytest.raises(megamoe.ArgumentError, match="made with training=False"):
        megamoe.fused_moe(x, idx, wts, w1, w2, w)
    with torch.no_grad():
        assert megamoe.fused_moe(x, idx, wts, w1, w2, w).shape == x.shape
    w.close()


def test_workspace_argument_rule():
    x, idx, wts, w1, w2 = inputs(grad=False)
    with pytest.raises(megamoe.ArgumentError, match="workspace must be a megamoe.Workspace"):
        megamoe.fused_moe(x, idx, wts, w1, w2, None)


def test_grouped_mm_rules():
    a = torch.zeros(300, 256, dtype=torch.bfloat16)
    b = torch.zeros(4, 512, 256, dtype=torch.bfloat16)
    offs = torch.tensor([50, 100, 200, 300], dtype=torch.int32)
    with pytest.raises(megamoe.ArgumentError, match="grouped_mm_nt: N=100 must be a positive multiple of 128"):
        megamoe.grouped_mm_nt(a, torch.zeros(4, 100, 256, dtype=torch.bfloat16), offs)
    with pytest.raises(megamoe.ArgumentError, match=r"K=96 must be a multiple of 64 and at least 128"):
        megamoe.grouped_mm_nt(a[:, :96], b[:, :, :96], offs)
    with pytest.raises(megamoe.ArgumentError, match="offs must be int32"):
        megamoe.grouped_mm_nt(a, b, offs.long())
    with pytest.raises(megamoe.ArgumentError, match="offs must have one end per group, 4"):
        megamoe.grouped_mm_nt(a, b, offs[:3])
    with pytest.raises(megamoe.ArgumentError, match="b's K dimension must be a's K=256"):
        megamoe.grouped_mm_nn(a, b, offs)
    with pytest.raises(megamoe.ArgumentError, match="grouped_mm_tn: M=256 must be a positive multiple of 128|a must be on a"):
        megamoe.grouped_mm_tn(a, torch.zeros(300, 512, dtype=torch.bfloat16), offs)
    with pytest.raises(megamoe.ArgumentError, match="a must be on a CUDA device"):
        megamoe.grouped_mm_nt(a, b, offs)
    with pytest.raises(megamoe.ArgumentError, match="grouped_mm: a and b must be 2d x 3d"):
        megamoe.grouped_mm(a[None], b, offs, fallback=False)


# ---- converters and the plain-PyTorch reference ----

def hf_moe(x, idx, wts, gate, up, down):
    """The layer as a checkpoint's modules compute it: per expert down(silu(gate(x)) * up(x))."""
    y = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for k in range(idx.shape[1]):
            e = int(idx[t, k])
            xt = x[t].double()
            y[t] += wts[t, k].double() * (down[e].double() @ (torch.nn.functional.silu(gate[e].double() @ xt)
                                                              * (up[e].double() @ xt)))
    return y


def test_converters_agree_and_match_the_checkpoint_formula():
    g = torch.Generator().manual_seed(3)
    E, H, I = 4, 16, 8
    gate, up, down = (torch.randn(E, I, H, generator=g), torch.randn(E, I, H, generator=g),
                      torch.randn(E, H, I, generator=g))
    w1, w2 = megamoe.convert_experts(down, gate=list(gate), up=list(up))
    assert w1.shape == (E, 2 * I, H) and w2.shape == (E, H, I) and w1.is_contiguous()
    inter = torch.stack([gate, up], dim=2).reshape(E, 2 * I, H)  # rows gate0, up0, gate1, ...
    for got in (megamoe.convert_experts(down, gate_up=torch.cat([gate, up], 1)),
                megamoe.convert_experts(down, gate_up=inter, interleaved=True),
                megamoe.convert_experts(down.transpose(1, 2), gate_up=torch.cat([gate, up], 1).transpose(1, 2),
                                        transposed=True),
                megamoe.convert_experts(down.transpose(1, 2), gate=gate.transpose(1, 2), up=up.transpose(1, 2),
                                        transposed=True)):
        assert torch.equal(got[0], w1) and torch.equal(got[1], w2)
    half = megamoe.convert_experts(down, gate=gate, up=up, rank=1, ranks=2)
    assert torch.equal(half[0], w1[2:]) and torch.equal(half[1], w2[2:])
    g1, u1, d1 = megamoe.to_gate_up_down(w1, w2)
    assert torch.equal(g1, gate) and torch.equal(u1, up) and torch.equal(d1, down)
    x = torch.randn(5, H, generator=g)
    idx = torch.tensor([[0, 1], [2, 3], [3, 3], [1, 0], [2, 0]])
    wts = torch.rand(5, 2, generator=g)
    ref = megamoe.reference_moe(x.double(), idx, wts, w1.double(), w2.double())
    assert torch.allclose(ref.double(), hf_moe(x, idx, wts, gate, up, down), rtol=1e-9, atol=1e-9)


def test_converter_rules():
    with pytest.raises(ValueError, match="either gate_up or gate and up"):
        megamoe.convert_experts(torch.zeros(2, 4, 2), gate=torch.zeros(2, 2, 4), gate_up=torch.zeros(2, 4, 4))
    with pytest.raises(ValueError, match="down must be"):
        megamoe.convert_experts(torch.zeros(2, 3, 2), gate=torch.zeros(2, 2, 4), up=torch.zeros(2, 2, 4))
    with pytest.raises(ValueError, match="3 experts do not split over 2 ranks"):
        megamoe.convert_experts(torch.zeros(3, 4, 2), gate=torch.zeros(3, 2, 4), up=torch.zeros(3, 2, 4), ranks=2)
    with pytest.raises(ValueError, match="up has 3 experts, down 2"):
        megamoe.convert_experts(torch.zeros(2, 4, 2), gate=torch.zeros(2, 2, 4), up=torch.zeros(3, 2, 4))


def test_converters_stack_only_this_ranks_experts():
    # Per-expert lists (a checkpoint's modules): a rank stacks its own experts only, never a copy of all E (22 GB a
    # layer at DeepSeek-V3); the other ranks' entries are not even looked at (here: shapes that cannot stack).
    g = torch.Generator().manual_seed(3)
    gate, up, down = (torch.randn(4, *s, generator=g) for s in ((2, 4), (2, 4), (4, 2)))
    other = torch.zeros(1)
    w1, w2 = megamoe.convert_experts([other, other, down[2], down[3]], gate=[other, other, gate[2], gate[3]],
                                     up=[other, other, up[2], up[3]], rank=1, ranks=2)
    assert torch.equal(w1, torch.cat([gate[2:], up[2:]], 1)) and torch.equal(w2, down[2:])


def run_two_ranks(fake_env, timeout=90, **extra_env):
    """two_ranks_fake.py in two processes over gloo: [(returncode, output)] per rank."""
    fill_cache(fake_env, ranks=2)
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "two_ranks_fake.py")
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   MEGAMOE_RENDEZVOUS_TIMEOUT_S="20", **extra_env)
        procs.append(subprocess.Popen([sys.executable, script], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    try:
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return procs, outs


def test_a_rank_that_fails_to_join_fails_every_rank_naming_it(fake_env):
    import time
    start = time.monotonic()
    procs, outs = run_two_ranks(fake_env, timeout=60, MEGAMOE_TEST_FAIL_JOIN_RANK="1")
    assert time.monotonic() - start < 45, "the ranks took %.0f s" % (time.monotonic() - start)
    for rank, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 3, "rank %d:\n%s" % (rank, out)
        # Rank 1 frees its heap when its join fails, so rank 0 may fail too, opening it: a race the message shows.
        assert re.search(r"rank %d: MegamoeError: megamoe: ranks? (0, )?1 failed to join the workspace: "
                         r"(rank 0: [^;]*; )?rank 1: the gathered handles are" % rank, out), out


def test_two_processes_meet_through_a_process_group(fake_env, tmp_path):
    procs, outs = run_two_ranks(fake_env)
    for rank, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, "rank %d:\n%s" % (rank, out)
        assert "rank %d: exchanged through the group (handles)" % rank in out, out


# ---- the FP8 layer (dtype="fp8"): the workspace's config, fused_moe_fp8, MoeExperts in FP8 ----

FP8_KEYS = {(512, 256, 16, 4, False, bits, "fp8_e4m3") for bits in (32, 64)}


class Fp8LayerStandIn:
    """What megamoe_layer_create_on makes of an FP8 config on the real FP8 workspace handle, which the fake layer
    cache cannot serve (megamoe_fake_layer_cache stores the bf16 layers' kernels): it keeps the config and records
    each forward_fp8 call, with copies of the scales' bytes at their addresses then, and fills y with 0x3F bytes."""

    def __init__(self, config):
        self.config, self.calls = config, []

    def forward_fp8(self, x, x_scales, tokens, topk_idx, topk_weights, w1, w1_scales, w2, w2_scales, y, stream):
        c = self.config
        E_local, H, I = c.experts, c.hidden, c.intermediate  # one rank
        call = dict(x=x, x_scales=x_scales, tokens=tokens, topk_idx=topk_idx, topk_weights=topk_weights, w1=w1,
                    w1_scales=w1_scales, w2=w2, w2_scales=w2_scales, y=y, stream=stream,
                    w1_scale_bytes=ctypes.string_at(w1_scales, E_local * (2 * I // 128) * (H // 128) * 4),
                    w2_scale_bytes=ctypes.string_at(w2_scales, E_local * (H // 128) * (I // 128) * 4),
                    x_scale_bytes=ctypes.string_at(x_scales, tokens * (H // 128) * 4) if x_scales else None)
        self.calls.append(call)
        ctypes.memset(y, 0x3F, tokens * H * 2)

    def destroy(self):
        pass


@pytest.fixture
def fp8_layers(monkeypatch):
    """Every FP8 layer made from now on is a stand-in (a bf16 one stays the runtime's); the list of them."""
    made = []
    create_on = _lib.LayerHandle.create_on

    def create(workspace, config):
        if config.dtype != _lib.DTYPES["fp8_e4m3"]:
            return create_on(workspace, config)
        made.append(Fp8LayerStandIn(config))
        return made[-1]
    monkeypatch.setattr(_lib.LayerHandle, "create_on", staticmethod(create))
    return made


@pytest.fixture
def fp8_ws(fake_env, fp8_layers):
    fill_cache(fake_env)
    w = megamoe.Workspace(max_tokens=MAX_TOKENS, dtype="fp8", backend="hip", _host_tensors=True, **SHAPE)
    yield w
    w.close()


def as_bytes(t):
    return t.contiguous().view(torch.uint8).numpy().tobytes()


_quantised = {}


def fp8_inputs(T=10, idx_dtype=torch.int32, scale_format="fp32"):
    """fused_moe_fp8's arguments: bf16 x, routing, and inputs()'s weights quantised (quantize_experts' dict, made
    once per scale format; callers do not write into it)."""
    x, idx, wts, w1, w2 = inputs(T, idx_dtype, grad=False)
    if scale_format not in _quantised:
        _quantised[scale_format] = megamoe.fp8.quantize_experts(w1 * 0.05, w2 * 0.05, scale_format=scale_format)
    return x, idx, wts, _quantised[scale_format]


def test_the_dtypes_are_the_headers():
    header = open(os.path.join(os.path.dirname(__file__), "..", "..", "..", "runtime", "include", "megamoe",
                               "megamoe.h")).read()
    defined = {name.lower(): int(v) for name, v in re.findall(r"#define MEGAMOE_DTYPE_(\w+) (\d+)", header)}
    assert defined == _lib.DTYPES


def test_the_workspaces_dtype_reaches_the_c_config_of_it_and_its_layers(fp8_ws, fp8_layers):
    lib = _lib.Library.get(LIB)
    fp8_config = _lib.LayerConfig(max_tokens=MAX_TOKENS, training=0, dtype=1, **SHAPE)
    bf16_config = _lib.LayerConfig(max_tokens=MAX_TOKENS, training=0, dtype=0, **SHAPE)
    assert fp8_ws.dtype == "fp8_e4m3" and fp8_ws.config.dtype == 1 and fp8_ws.handle.config.dtype == 1
    assert not fp8_ws.training  # training=None: False in FP8, which is inference only
    # The runtime sized the heap and buffers for an FP8 workspace (its e4m3 pool and scales), not a bf16 one.
    assert fp8_ws.bytes() == lib.workspace_bytes(fp8_config, 1) != lib.workspace_bytes(bf16_config, 1)
    # The workspace's own layers: FP8, inference, int32 and int64 topk_idx, keyed on the dtype.
    assert set(fp8_ws.layers) == FP8_KEYS
    assert sorted((s.config.dtype, s.config.training, s.config.topk_idx_bits) for s in fp8_layers) == [
        (1, 0, 32), (1, 0, 64)]
    assert fp8_ws.layer(512, 256, 16, 4, False, 32, dtype="fp8") is fp8_ws.layers[
        (512, 256, 16, 4, False, 32, "fp8_e4m3")]
    assert len(fp8_layers) == 2  # looked up, not made again
    with pytest.raises(ValueError, match="no layer hidden=512 intermediate=256 experts=16 topk=4 "
                                         r"\(training False, bf16\) on this workspace \(dtype fp8_e4m3\)"):
        fp8_ws.layer_for(512, 256, 16, 4, False, 32, "bf16")
    # "fp8_e4m3" is the same dtype; bf16 stays the default.
    w = megamoe.Workspace(max_tokens=MAX_TOKENS, dtype="fp8_e4m3", backend="hip", _host_tensors=True, **SHAPE)
    assert w.config.dtype == 1 and set(w.layers) == FP8_KEYS
    w.close()
    w = megamoe.Workspace(max_tokens=MAX_TOKENS, backend="hip", _host_tensors=True, **SHAPE)
    assert w.dtype == "bf16" and w.config.dtype == 0 and w.training
    assert {k[6] for k in w.layers} == {"bf16"} and len(fp8_layers) == 4
    w.close()


def test_fp8_workspace_errors_are_the_runtimes(fake_env):
    fill_cache(fake_env)
    make = lambda **kw: megamoe.Workspace(**dict(dict(max_tokens=MAX_TOKENS, backend="hip", _host_tensors=True,  # noqa: E731
                                                      dtype="fp8"), **dict(SHAPE, **kw)))
    # The fake layer cache holds no FP8 kernels: the miss names the command that builds the FP8 layer's.
    with pytest.raises(megamoe.MegamoeError, match="the FP8 MoE layer hidden=512 .*\n    megamoe-cache generate "
                                                   "--hidden 512 --intermediate 256 --experts 16 --topk 4 --ep 1 "
                                                   "--dtype fp8 --targets gfx950") as e:
        make()
    assert e.value.status == _lib.KERNEL_NOT_FOUND and "quantize_tokens_fp8" in str(e.value)
    for kw, rule in ((dict(training=True), "training=true with dtype fp8_e4m3: the FP8 layer is inference only"),
                     (dict(dedup_tokens=True), "dedup_tokens with dtype fp8_e4m3"),
                     (dict(hidden=128), "hidden=128 must be >= 256 with dtype fp8_e4m3")):
        with pytest.raises(megamoe.MegamoeError, match=rule) as e:
            make(**kw)
        assert e.value.status == _lib.INVALID_ARGUMENT
    with pytest.raises(ValueError, match=r"Workspace: dtype must be 'bf16', 'fp8' or 'fp8_e4m3' \(got 'fp4'\)"):
        make(dtype="fp4")
    w = megamoe.Workspace(max_tokens=MAX_TOKENS, training=False, backend="hip", _host_tensors=True, **SHAPE)
    with pytest.raises(megamoe.MegamoeError, match="dtype=fp8_e4m3 differs from the workspace's dtype=bf16"):
        w.layer(512, 256, 16, 4, False, 32, dtype="fp8")
    # A bf16 layer refuses the FP8 forward's scales (the binding reaches megamoe_layer_forward_fp8).
    x, idx, wts, w1, w2 = inputs(grad=False)
    y = torch.empty_like(x)
    layer = w.layer(512, 256, 16, 4, False, 32)
    with pytest.raises(megamoe.MegamoeError, match="x_scales, w1_scales and w2_scales are for a dtype fp8_e4m3 "
                                                   "layer; this one is bf16"):
        layer.handle.forward_fp8(x.data_ptr(), 0, 10, idx.data_ptr(), wts.data_ptr(), w1.data_ptr(), wts.data_ptr(),
                                 w2.data_ptr(), wts.data_ptr(), y.data_ptr(), 0)
    w.close()


def test_layer_command_names_the_dtype():
    assert megamoe.layer_command(512, 256, 16, 4, 2, "sm_90a").endswith("--ep 2 --targets sm_90a")
    for dtype in ("fp8", "fp8_e4m3"):
        assert megamoe.layer_command(512, 256, 16, 4, 2, "sm_90a", dtype).endswith("--ep 2 --dtype fp8 --targets sm_90a")


def test_fused_moe_fp8_hands_its_tensors_to_the_fp8_layer(fp8_ws, fp8_layers):
    x, idx, wts, q = fp8_inputs()
    by_bits = {s.config.topk_idx_bits: s for s in fp8_layers}
    before = fake_launches()
    y = megamoe.fused_moe_fp8(x, idx, wts, q["w1"], q["w1_scale"], q["w2"], q["w2_scale"], fp8_ws)
    assert fake_launches() == before  # the stand-in's call only
    assert y.shape == x.shape and y.dtype == torch.bfloat16 and bool((y.view(torch.int16) == 0x3F3F).all())
    (call,) = by_bits[32].calls
    assert call["y"] == y.data_ptr() and call["tokens"] == 10 and call["stream"] == 0
    assert (call["x"], call["topk_idx"], call["topk_weights"], call["w1"], call["w2"]) == (
        x.data_ptr(), idx.data_ptr(), wts.data_ptr(), q["w1"].data_ptr(), q["w2"].data_ptr())
    assert call["x_scales"] == 0  # bf16 x: the layer quantises it
    assert call["w1_scale_bytes"] == as_bytes(q["w1_scale"]) and call["w2_scale_bytes"] == as_bytes(q["w2_scale"])
    # x as codes with its scales, int64 topk_idx (the other layer), the arguments by quantize_experts' names.
    xq, xs = megamoe.quantize_fp8(x)
    megamoe.fused_moe_fp8(xq, idx.long(), wts, workspace=fp8_ws, x_scales=xs, **q)
    (call,) = by_bits[64].calls
    assert call["x"] == xq.data_ptr() and call["x_scales"] == xs.data_ptr() and call["x_scale_bytes"] == as_bytes(xs)
    # UE8M0 scales (uint8 exponents) reach the layer decoded to float32, bitwise.
    _, _, _, u = fp8_inputs(scale_format="ue8m0")
    e1, e2 = megamoe.fp8.float_to_ue8m0(u["w1_scale"]), megamoe.fp8.float_to_ue8m0(u["w2_scale"])
    megamoe.fused_moe_fp8(x, idx, wts, u["w1"], e1, u["w2"], e2, fp8_ws)
    call = by_bits[32].calls[-1]
    assert call["w1_scale_bytes"] == as_bytes(u["w1_scale"]) and call["w2_scale_bytes"] == as_bytes(u["w2_scale"])
    # An empty rank still calls its layer (the ranks' exchange).
    y0 = megamoe.fused_moe_fp8(x[:0], idx[:0], wts[:0], workspace=fp8_ws, **q)
    assert y0.shape == (0, 512) and by_bits[32].calls[-1]["tokens"] == 0 and by_bits[32].calls[-1]["x"] != 0


def check_fp8_error(ws, match, **changes):
    x, idx, wts, q = fp8_inputs()
    args = dict(x=x, topk_idx=idx, topk_weights=wts, workspace=ws, **q)
    args.update(changes)
    with pytest.raises(megamoe.ArgumentError, match=match):
        megamoe.fused_moe_fp8(**args)


def test_fused_moe_fp8_rules_name_the_constraint(fp8_ws, fp8_layers, ws):
    x, idx, wts, q = fp8_inputs()
    xq, xs = megamoe.quantize_fp8(x)
    c = check_fp8_error
    c(fp8_ws, r"fused_moe_fp8: x must be bfloat16 or uint8 \(got float32\)", x=x.float())
    c(fp8_ws, r"x must have 2 dimensions \[tokens, hidden\]", x=x[None])
    c(fp8_ws, r"x is e4m3 codes \(uint8\), so x_scales, its per-token scales \[tokens, hidden / 128\], is required",
      x=xq)
    c(fp8_ws, r"x_scales goes only with e4m3 codes x; x is bfloat16", x_scales=xs)
    c(fp8_ws, r"x_scales must be \[tokens, hidden / 128\] = \[10, 4\] \(got \[10, 3\]\)", x=xq, x_scales=xs[:, :3])
    c(fp8_ws, r"x_scales must be float32 or uint8 \(got float16\)", x=xq, x_scales=xs.half())
    c(fp8_ws, r"topk_idx must have one row per token of x", topk_idx=idx[:5])
    c(fp8_ws, r"topk_weights must be float32", topk_weights=wts.double())
    c(fp8_ws, r"w1 must be uint8 \(got bfloat16\)", w1=q["w1"].bfloat16())
    c(fp8_ws, r"w2 must have 3 dimensions \[local experts, hidden, intermediate\] \(e4m3 codes\)", w2=q["w2"][0])
    c(fp8_ws, r"w2 must be \[local experts=16, hidden=512, intermediate=256\]", w2=q["w2"][:, :, :128])
    c(fp8_ws, r"hidden=320 must be a multiple of 128", x=x[:, :320].contiguous(), w1=q["w1"][:, :, :320].contiguous(),
      w2=q["w2"][:, :320].contiguous())
    c(fp8_ws, r"intermediate=192 must be a multiple of 128 \(act is quantised per token",
      w1=q["w1"][:, :384].contiguous(), w2=q["w2"][:, :, :192].contiguous())
    c(fp8_ws, r"w1_scale must be \[local experts, 2 \* intermediate / 128, hidden / 128\] = \[16, 4, 4\] "
              r"\(got \[16, 4, 3\]\)", w1_scale=q["w1_scale"][:, :, :3])
    c(fp8_ws, r"w2_scale must be float32 or uint8 \(got bfloat16\)", w2_scale=q["w2_scale"].bfloat16())
    c(fp8_ws, r"w2_scale must be \[local experts, hidden / 128, intermediate / 128\] = \[16, 4, 2\]",
      w2_scale=q["w2_scale"].transpose(1, 2).contiguous())
    c(fp8_ws, r"w1_scale must be contiguous", w1_scale=q["w1_scale"].transpose(1, 2).contiguous().transpose(1, 2))
    c(fp8_ws, r"w1 must be on cpu, the workspace's device \(got meta\)", w1=q["w1"].to("meta"))
    big = fp8_inputs(MAX_TOKENS + 1)
    c(fp8_ws, r"x has 65 tokens, above the workspace's max_tokens=64", x=big[0], topk_idx=big[1], topk_weights=big[2])
    c(fp8_ws, r"experts=8 \(w1's 8 local experts x 1 ranks\) must equal the workspace's experts=16",
      w1=q["w1"][:8], w1_scale=q["w1_scale"][:8], w2=q["w2"][:8], w2_scale=q["w2_scale"][:8])
    flat = torch.empty(x.numel() + 1, dtype=torch.bfloat16)
    shifted = flat[1:].view(x.shape)
    shifted.copy_(x)
    c(fp8_ws, r"x must be 16-byte aligned", x=shifted)
    c(None, r"workspace must be a megamoe.Workspace \(got NoneType\)")
    c(ws, r"the workspace's dtype is bf16; the FP8 layer needs a workspace made with dtype='fp8'")
    with pytest.raises(megamoe.ArgumentError, match="fused_moe: the workspace's dtype is fp8_e4m3: its layers run "
                                                    "through fused_moe_fp8"):
        megamoe.fused_moe(*inputs(grad=False), fp8_ws)
    # No backward: gradients wanted are refused by name; under no_grad the same call runs.
    c(fp8_ws, r"x requires grad, but the FP8 layer is inference only", x=x.clone().requires_grad_())
    c(fp8_ws, r"topk_weights and w1_scale require grad", topk_weights=wts.clone().requires_grad_(),
      w1_scale=q["w1_scale"].clone().requires_grad_())
    with torch.no_grad():
        megamoe.fused_moe_fp8(x.clone().requires_grad_(), idx, wts, workspace=fp8_ws, **q)
    assert sum(len(s.calls) for s in fp8_layers) == 1  # only that call reached a layer


def test_the_fp8_op_checks_its_arguments_against_the_layer(fp8_ws, fp8_layers, ws):
    from megamoe.ops import _fused_moe_fp8_call
    x, idx, wts, q = fp8_inputs()
    args = (q["w1"], q["w1_scale"], q["w2"], q["w2_scale"])
    layer = fp8_ws.layer(512, 256, 16, 4, False, 32)
    with pytest.raises(megamoe.ArgumentError, match="topk_idx bits"):
        _fused_moe_fp8_call(x, idx.long(), wts, *args, None, layer.id)
    with pytest.raises(megamoe.ArgumentError, match="the workspace's dtype is bf16"):
        _fused_moe_fp8_call(x, idx, wts, *args, None, ws.layer(training=False, **SHAPE).id)
    with pytest.raises(megamoe.ArgumentError, match="fused_moe_fp8: w2 must be contiguous"):
        _fused_moe_fp8_call(x, idx, wts, q["w1"], q["w1_scale"], q["w2"].transpose(1, 2).contiguous().transpose(1, 2),
                            q["w2_scale"], None, layer.id)
    from megamoe.ops import _fused_moe_call
    with pytest.raises(megamoe.ArgumentError, match="fused_moe: the workspace's dtype is fp8_e4m3"):
        _fused_moe_call(*inputs(grad=False), layer.id, False)
    assert not any(s.calls for s in fp8_layers)
    _fused_moe_fp8_call(x, idx, wts, *args, None, layer.id)
    assert len(layer.handle.calls) == 1


def fp8_checkpoint_weights(E_=16):
    """A checkpoint's experts in bf16 (gate, up, down; nn.Linear's [out, in]) and in FP8 (codes, block scales)."""
    g = torch.Generator().manual_seed(5)
    gate, up = (torch.randn(E_, 256, 512, generator=g).mul(0.05).bfloat16() for _ in range(2))
    down = torch.randn(E_, 512, 256, generator=g).mul(0.05).bfloat16()
    return gate, up, down


def test_fp8_experts_are_buffers_quantised_from_bf16_weights(fp8_ws, fp8_layers):
    m = megamoe.MoeExperts(512, 256, 16, 4, fp8_ws)
    assert m.dtype == "fp8_e4m3" and list(m.parameters()) == []
    assert {n: (tuple(b.shape), b.dtype) for n, b in m.named_buffers()} == {
        "w1": ((16, 512, 512), torch.uint8), "w1_scale": ((16, 4, 4), torch.float32),
        "w2": ((16, 512, 256), torch.uint8), "w2_scale": ((16, 4, 2), torch.float32)}
    assert sorted(m.state_dict()) == ["w1", "w1_scale", "w2", "w2_scale"]
    # init: nn.Linear's uniform weights quantised, so each block's scale is its amax / 448 <= bound / 448.
    assert bool((m.w1_scale > 0).all()) and bool((m.w1_scale <= 1 / math.sqrt(512) / 448).all())
    assert bool((m.w2_scale <= 1 / math.sqrt(256) / 448).all()) and int((m.w1 != 0).sum()) > m.w1.numel() // 2
    assert "dtype=fp8_e4m3" in repr(m)
    # The quantiser path: a bf16 checkpoint on an FP8 workspace is quantised in quantize_experts' blocks.
    gate, up, down = fp8_checkpoint_weights()
    for fmt in ("fp32", "ue8m0"):
        m = megamoe.MoeExperts.from_checkpoint(fp8_ws, 4, list(down), gate=list(gate), up=list(up), scale_format=fmt)
        want = megamoe.fp8.quantize_experts(torch.cat([gate, up], 1), down, scale_format=fmt)
        for name, t in want.items():
            assert torch.equal(getattr(m, name), t), (fmt, name)
    # forward runs fused_moe_fp8 on the module's buffers; bf16 modules refuse x_scales.
    x, idx, wts, _ = fp8_inputs()
    with torch.no_grad():
        assert m(x, idx, wts).shape == x.shape
    call = [s for s in fp8_layers if s.config.topk_idx_bits == 32][0].calls[-1]
    assert (call["w1"], call["w2"]) == (m.w1.data_ptr(), m.w2.data_ptr())
    assert call["w1_scale_bytes"] == as_bytes(m.w1_scale)
    with pytest.raises(ValueError, match=r"MoeExperts.quantize_from: w2 must be \[16, 512, 256\]"):
        m.quantize_from(torch.cat([gate, up], 1), down[:, :, :128])


class TwoRankWorkspace:
    """Rank 1 of 2 as MoeExperts sees its workspace (its layers made elsewhere): a module's share of the experts."""
    rank, ranks, dtype, training, device = 1, 2, "fp8_e4m3", False, torch.device("cpu")

    def layer(self, *args):
        pass


def test_fp8_experts_from_an_fp8_checkpoint_keep_this_ranks_share(tmp_path, fp8_ws):
    gate, up, down = fp8_checkpoint_weights()
    q = {name: megamoe.fp8.quantize_blocks(t, scale_format="ue8m0") for name, t in
         (("gate", gate), ("up", up), ("down", down))}
    full = megamoe.fp8.quantize_experts(torch.cat([gate, up], 1), down, scale_format="ue8m0")
    # In memory, as a DeepSeek-V3 / Kimi-K2 model's modules hold them: per expert e4m3 weight and weight_scale_inv
    # (here UE8M0 uint8 exponents), lists of per-expert tensors.
    codes = {n: list(q[n][0]) for n in q}
    scale_inv = {n: [megamoe.fp8.float_to_ue8m0(s) for s in q[n][1]] for n in q}
    for workspace, lo in ((fp8_ws, 0), (TwoRankWorkspace(), 8)):
        m = megamoe.MoeExperts.from_checkpoint(workspace, 4, codes["down"], gate=codes["gate"], up=codes["up"],
                                               scale_inv=scale_inv)
        for name, t in full.items():
            assert torch.equal(getattr(m, name), t[lo:lo + 16 // workspace.ranks]), (lo, name)
    # On disk: a safetensors checkpoint's files, of which a rank reads its experts only.
    tensors, dtypes = {}, {}
    for e in range(16):
        for proj in ("gate", "up", "down"):
            name = "model.layers.3.mlp.experts.%d.%s_proj.weight" % (e, proj)
            tensors[name], dtypes[name] = q[proj][0][e].clone(), "F8_E4M3"
            tensors[name + "_scale_inv"] = q[proj][1][e].clone()
    path = str(tmp_path / "model.safetensors")
    megamoe.fp8.write_safetensors(path, tensors, dtypes)
    for workspace, lo in ((fp8_ws, 0), (TwoRankWorkspace(), 8)):
        m = megamoe.MoeExperts.from_fp8_checkpoint(workspace, 4, path, layer=3, experts=16)
        for name, t in full.items():
            assert torch.equal(getattr(m, name), t[lo:lo + 16 // workspace.ranks]), (lo, name)
    # What cannot be an FP8 module's weights is refused by rule.
    with pytest.raises(ValueError, match=r"scale_inv must be a dict of the weights' block scales, keys "
                                         r"\['down', 'gate', 'up'\] \(got \['down', 'gate_up'\]\)"):
        megamoe.MoeExperts.from_checkpoint(fp8_ws, 4, codes["down"], gate=codes["gate"], up=codes["up"],
                                           scale_inv=dict(down=scale_inv["down"], gate_up=scale_inv["gate"]))
    with pytest.raises(ValueError, match="interleaved gate and up rows would split"):
        megamoe.MoeExperts.from_checkpoint(fp8_ws, 4, codes["down"], gate_up=torch.cat([q["gate"][0], q["up"][0]], 1),
                                           interleaved=True, scale_inv=dict(down=q["down"][1], gate_up=q["up"][1]))
    with pytest.raises(ValueError, match=r"gate must be e4m3 codes \(torch.uint8.*\) with scale_inv \(got "
                                         r"torch.bfloat16\)"):
        megamoe.MoeExperts.from_checkpoint(fp8_ws, 4, codes["down"], gate=gate, up=codes["up"], scale_inv=scale_inv)
    m = megamoe.MoeExperts(512, 256, 16, 4, fp8_ws, init=False)
    with pytest.raises(ValueError, match=r"MoeExperts.load_fp8: w2_scale must be \[16, 4, 2\], this rank's experts' "
                                         r"\(got \[16, 2, 4\]\)"):
        m.load_fp8(full["w1"], full["w1_scale"], full["w2"], full["w2_scale"].transpose(1, 2))


def test_fp8_weights_need_an_fp8_workspace(tmp_path, ws):
    gate, up, down = fp8_checkpoint_weights()
    q = megamoe.fp8.quantize_experts(torch.cat([gate, up], 1), down)
    with pytest.raises(ValueError, match="scale_inv \\(FP8 weights\\) needs a workspace made with dtype='fp8'"):
        megamoe.MoeExperts.from_checkpoint(ws, 4, q["w2"], gate=q["w1"][:, :256], up=q["w1"][:, 256:],
                                           scale_inv=dict(down=q["w2_scale"], gate=q["w1_scale"][:, :2],
                                                          up=q["w1_scale"][:, 2:]))
    with pytest.raises(ValueError, match="from_fp8_checkpoint: an FP8 checkpoint needs a workspace made with "
                                         "dtype='fp8'"):
        megamoe.MoeExperts.from_fp8_checkpoint(ws, 4, str(tmp_path), layer=0, experts=16)
    m = megamoe.MoeExperts(512, 256, 16, 4, ws)
    with pytest.raises(ValueError, match="MoeExperts.load_fp8: this module is bf16"):
        m.load_fp8(q["w1"], q["w1_scale"], q["w2"], q["w2_scale"])
    with pytest.raises(megamoe.ArgumentError, match="x_scales goes with FP8 modules; this one is bf16"):
        m(*inputs(grad=False)[:3], x_scales=torch.ones(10, 4))
    with pytest.raises(megamoe.MegamoeError, match="dtype=fp8_e4m3 differs from the workspace's dtype=bf16"):
        megamoe.MoeExperts(512, 256, 16, 4, ws, dtype="fp8")
