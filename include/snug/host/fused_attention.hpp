// Fused attention on the host backend (ops/fused_attention.hpp): there is no
// engine, so every call refuses and layers take the host flash kernels. The
// other calls exist only so that a layer's code compiles for every backend;
// reaching them is a bug, reported as snug::Error.
#pragma once

#include <cstddef>
#include <string>

#include "snug/core/device.hpp"
#include "snug/core/error.hpp"
#include "snug/ops/fused_attention.hpp"

namespace snug::host {

template <FusedAttentionInput T>
std::string fused_attention_refusal(const Device&, int /*B*/, int /*T*/, int /*C*/, int /*NH*/) {
    return "the host backend has no fused attention engine";
}

inline std::string fused_attention_engine(const Device&) { return "none"; }

template <FusedAttentionInput T>
std::size_t fused_attention_workspace(const Device&, AttentionPass, int, int, int, int) {
    throw Error("fused_attention_workspace: the host backend has no fused attention engine");
}

template <FusedAttentionInput T>
void fused_attention_forward(const Device&, std::byte*, T*, float*, const T*, int, int, int, int) {
    throw Error("fused_attention_forward: the host backend has no fused attention engine");
}

template <FusedAttentionInput T>
void fused_attention_backward(const Device&, std::byte*, T*, const T*, const T*, const T*, const float*, int, int, int,
                              int) {
    throw Error("fused_attention_backward: the host backend has no fused attention engine");
}

}  // namespace snug::host
