// RoPE's contract, for every backend (rotary position embedding, Llama's):
// the convention, the defaults and the argument check.
//
// On q or k shaped (B, T, NH, hs), hs even, with h = hs / 2 and for every
// pair i in [0, h) of every head (Hugging Face Llama's "rotate_half" pairing,
// (i, i + h); not the interleaved (2i, 2i + 1) pairing of the original
// Llama code, which needs permuted q/k weights to match):
//   angle = (pos_offset + t) * theta^(-2i / hs)
//   out[.., i]     = x[.., i] cos(angle) - x[.., i + h] sin(angle)
//   out[.., i + h] = x[.., i + h] cos(angle) + x[.., i] sin(angle)
// The backward is the inverse rotation (angle -> -angle) of the gradient.
// Out of place or in place: out may equal inp (each pair is read before it is
// written), any other overlap is undefined.
//
// row_stride: elements from one position's first head to the next position's
// (in and out alike); 0 means NH * hs, contiguous heads. A larger stride
// rotates the first NH heads of wider rows and leaves the rest alone: on a
// fused qkv (B, T, 3 NH', hs) row, NH = 2 NH' and row_stride = 3 NH' hs
// rotate q and k in place and not v.
//
// Both backends compute the angle, cos and sin in double (once per position
// and pair, shared by the NH heads), then rotate in the compute type (fp32
// for fp32 and 16-bit activations): cos and sin are the correctly rounded
// fp32 values to within an ulp at any position, where an fp32 angle would be
// off by up to pos * 2^-24 rad (Hugging Face computes it in fp32).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "snug/core/error.hpp"
#include "snug/ops/sizes.hpp"

namespace snug::ops {

// The default base of the rotation frequencies: Llama 1 and 2's (Llama 3 uses
// 500000, passed explicitly).
inline constexpr double rope_theta = 10000.0;

// Non-negative sizes, an even head size, a position offset >= 0, and a finite
// theta > 0, and a row_stride of 0 or at least NH * hs (ShapeError for a
// size, ConfigError for theta or the offset).
inline void check_rope(const char* op, int B, int T, int NH, int hs, double theta, std::int64_t pos_offset,
                       std::int64_t row_stride) {
    check_non_negative(op, {{"B", B}, {"T", T}, {"NH", NH}, {"hs", hs}});
    if (row_stride != 0 && row_stride < std::int64_t{NH} * hs) {
        throw ShapeError(std::string(op) + ": row_stride = " + std::to_string(row_stride) + " is less than NH * hs = " +
                         std::to_string(std::int64_t{NH} * hs) + " (rows of heads would overlap)");
    }
    if (hs % 2 != 0) {
        throw ShapeError(std::string(op) + ": hs = " + std::to_string(hs) +
                         " is odd (RoPE rotates pairs (i, i + hs/2) of each head)");
    }
    if (!(theta > 0.0) || !std::isfinite(theta)) {
        throw ConfigError(std::string(op) + ": theta = " + std::to_string(theta) + " (must be finite and positive)");
    }
    if (pos_offset < 0) {
        throw ConfigError(std::string(op) + ": pos_offset = " + std::to_string(pos_offset) + " (must be >= 0)");
    }
}

// The row stride a call means: row_stride, or NH * hs for 0.
inline std::int64_t rope_row_stride(int NH, int hs, std::int64_t row_stride) {
    return row_stride != 0 ? row_stride : std::int64_t{NH} * hs;
}

}  // namespace snug::ops
