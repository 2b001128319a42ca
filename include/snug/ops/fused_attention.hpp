// Fused attention: causal multi-head self-attention computed by a library
// engine (cuDNN's fused SDPA, snug/cuda/cudnn_attention.hpp) instead of
// snug's own kernels, behind the flash-attention contract
// (ops/flash_attention.hpp) up to the engine's rounding: the same fused qkv
// (B, T, 3C) read in place (q, k and v of head h at channels h hs, C + h hs,
// 2C + h hs of each row: llm.c's strides, no permute), the same output
// (B, T, C), and the same statistics — one fp32 natural-log log-sum-exp per
// (b, h, t) row of the scaled scores — so a pass may mix the engine and the
// hand-written kernels. The backward overwrites dqkv (B, T, 3C) and needs a
// workspace the engine sizes; it computes D = rowsum(dout * out) itself.
//
// FusedAttentionPlanner is what a device tag holds of an engine to plan with:
// whether it takes a case (a refusal names why not) and the workspace of
// each pass. snug::Meter asks it while the planner meters a run, snug::Cuda
// runs the engine itself (cuda/fused_attention.hpp); the host backend has no
// engine and always takes the flash kernels.
#pragma once

#include <concepts>
#include <cstddef>
#include <string>

#include "snug/core/dtype.hpp"
#include "snug/core/half.hpp"
#include "snug/ops/flash_attention.hpp"

namespace snug {

// The activation types a fused engine takes.
template <class T>
concept FusedAttentionInput = std::same_as<T, bfloat16> || std::same_as<T, half>;

// One call: the activations' type (bf16 or f16), batch, sequence length,
// channels, heads (hs = C / NH).
struct FusedAttentionShape {
    DType dtype = DType::bf16;
    int B = 0, T = 0, C = 0, NH = 0;
    bool operator==(const FusedAttentionShape&) const = default;
};

enum class AttentionPass : unsigned char { forward, backward };

class FusedAttentionPlanner {
public:
    virtual ~FusedAttentionPlanner() = default;
    // Empty when the engine takes the case, else why it does not (the
    // engine's own words). Answers are cached per shape.
    virtual std::string refusal(const FusedAttentionShape& shape) = 0;
    // The workspace a pass of a case the engine takes needs, in bytes.
    virtual std::size_t workspace_bytes(const FusedAttentionShape& shape, AttentionPass pass) = 0;
    // The engine, for reports: "cuDNN 9.19.0 fused SDPA (frontend 1.32.0)".
    virtual std::string describe() const = 0;
};

}  // namespace snug
