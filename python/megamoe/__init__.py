"""megamoe for PyTorch: the fused expert-parallel MoE layer and the grouped GEMMs as torch ops, over libmegamoe's
C ABI (ctypes; docs/python.md). Without torch only the bindings (megamoe._lib) are usable."""
from ._lib import Library, MegamoeError, library_candidates  # noqa: F401

__version__ = "0.1.0"
__all__ = ["Library", "MegamoeError", "library_candidates", "HAS_CUSTOM_OP", "ArgumentError", "fused_moe",
           "fused_moe_fp8", "grouped_mm", "grouped_mm_nt", "grouped_mm_nn", "grouped_mm_tn", "grouped_mm_fp8",
           "quantize_fp8", "MoeExperts", "convert_experts", "reference_moe", "to_gate_up_down", "Workspace", "layer_command", "fp8"]

try:
    import torch  # noqa: F401
except ImportError:  # the bindings alone (the CPU tier tests them without torch too)
    pass
else:
    from . import fp8  # noqa: F401  (FP8 e4m3 formats, quantisers, reference, checkpoint reader; docs/fp8.md)
    from .kernels import layer_command  # noqa: F401
    from .modules import MoeExperts, convert_experts, reference_moe, to_gate_up_down  # noqa: F401
    from .ops import (HAS_CUSTOM_OP, ArgumentError, fused_moe, fused_moe_fp8, grouped_mm,  # noqa: F401
                      grouped_mm_fp8, grouped_mm_nn, grouped_mm_nt, grouped_mm_tn, quantize_fp8)
    from .workspace import Workspace  # noqa: F401
