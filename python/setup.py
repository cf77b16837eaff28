"""Records the source tree the package is installed from (megamoe/_source_tree.py), so that an installed copy finds
that tree's build/lib/libmegamoe.so (python/megamoe/_lib.py library_candidates). Everything else is pyproject.toml."""
import os

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class BuildPy(build_py):
    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "megamoe", "_source_tree.py")
        with open(target, "w") as f:
            f.write('"""Written by setup.py: the source tree this copy was installed from."""\nROOT = %r\n' % ROOT)


setup(cmdclass={"build_py": BuildPy})
