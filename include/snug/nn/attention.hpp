// How a layer runs attention that keeps one log-sum-exp per row — the flash
// contract (ops/flash_attention.hpp) — for AttentionKind::flash and ::cudnn:
// on the device's fused engine (cuDNN's SDPA, ops/fused_attention.hpp) when
// the kind is cudnn and the engine takes the call, otherwise on snug's flash
// kernels (always for grouped-query attention, KV < NH, which the fused path
// does not take). Either way the layer keeps the output and the log-sum-exp; the
// call's own temporary (the engine's workspace, or flash's row sums in the
// backward) lives in `scratch` while it runs. Both produce the same
// statistics, so a forward and a backward may even take different paths.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "snug/core/arena.hpp"
#include "snug/core/device.hpp"
#include "snug/nn/attention_kind.hpp"
#include "snug/ops/fused_attention.hpp"
#include "snug/ops/kernels.hpp"

namespace snug {

// Why snug's fused path does not take a call with KV key/value heads, or
// empty: it takes multi-head attention only (KV = NH).
inline std::string fused_attention_grouped_refusal(int NH, int KV) {
    if (KV == NH) return {};
    return "grouped-query attention (" + std::to_string(NH) + " query heads, " + std::to_string(KV) +
           " key/value heads) is not wired to the fused engine";
}

// Whether this call runs on the device's fused engine.
template <class Act, DeviceTag D>
bool uses_fused_attention(AttentionKind kind, const D& dev, int B, int T, int C, int NH, int KV) {
    if constexpr (FusedAttentionInput<Act>) {
        return kind == AttentionKind::cudnn && fused_attention_grouped_refusal(NH, KV).empty() &&
               fused_attention_refusal<Act>(dev, B, T, C, NH).empty();
    } else {
        return false;
    }
}

// What computes a call of this shape, for a report: "flash kernels",
// "materialized", the engine's description, or "flash kernels (<why the
// engine does not take it>)".
template <class Act, DeviceTag D>
std::string attention_path(AttentionKind kind, const D& dev, int B, int T, int C, int NH, int KV) {
    if (kind == AttentionKind::materialized) return "materialized (the B NH T T probabilities kept)";
    if (kind != AttentionKind::cudnn) return "flash kernels";
    if constexpr (FusedAttentionInput<Act>) {
        std::string why = fused_attention_grouped_refusal(NH, KV);
        if (why.empty()) why = fused_attention_refusal<Act>(dev, B, T, C, NH);
        if (why.empty()) return fused_attention_engine(dev);
        return "flash kernels (no fused engine for this call: " + why + ")";
    } else {
        return "flash kernels (no fused engine for this call: fused engines take bf16 or fp16 activations)";
    }
}

template <class Act, DeviceTag D>
void flash_or_fused_forward(AttentionKind kind, ActivationArena<D>& scratch, const D& dev,
                            Act* out,                       // (B, T, C)
                            ops::flash_stat_t<Act>* lse,    // (B, NH, T)
                            const Act* qkv,                 // (B, T, C + 2 KV hs)
                            int B, int T, int C, int NH, int KV) {
    if constexpr (FusedAttentionInput<Act>) {
        if (uses_fused_attention<Act>(kind, dev, B, T, C, NH, KV)) {
            std::byte* workspace = scratch.template push<std::byte>(
                fused_attention_workspace<Act>(dev, AttentionPass::forward, B, T, C, NH), "fused attention workspace");
            fused_attention_forward(dev, workspace, out, lse, qkv, B, T, C, NH);
            scratch.pop(workspace);
            return;
        }
    }
    flash_attention_forward(dev, out, lse, qkv, B, T, C, NH, KV);
}

template <class Act, DeviceTag D>
void flash_or_fused_backward(AttentionKind kind, ActivationArena<D>& scratch, const D& dev,
                             Act* dqkv,                           // (B, T, C + 2 KV hs) overwritten
                             const Act* dout,                     // (B, T, C)
                             const Act* qkv,                      // (B, T, C + 2 KV hs)
                             const Act* out,                      // (B, T, C)
                             const ops::flash_stat_t<Act>* lse,   // (B, NH, T)
                             int B, int T, int C, int NH, int KV) {
    if constexpr (FusedAttentionInput<Act>) {
        if (uses_fused_attention<Act>(kind, dev, B, T, C, NH, KV)) {
            std::byte* workspace = scratch.template push<std::byte>(
                fused_attention_workspace<Act>(dev, AttentionPass::backward, B, T, C, NH), "fused attention workspace");
            fused_attention_backward(dev, workspace, dqkv, dout, qkv, out, lse, B, T, C, NH);
            scratch.pop(workspace);
            return;
        }
    }
    auto* row_sums = scratch.template push<ops::flash_stat_t<Act>>(ops::flash_stat_elems(B, T, NH),
                                                                   "d attention row sums");
    flash_attention_backward(dev, dqkv, row_sums, dout, qkv, out, lse, B, T, C, NH, KV);
    scratch.pop(row_sums);
}

}  // namespace snug
