// Activation math shared by the standalone SwiGLU kernel and the SwiGLU epilogue of dispatch_grouped_gemm.
#pragma once
#include <cstdint>

#include "dsl/Dsl.h"

namespace megamoe::kernels {

// 1 / (1 + e^-z) in f32, with e^x = 2^(x log2 e).
inline dsl::Vec sigmoid(const dsl::Vec& z) {
  dsl::Vec e = (-(z * z.splat(1.4426950408889634f))).exp2();
  return z.splat(1.f) / (e + e.splat(1.f));
}

// The SwiGLU clamp (gate <= limit, |up| <= limit; limit in thousandths, 0 = off), applied in place.
inline void clampSwiglu(dsl::Vec& gate, dsl::Vec& up, int64_t clampMilli) {
  if (clampMilli <= 0) return;
  float limit = float(clampMilli) / 1000.f;
  gate = gate.min(limit);
  up = up.min(limit).max(-limit);
}

// silu(gate) * up in f32, with the optional clamp.
inline dsl::Vec swiglu(dsl::Vec gate, dsl::Vec up, int64_t clampMilli) {
  clampSwiglu(gate, up, clampMilli);
  return gate * sigmoid(gate) * up;
}

}  // namespace megamoe::kernels
