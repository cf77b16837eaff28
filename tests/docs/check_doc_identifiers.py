#!/usr/bin/env python3
"""Docs name only what the code has (issue 47 item 6).

Scans README.md and docs/**/*.md (not docs/history.md, which may name old things; bench/results is not read) and
checks what they name:

  paths         in code spans and in running text: one that starts at a top-level folder (`runtime/src/Env.cpp`,
                kernels/Swiglu.cpp, `compiler/cache/`) must exist; a relative one (`Json.h`, `src/Profile.cpp`,
                `megamoe/Version.h`, `entries/`) must be the tail of a file's or folder's path, or a path the code
                itself names (a generated header, a cache subfolder). build/ outputs and <placeholders> are skipped.
  identifiers   in code spans: calls (`fooBar(`, `k.block()`), qualified names (`MoeLayer::forward`: every part,
                and the last in a file that also names the first), snake_case (`mma_tile`), camelCase (`tmaLoad`),
                PascalCase of two or more words (`SharedTile`), k-constants (`kStaleKernel`), UPPER_SNAKE names
                (`MEGAMOE_JIT`), a span of one bare name (`signal`), keyword arguments (`fallback=False`), op
                attributes (`acc_store {quad}`), and the flags and gtest filters of megamoe's own tools
                (`megamoe-cache generate --emit-asm`): each must occur as a whole word (flags, `Foo*` and `_PATCH`
                fragments: as text) in the source trees (dsl compiler kernels runtime python tools scripts tests
                examples cmake, CMakeLists.txt; their .md files excluded, and this folder, whose allow-list would
                vouch for itself).

Other projects' names count where the code names them too (torch.*, ctypes.* and std:: are not checked); the few
the docs keep without the code are in ALLOWED below, each with its reason. Fenced blocks (diagrams) are not read.

Usage: check_doc_identifiers.py [REPO_ROOT]   (default: two folders above this file)
Prints `file:line: `name` named here is not in the code` for each violation and exits 1 if there is any (or if an
ALLOWED entry is no longer needed).
"""
import os
import re
import sys

SOURCE_DIRS = ["dsl", "compiler", "kernels", "runtime", "python", "tools", "scripts", "tests", "examples", "cmake"]
SOURCE_FILES = ["CMakeLists.txt"]
SOURCE_EXTS = {".cpp", ".h", ".hpp", ".cc", ".c", ".py", ".sh", ".cmake", ".txt", ".td", ".mlir", ".in", ".toml",
               ".cfg", ".json", ".ll", ".s", ".pc"}
TOP_LEVEL = {"dsl", "compiler", "kernels", "runtime", "python", "tools", "scripts", "tests", "examples", "cmake",
             "docs", "bench", "README.md", "CMakeLists.txt"}
PATH_EXTS = (".cpp", ".h", ".hpp", ".py", ".sh", ".cmake", ".td", ".mlir", ".md", ".in", ".toml")
SKIP_DOCS = {"docs/history.md"}

# Roots of other projects' Python names: `torch.compile(...)`, `ctypes.sizeof` are not megamoe's to keep.
EXTERNAL_ROOTS = {"torch", "ctypes", "operator", "os", "sys", "np", "numpy", "std", "dist", "subprocess"}
# Commands whose flags are megamoe's own (checked); other commands' flags (torchrun, cmake, pytest) are not.
OWN_TOOLS = {"megamoe-cache", "megamoe-bench", "megamoe-opt", "runtime_host_test", "codegen_test"}

# (doc or "*", name, reason): names a doc may keep though the code does not have them. An entry that no doc needs
# any more (the doc dropped the name, or the code has it) is itself a failure, so the list stays this short.
ALLOWED = [
    ("docs/environment.md", "MEGAMOE_EXP_EPI", "named as a retired bench switch that nothing reads"),
    ("docs/environment.md", "MEGAMOE_AB_NOSTREAM", "named as a retired bench switch that nothing reads"),
    ("docs/environment.md", "EXP_COMBINE_SINGLE", "named as a retired bench switch that nothing reads"),
    ("docs/environment.md", "MEGAMOE_GEMM_WS", "named as a retired bench switch that nothing reads"),
    ("docs/environment.md", "GEMM_TMA_PAIRS", "named as a variable that is no longer read"),
    ("docs/decisions/dsl-views.md", "copyTileMN", "the decision record names the call issue 21 removed"),
    ("docs/decisions/dsl-views.md", "blockSync", "the decision record names the call issue 21 removed"),
    ("docs/decisions/dsl-views.md", "Kernel::blockSync", "the decision record names the call issue 21 removed"),
    ("docs/decisions/dsl-views.md", "groupFirst", "the decision record names the builder state issue 21 removed"),
    ("docs/decisions/dsl-views.md", "groupThreads", "the decision record names the builder state issue 21 removed"),
    ("docs/decisions/packaging.md", "megamoe/abi/", "a possible future include folder, named as not done"),
    ("docs/decisions/packaging.md", "megamoe/cache/", "a possible future include folder, named as not done"),
    ("docs/decisions/logging.md", "NVTX_INJECTION64_PATH", "Nsight Systems' variable, read by libnvToolsExt"),
    ("docs/decisions/logging.md", "nvtxGetExportTable", "NVTX v3's protocol, named as deliberately not done"),
    ("docs/decisions/sm-budget.md", "num_sms", "DeepEP's parameter, named for comparison"),
]

# Paths in running text (outside code spans) that start at a top-level folder: kernels/Swiglu.cpp, tests/lit.
PLAIN_PATH = re.compile(r"(?<![\w./$~-])((?:dsl|compiler|kernels|runtime|python|tools|scripts|tests|examples|cmake|"
                        r"docs|bench)/[\w./+*<>-]*)")
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SPAN = re.compile(r"(?<!`)`((?:[^`\n]|\n(?![ \t]*\n))+)`(?!`)")


def load_sources(root):
    """Every word of the source trees -> set of file indexes, and all their text (for flags)."""
    words = {}
    texts = []
    skip = os.path.realpath(os.path.join(root, "tests", "docs"))
    paths = []
    for d in SOURCE_DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, d)):
            dirnames[:] = [n for n in dirnames if not n.startswith(".") and n != "__pycache__"]
            for f in filenames:
                paths.append(os.path.join(dirpath, f))
    paths += [os.path.join(root, f) for f in SOURCE_FILES]
    for p in paths:
        if os.path.realpath(p).startswith(skip + os.sep):
            continue  # this check names the allowed names; it must not vouch for them
        ext = os.path.splitext(p)[1]
        if ext == ".md":
            continue  # docs (python/README.md) do not vouch for each other
        try:
            if ext not in SOURCE_EXTS and os.path.getsize(p) > 4 << 20:
                continue
            with open(p, "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        if ext not in SOURCE_EXTS and b"\0" in data[:8192]:
            continue  # binary (extensionless scripts such as tools/megamoe-bench/megamoe-bench are read)
        text = data.decode("utf-8", errors="replace")
        i = len(texts)
        texts.append(text)
        for w in set(WORD.findall(text)):
            words.setdefault(w, set()).add(i)
    return words, "\n".join(texts)


def all_files(root):
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [n for n in dirnames if not n.startswith(".") and n not in ("build", "__pycache__")]
        rel = os.path.relpath(dirpath, root)
        for f in filenames:
            out.append(f if rel == "." else rel + "/" + f)
    return out


def code_shaped(tok):
    """Whether a bare word reads as a code name rather than English."""
    if "_" in tok.strip("_") and re.search(r"[A-Za-z]", tok):
        return True  # snake_case, UPPER_SNAKE
    if re.fullmatch(r"[a-z][a-z0-9]*[A-Z][A-Za-z0-9]*", tok):
        return True  # camelCase, k128B
    if re.fullmatch(r"k[A-Z][A-Za-z0-9]+", tok):
        return True  # constants
    if re.fullmatch(r"[A-Z][a-z0-9]+[A-Z][A-Za-z0-9]*", tok):
        return True  # PascalCase of two or more words
    return False


class Checker:
    def __init__(self, root):
        self.root = root
        self.words, self.text = load_sources(root)
        self.files = all_files(root)
        self.file_set = set(self.files)
        self.dir_set = {f.rsplit("/", 1)[0] for f in self.files if "/" in f}
        for d in list(self.dir_set):
            parts = d.split("/")
            for i in range(1, len(parts)):
                self.dir_set.add("/".join(parts[:i]))

    def has(self, w):
        return w in self.words

    def path_ok(self, p):
        p = p.rstrip("/")
        if p in self.file_set or p in self.dir_set:
            return True
        first = p.split("/", 1)[0]
        if first in TOP_LEVEL:
            return False
        # relative: the tail of some file or folder (src/Profile.cpp, Json.h), or a path the code names (a
        # generated header such as megamoe/Version.h, the cache's entries/)
        tail = "/" + p
        return any(("/" + f).endswith(tail) for f in self.files) or \
            any(("/" + d).endswith(tail) for d in self.dir_set) or \
            re.search(r"(?<![\w.-])" + re.escape(p) + r"(?![\w-])", self.text) is not None

    def names_in(self, span):
        """The (name, kind) pairs of one code span that must exist; kind: path, word, flag, qual, prefix."""
        s = span.strip()
        out = []
        # Shell commands: their paths always; their flags and words only for megamoe's own tools.
        tokens = s.split()
        while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", tokens[0]):
            name = tokens[0].split("=", 1)[0]
            if code_shaped(name):
                out.append((name, "word"))
            tokens = tokens[1:]
        cmd = os.path.basename(tokens[0]) if tokens else ""
        is_command = len(tokens) > 1 and (cmd in OWN_TOOLS or cmd in {
            "bash", "cmake", "ctest", "torchrun", "python3", "python", "pip", "grep", "diff", "chmod", "mktemp",
            "sh", "ninja", "git"} or tokens[0].startswith(("build/", "build-rt/", "scripts/")))
        if is_command:
            own = cmd in OWN_TOOLS or tokens[0].startswith("scripts/") or (
                cmd == "bash" and len(tokens) > 1 and tokens[1].startswith("scripts/"))
            for t in tokens:
                t = t.strip("'\"")
                if "/" in t and not t.startswith(("build", "-", "/", "$", "~", ".")) and "*" not in t \
                        and "=" not in t and re.fullmatch(r"[\w./+-]+", t):
                    out.append((t, "path"))
                elif own and re.fullmatch(r"--[a-z][a-z0-9-]*(=.*)?", t):
                    out.append((t.split("=", 1)[0], "flag"))
                elif own and t.startswith("--gtest_filter="):
                    for pat in re.split(r"[:=]", t.split("=", 1)[1]):
                        for part in re.split(r"[./]", pat):
                            part = part.strip("-'\"")
                            if part and part != "*" and part[0].isalpha():
                                out.append((part.rstrip("*"), "prefix" if part.endswith("*") else "word"))
            return out
        # One bare name: checked unless it is a one-word capital (a script's own variable, a FileCheck prefix);
        # a fragment (`_export`, `_PATCH`) must be part of a name.
        if re.fullmatch(r"[A-Za-z_]\w*", s):
            if s.startswith("_") or s.endswith("_"):
                return [(s, "prefix")]
            return [] if re.fullmatch(r"[A-Z][A-Z0-9]*", s) else [(s, "word")]
        # UPPER/SUFFIX/SUFFIX (MEGAMOE_VERSION_MAJOR/MINOR/PATCH): the first name.
        if re.fullmatch(r"[A-Z][A-Z0-9_]*(/[A-Z0-9_]+)+", s):
            return [(s.split("/", 1)[0], "word")]
        # A path (build outputs and placeholders are not the tree's).
        if re.fullmatch(r"[\w.+-]+(/[\w.+-]*)+", s) or (re.fullmatch(r"[\w.+-]+", s) and s.endswith(PATH_EXTS)):
            if s.startswith(("build/", "build-rt/", ".ci/", "P/")) or ".." in s:
                return out
            return out + [(s, "path")]
        # Qualified names A::B::c.
        for m in re.finditer(r"(?<![\w:])([A-Za-z_]\w*(?:::[A-Za-z_]\w*)+)", s):
            parts = m.group(1).split("::")
            if parts[0] in EXTERNAL_ROOTS:
                continue
            out.append((m.group(1), "qual"))
        # Dotted names a.b.c (Python modules, members): the parts after the first, unless external.
        for m in re.finditer(r"(?<![\w.:/-])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(\(|\*)?", s):
            parts = m.group(1).split(".")
            if parts[0] in EXTERNAL_ROOTS:
                continue
            if re.fullmatch(r"[a-z]+", parts[-1]) and parts[-1] in ("so", "h", "md", "cpp", "py", "json", "bin",
                                                                    "pc", "sh", "in", "cmake"):
                continue  # a file name: libcuda.so.1, manifest.json
            if re.search(r"\.\d", m.group(0)) or re.search(r"\.(so|h|json|bin|pc)\b", s):
                continue
            parts = parts if parts[0] == "megamoe" or code_shaped(parts[0]) else parts[1:]
            for i, p in enumerate(parts):
                if p != "megamoe":
                    last = i == len(parts) - 1 and m.group(2) == "*"
                    out.append((p, "prefix" if last else "word"))
        # An op and its attributes: `acc_store {quad}`, `mma_tile {pending = 1}`.
        op = re.fullmatch(r"([a-z]\w*)\s*\{([^}]*)\}", s)
        if op:
            out.append((op.group(1), "word"))
            out += [(a, "word") for a in re.findall(r"(?<![\w.])([A-Za-z_]\w*)", op.group(2))]
        # Calls foo( and keyword arguments name=.
        for m in re.finditer(r"(?<![\w.:$-])([A-Za-z_]\w*)\(", s):
            out.append((m.group(1), "word"))
        for m in re.finditer(r"(?<![\w.:$-])([a-z_]\w*)=(?!=)", s):
            out.append((m.group(1), "word"))
        # Bare code-shaped words (not parts of a path, flag, placeholder or file name).
        for m in re.finditer(r"(?<![\w.:/<$*-])([A-Za-z_]\w*)(?![\w/>*-]|\.\w|::)", s):
            w = m.group(1)
            if code_shaped(w) and not (m.start() > 0 and s[m.start() - 1] == "."):
                out.append((w, "prefix" if w.startswith("_") or w.endswith("_") else "word"))
        # Bare words followed by * (MEGAMOE_*, megamoe_layer_*) are families: their prefix must exist.
        for m in re.finditer(r"(?<![\w.:/-])([A-Za-z_]\w*_)\*", s):
            out.append((m.group(1), "prefix"))
        return out

    def exists(self, name, kind):
        if kind == "path":
            return self.path_ok(name)
        if kind == "flag":
            return re.search(re.escape(name) + r"(?![\w-])", self.text) is not None
        if kind == "prefix":
            return name.strip("_") != "" and name in self.text
        if kind == "qual":
            parts = [p for p in name.split("::") if p]
            if not all(self.has(p) for p in parts):
                return False
            if len(parts) >= 2:
                return bool(self.words[parts[0]] & self.words[parts[-1]])
            return True
        return self.has(name)


def docs(root):
    out = []
    if os.path.exists(os.path.join(root, "README.md")):
        out.append("README.md")
    for dirpath, _, filenames in os.walk(os.path.join(root, "docs")):
        for f in sorted(filenames):
            if f.endswith(".md"):
                rel = os.path.relpath(os.path.join(dirpath, f), root).replace(os.sep, "/")
                if rel not in SKIP_DOCS:
                    out.append(rel)
    return sorted(out)


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
    checker = Checker(root)
    allowed = {(d, n) for d, n, _ in ALLOWED}
    bad = 0
    checked = 0
    used = set()
    for doc in docs(root):
        with open(os.path.join(root, doc), encoding="utf-8") as fh:
            lines = fh.read().split("\n")
        fenced = False
        for i, line in enumerate(lines):  # fenced blocks (directory diagrams) are not read
            if line.lstrip().startswith("```"):
                fenced = not fenced
                lines[i] = ""
            elif fenced:
                lines[i] = ""
        text = "\n".join(lines)
        found = []  # (line, name, kind)
        for m in SPAN.finditer(text):  # a span may wrap onto the next line of its paragraph
            line = text.count("\n", 0, m.start()) + 1
            found += [(line, name, kind) for name, kind in checker.names_in(m.group(1).replace("\n", " "))]
        plain = SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
        for m in PLAIN_PATH.finditer(plain):
            path = m.group(1).rstrip(".,;:")
            if not any(c in path for c in "*<>") and ".." not in path:
                found.append((plain.count("\n", 0, m.start()) + 1, path, "path"))
        seen = set()
        for line, name, kind in sorted(found):
            if (line, name) in seen:
                continue
            entry = (doc, name) if (doc, name) in allowed else ("*", name) if ("*", name) in allowed else None
            if entry and not checker.exists(name, kind):
                used.add(entry)
                continue
            seen.add((line, name))
            checked += 1
            if not checker.exists(name, kind):
                print(f"{doc}:{line}: `{name}` named here is not in the code")
                bad += 1
    for doc, name, _ in ALLOWED:  # the allow-list stays as short as the docs need
        if (doc, name) not in used:
            print(f"{os.path.relpath(__file__)}: allowed `{name}` ({doc}) is not needed any more: drop the entry")
            bad += 1
    print(f"check_doc_identifiers: {checked} names checked in {len(docs(root))} docs, {bad} not in the code",
          file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
