#!/usr/bin/env python3
"""Every relative markdown link resolves (issue 47 item 4).

Reads README.md, docs/**/*.md and bench/results/**/*.md and checks each relative link target:
inline links and images (`[text](path)`, `![alt](path "title")`, `[text](<path with spaces>)`) and
reference definitions (`[name]: path`). The target, without its `#fragment` or `?query`, is resolved
against the markdown file's folder (or against the repository root when it starts with `/`) and must be
an existing file or folder. Links with a scheme (https:, mailto:, ...) and bare `#anchors` are skipped, and
so are code spans and fenced blocks, where brackets are code, not links.

Files that moved to the lab-notebook branch (bench/results/INDEX.md says how to get them) are named in
code spans there, not linked, so a link to one fails here.

Usage: check_links.py [REPO_ROOT]   (default: two folders above this file)
Prints `file:line: link `target` does not resolve` for each broken link and exits 1 if there is any.
"""
import os
import re
import sys
from urllib.parse import unquote

SCAN_FILES = ["README.md"]
SCAN_DIRS = ["docs", "bench/results"]

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(?:.+?)\1")
# [text](target) or ![alt](target); text may hold one level of nested brackets (image inside a link).
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)(?:\s+[^)]*)?\)")
REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def markdown_files(root):
    out = [f for f in SCAN_FILES if os.path.isfile(os.path.join(root, f))]
    for d in SCAN_DIRS:
        for base, dirs, files in os.walk(os.path.join(root, d)):
            dirs.sort()
            for f in sorted(files):
                if f.endswith(".md"):
                    out.append(os.path.relpath(os.path.join(base, f), root))
    return out


def targets(line):
    line = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
    m = REFDEF.match(line)
    if m:
        yield m.group(1)
    for m in INLINE.finditer(line):
        yield m.group(1)


def check(root):
    bad = []
    n = 0
    for rel in markdown_files(root):
        folder = os.path.dirname(os.path.join(root, rel))
        fenced = False
        with open(os.path.join(root, rel), encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if FENCE.match(line):
                    fenced = not fenced
                    continue
                if fenced:
                    continue
                for t in targets(line):
                    t = t.strip()
                    if t.startswith("<") and t.endswith(">"):
                        t = t[1:-1].strip()
                    if not t or t.startswith("#") or SCHEME.match(t):
                        continue
                    path = unquote(re.split(r"[#?]", t, 1)[0])
                    if not path:
                        continue
                    full = os.path.join(root, path.lstrip("/")) if path.startswith("/") else os.path.join(folder, path)
                    n += 1
                    if not os.path.exists(full):
                        bad.append(f"{rel}:{lineno}: link `{t}` does not resolve")
    return n, bad


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    n, bad = check(os.path.abspath(root))
    for b in bad:
        print(b)
    print(f"{n} relative links checked, {len(bad)} broken")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
