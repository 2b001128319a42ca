// The token + position embedding's contract, for every backend: B sequences
// of T tokens, C channels. (Token ids are data: the host checks them as it
// reads them; the device cannot without a round trip.)
#pragma once

#include "snug/ops/sizes.hpp"

namespace snug::ops {

inline void check_encoder(const char* op, int B, int T, int C) { check_non_negative(op, {{"B", B}, {"T", T}, {"C", C}}); }

}  // namespace snug::ops
