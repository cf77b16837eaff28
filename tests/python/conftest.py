"""Shared by the Python tiers: the package from this tree (python/), the build folder ($MEGAMOE_BUILD_DIR, else
build/), and for the CPU tier the fake HIP library and the stand-in layer cache writer built there."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
BUILD = os.path.join(ROOT, os.environ.get("MEGAMOE_BUILD_DIR", "build"))
