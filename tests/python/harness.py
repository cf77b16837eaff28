"""What the GPU tier needs from a test runner, with or without pytest: pytest collects the test_* functions as
usual; where pytest is not installed (the GPU machine's Python may lack it), `python3 FILE --junit X --json Y` runs
them in file order, prints one verdict line each and writes JUnit XML and JSON."""
import json
import re
import sys
import time
import traceback
import xml.sax.saxutils as sax

try:
    import pytest
except ImportError:
    pytest = None


RUNNING_MAIN = False  # main() runs the tests itself (pytest's skip is then not ours)


class Skipped(Exception):
    pass


def skip(reason):
    if pytest is not None and not RUNNING_MAIN:
        pytest.skip(reason)
    raise Skipped(reason)


class raises:
    """with raises(Exc, match=regex): the block must raise Exc whose message matches regex (re.search)."""

    def __init__(self, exc, match=None):
        self.exc, self.match = exc, match
        self.value = None

    def __enter__(self):
        return self

    def __exit__(self, typ, value, tb):
        if typ is None:
            raise AssertionError("expected %s%s, nothing was raised" % (
                self.exc.__name__, " matching %r" % self.match if self.match else ""))
        if not issubclass(typ, self.exc):
            return False
        if self.match and not re.search(self.match, str(value)):
            raise AssertionError("%s raised, but %r does not match %r" % (typ.__name__, str(value), self.match))
        self.value = value
        return True


def main(module_globals, argv=None):
    """Runs every test_* function of the module in definition order; exit status 0 only if none failed."""
    global RUNNING_MAIN
    RUNNING_MAIN = True
    argv = sys.argv[1:] if argv is None else argv
    junit = argv[argv.index("--junit") + 1] if "--junit" in argv else None
    json_out = argv[argv.index("--json") + 1] if "--json" in argv else None
    only = argv[argv.index("-k") + 1] if "-k" in argv else None
    tests = [(n, f) for n, f in module_globals.items() if n.startswith("test_") and callable(f)]
    results = []
    for name, fn in tests:
        if only and only not in name:
            continue
        start = time.time()
        try:
            fn()
            verdict, detail = "passed", ""
        except Skipped as e:
            verdict, detail = "skipped", str(e)
        except Exception:
            verdict, detail = "failed", traceback.format_exc()
        results.append({"name": name, "verdict": verdict, "seconds": round(time.time() - start, 3), "detail": detail})
        print("%-7s %s (%.1f s)%s" % (verdict.upper(), name, results[-1]["seconds"],
                                      ("\n" + detail) if verdict != "passed" else ""))
        sys.stdout.flush()
    failed = sum(r["verdict"] == "failed" for r in results)
    print("%d passed, %d failed, %d skipped" % (sum(r["verdict"] == "passed" for r in results), failed,
                                                sum(r["verdict"] == "skipped" for r in results)))
    if json_out:
        with open(json_out, "w") as f:
            json.dump(results, f, indent=1)
    if junit:
        with open(junit, "w") as f:
            f.write('<?xml version="1.0"?>\n<testsuite name="megamoe-python-gpu" tests="%d" failures="%d">\n' % (
                len(results), failed))
            for r in results:
                f.write('  <testcase name=%s time="%.3f">' % (sax.quoteattr(r["name"]), r["seconds"]))
                if r["verdict"] == "failed":
                    f.write("<failure>%s</failure>" % sax.escape(r["detail"]))
                elif r["verdict"] == "skipped":
                    f.write("<skipped message=%s/>" % sax.quoteattr(r["detail"]))
                f.write("</testcase>\n")
            f.write("</testsuite>\n")
    return 1 if failed or not results else 0
