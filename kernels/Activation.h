// Activation math shared by the standalone SwiGLU kernel and the SwiGLU epilogue of dispatch_grouped_gemm.
#pragma once
#include <cstdint>

#include "dsl/Dsl.h"

namespace megamoe::kernels {

// silu(gate) * up in f32, with the optional clamp (gate <= limit, |up| <= limit; limit in thousandths, 0 = off).
inline dsl::Vec swiglu(dsl::Vec gate, dsl::Vec up, int64_t clampMilli) {
  if (clampMilli > 0) {
    float limit = float(clampMilli) / 1000.f;
    gate = gate.min(limit);
    up = up.min(limit).max(-limit);
  }
  // silu(g) = g / (1 + e^-g), with e^x = 2^(x log2 e).
  dsl::Vec e = (-(gate * gate.splat(1.4426950408889634f))).exp2();
  return gate / (e + e.splat(1.f)) * up;
}

}  // namespace megamoe::kernels
