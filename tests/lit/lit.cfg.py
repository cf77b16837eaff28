# lit configuration of the megamoe IR tests. Run through the build's generated lit.site.cfg.py:
#   lit -sv build/tests/lit            (or: ctest -R '^lit$', ninja check-megamoe-lit)
import os

import lit.formats

config.name = "megamoe"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir"]

if not hasattr(config, "megamoe_tools_dir"):
    lit_config.fatal("run lit on the build directory (build/tests/lit), which holds the generated lit.site.cfg.py")

config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = config.megamoe_lit_binary_dir

# megamoe-opt from this build first, then LLVM's FileCheck and not: never whatever else PATH holds.
for tool in ("megamoe-opt",):
    if not os.path.isfile(os.path.join(config.megamoe_tools_dir, tool)):
        lit_config.fatal(f"{tool} not found in {config.megamoe_tools_dir}: build it first (ninja megamoe-opt)")
for tool in ("FileCheck", "not"):
    if not os.path.isfile(os.path.join(config.llvm_tools_dir, tool)):
        lit_config.fatal(f"{tool} not found in {config.llvm_tools_dir}")
config.environment["PATH"] = os.pathsep.join(
    [config.megamoe_tools_dir, config.llvm_tools_dir, config.environment.get("PATH", os.environ.get("PATH", ""))]
)
