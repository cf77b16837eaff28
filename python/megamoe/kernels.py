"""Kernel cache misses: the one megamoe-cache command that generates what is missing, and, where megamoe's compiler
is installed (a megamoe-cache executable), compiling it on first use (JIT), said in the log."""
import logging
import os
import shutil
import subprocess

from . import _lib

log = logging.getLogger("megamoe")


def layer_command(hidden, intermediate, experts, topk, ranks, target, dtype="bf16"):
    """The megamoe-cache command that generates every kernel of one layer at `ranks` ranks: in bf16 its forward,
    backward, int64 topk_idx and token deduplication; in FP8 (dtype "fp8_e4m3", or "fp8") the FP8 layer's forward
    with int32 and int64 topk_idx (--dtype fp8)."""
    return ("megamoe-cache generate --hidden %d --intermediate %d --experts %d --topk %d --ep %d%s --targets %s"
            % (hidden, intermediate, experts, topk, ranks, " --dtype fp8" if dtype in ("fp8", "fp8_e4m3") else "",
               target or "sm_90a"))


def cache_tool():
    """The megamoe-cache executable, or None: $MEGAMOE_CACHE_TOOL, else the one beside the loaded libmegamoe.so
    (BUILD/lib/../bin, PREFIX/lib/../bin), else megamoe-cache on PATH."""
    env = os.environ.get("MEGAMOE_CACHE_TOOL")
    if env:
        if not os.access(env, os.X_OK):
            raise _lib.MegamoeError(_lib.INVALID_ENV, "MEGAMOE_CACHE_TOOL='%s' is invalid: expected an executable "
                                    "megamoe-cache (it is %s)" % (env, "not executable" if os.path.exists(env)
                                                                  else "no such file"))
        return env
    try:
        lib_path = _lib.Library.get().path
    except OSError:
        lib_path = None
    if lib_path and os.path.isabs(lib_path):
        beside = os.path.join(os.path.dirname(lib_path), "..", "bin", "megamoe-cache")
        if os.access(beside, os.X_OK):
            return os.path.normpath(beside)
    return shutil.which("megamoe-cache")


def jit_enabled():
    """MEGAMOE_JIT=0 turns compiling on a miss off (the miss is then an error naming the command); 1 (the default)
    leaves it on; anything else is an error naming the variable."""
    return _lib.env_choice("MEGAMOE_JIT", "1", ("0", "1")) == "1"


def with_kernels(load, command, what):
    """load() (which loads kernels from the cache); on a miss, or when the cache holds them only from another
    kernel generator (stale), compiles with `command` (a megamoe-cache command line, without the program name's
    path) when a compiler is installed and retries once; else raises the miss naming `command`."""
    try:
        return load()
    except _lib.MegamoeError as e:
        if e.status not in (_lib.KERNEL_NOT_FOUND, _lib.STALE_KERNEL):
            raise
        miss = e
    tool = cache_tool() if jit_enabled() else None
    if tool is None:
        raise _lib.MegamoeError(miss.status, "%s: kernels missing from the cache; generate them with:\n    %s\n"
                                             "(the runtime said: %s)" % (what, command, miss.message))
    argv = [tool] + command.split()[1:] + ["--quiet"]
    log.warning("megamoe: %s: kernels missing from the cache; compiling them now (JIT): %s", what, " ".join(argv))
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        raise _lib.MegamoeError(miss.status, "%s: the JIT compile failed (exit status %d): %s\n%s" % (
            what, done.returncode, " ".join(argv), done.stdout[-4000:]))
    log.warning("megamoe: %s: compiled (JIT) into the cache", what)
    return load()
