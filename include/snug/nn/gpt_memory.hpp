// What a GPT's forward and backward keep in the activation arena, predicted
// to the byte for a batch shape and a recompute mode per block, without
// allocating anything. It follows the push order of GPT, LayerStack and
// TransformerBlock (tests/host/checkpoint_test.cpp holds the two to each other).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "snug/core/error.hpp"
#include "snug/nn/gpt_config.hpp"
#include "snug/nn/layer_stack.hpp"

namespace snug {

// Bytes of one block's saved activations per mode, for N = B·T tokens.
struct BlockActivationBytes {
    std::size_t keep;       // everything: 15 (N, C) tensors' worth, the T² probabilities, 4 LayerNorm stat vectors
    std::size_t selective;  // GEMM outputs only: qkv (3), attention output, residual, MLP hidden (4)
    std::size_t recompute_selective;  // what selective backward rebuilds: GELU (4), two LayerNorms, probabilities
};

inline BlockActivationBytes gpt_block_activation_bytes(const GPTConfig& c, int B, int T, std::size_t act_bytes) {
    const std::size_t N = static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
    const std::size_t NC = N * static_cast<std::size_t>(c.channels);
    const std::size_t att = static_cast<std::size_t>(B) * static_cast<std::size_t>(c.n_head) *
                            static_cast<std::size_t>(T) * static_cast<std::size_t>(T);
    const std::size_t stats = 2 * 2 * N * sizeof(float);  // mean and rstd of both LayerNorms
    return {act_bytes * (15 * NC + att) + stats, act_bytes * 9 * NC, act_bytes * (6 * NC + att) + stats};
}

// Peak bytes in MemoryCategory::activations over one GPT forward (with
// targets) and backward, for a recompute mode per block.
inline std::size_t gpt_activation_peak(const GPTConfig& c, int B, int T, std::span<const Recompute> modes,
                                       std::size_t act_bytes) {
    if (modes.size() != static_cast<std::size_t>(c.n_layer))
        throw Error("gpt_activation_peak: " + std::to_string(modes.size()) + " modes for " +
                    std::to_string(c.n_layer) + " blocks");
    const std::size_t N = static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
    const std::size_t x = act_bytes * N * static_cast<std::size_t>(c.channels);  // one (B, T, C) tensor
    const BlockActivationBytes block = gpt_block_activation_bytes(c, B, T, act_bytes);
    auto kept = [&](Recompute r) {
        return r == Recompute::none ? block.keep : r == Recompute::selective ? block.selective : std::size_t{0};
    };
    // Forward: the embedding, then per block its output and what it keeps
    // (a checkpointed block holds all of it for a moment, then lets go).
    std::size_t cur = x, peak = x;
    for (Recompute r : modes) {
        cur += x;
        if (r == Recompute::full) peak = std::max(peak, cur + block.keep);
        cur += kept(r);
        peak = std::max(peak, cur);
    }
    // The head: ln_f (+ its statistics), the logits, the per-token losses for a moment.
    const std::size_t head = x + 2 * N * sizeof(float) + act_bytes * N * static_cast<std::size_t>(c.padded_vocab_size);
    peak = std::max(peak, cur + head + N * sizeof(float));
    // Backward, head gone: each block, last first, may rebuild before it releases.
    for (std::size_t j = modes.size(); j-- > 0;) {
        if (modes[j] == Recompute::selective) peak = std::max(peak, cur + block.recompute_selective);
        if (modes[j] == Recompute::full) peak = std::max(peak, cur + x + block.keep);
        cur -= kept(modes[j]) + x;
    }
    return peak;
}

}  // namespace snug
