"""The model table as the package reads it (megamoe_model_get through _lib): the same rows as the C++ table that
`megamoe-cache presets` prints, and the layer bench's presets made from it, not copied."""
import ctypes
import os
import re
import subprocess

import pytest

from conftest import BUILD, ROOT
from megamoe import _lib

LIB = os.path.join(BUILD, "lib", "libmegamoe.so")
TOOL = os.path.join(BUILD, "bin", "megamoe-cache")

if not os.path.exists(LIB):
    pytest.skip("the build folder %s lacks libmegamoe.so (build it first)" % BUILD, allow_module_level=True)


def models():
    return _lib.Library.get(LIB).models()


def test_model_struct_matches_the_header():
    header = open(os.path.join(ROOT, "runtime", "include", "megamoe", "megamoe.h")).read()
    body = header[header.index("typedef struct megamoe_model {"):header.index("} megamoe_model;")]
    fields = re.findall(r"^\s*(?:size_t|const char\*|int64_t|uint64_t) (\w+);", body, re.M)
    assert tuple(fields) == tuple(name for name, _ in _lib.Model._fields_)
    assert ctypes.sizeof(_lib.Model) == 8 * len(fields)


def test_the_rows_hold_the_models_numbers():
    rows = {m["name"]: m for m in models()}
    assert rows["deepseek-v3"] == {
        "name": "deepseek-v3", "source": "deepseek-ai/DeepSeek-V3", "hidden": 7168, "intermediate": 2048,
        "experts": 256, "topk": 8, "ep": 8, "shared_experts": 1, "shared_intermediate": 2048,
        "lacks": ["shared_experts"], "refusal": ""}
    assert rows["gpt-oss-120b"]["lacks"] == ["expert_biases", "swiglu_oai"]
    assert rows["gpt-oss-120b"]["refusal"].startswith("hidden=2880 must be a positive multiple of 128")
    assert "routing weight on the input" in rows["llama-4-maverick"]["refusal"]
    assert {"deepseek-v3", "qwen3-235b-a22b", "mixtral-8x7b", "deepseek-v2-lite"} <= set(rows)
    assert len(rows) == len(models())  # names are unique


@pytest.mark.skipif(not os.path.exists(TOOL), reason="megamoe-cache is not built (a build without the compiler)")
def test_the_rows_are_what_megamoe_cache_prints():
    out = subprocess.run([TOOL, "presets"], capture_output=True, text=True, check=True, timeout=60).stdout
    printed = {}
    for line in out.splitlines()[1:]:
        cells = line.split(None, 8)
        if len(cells) == 9 and cells[1].isdigit():
            printed[cells[0]] = ([int(c) for c in cells[1:6]], cells[6], cells[7], cells[8])
    assert list(printed) == [m["name"] for m in models()]
    for m in models():
        shared = "%dx%d" % (m["shared_experts"], m["shared_intermediate"]) if m["shared_experts"] else "-"
        status = "refused: " + m["refusal"] if m["refusal"] else "runs"
        assert printed[m["name"]] == ([m["hidden"], m["intermediate"], m["experts"], m["topk"], m["ep"]], shared,
                                      ",".join(m["lacks"]) or "-", status), m["name"]


def test_the_bench_presets_are_the_table():
    pytest.importorskip("torch")
    from megamoe.bench import cases
    assert cases.presets(LIB) == {m["name"]: {k: m[k] for k in ("hidden", "intermediate", "experts", "topk")}
                                  for m in models()}
    assert cases.presets(LIB)["mixtral-8x7b"] == {"hidden": 4096, "intermediate": 14336, "experts": 8, "topk": 2}
