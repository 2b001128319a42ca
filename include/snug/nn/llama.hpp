// Llama<Act, D>: a Llama-style decoder — token embedding without learned
// positions, LlamaBlocks (RMSNorm, attention with RoPE, SwiGLU MLP), a final
// RMSNorm and an untied head — as a CausalLM of the LlamaFamily below.
// make_llama_config fills in what follows from the sizes (the MLP's width,
// the residual init's depth).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "snug/core/device.hpp"
#include "snug/nn/causal_lm.hpp"
#include "snug/nn/llama_block.hpp"
#include "snug/nn/model_identity.hpp"
#include "snug/nn/rmsnorm.hpp"

namespace snug {

struct LlamaFamily {
    using BlockShape = LlamaBlockShape;
    template <class Act, DeviceTag D>
    using Block = LlamaBlock<Act, D>;
    template <class Act, DeviceTag D>
    using FinalNorm = RMSNorm<Act, D>;
    static int channels(const BlockShape& s) { return s.channels; }
    static constexpr bool learned_positions = false;
    static constexpr bool tied_head = false;
    // For state files: a Llama state resumes only into a Llama of these fields
    // (the attention path is not one: it changes only rounding). kv_heads is
    // written only where it differs from heads, so states saved before
    // grouped-query attention existed still resume.
    static constexpr std::string_view name = "llama";
    static std::vector<ModelField> fields(const BlockShape& s) {
        std::vector<ModelField> f{{"channels", static_cast<double>(s.channels)},
                                  {"heads", static_cast<double>(s.heads)},
                                  {"hidden", static_cast<double>(s.hidden)},
                                  {"rope_theta", s.rope_theta},
                                  {"norm_eps", s.norm_eps}};
        if (s.key_value_heads() != s.heads) f.push_back({"kv_heads", static_cast<double>(s.key_value_heads())});
        return f;
    }
    // The final norm takes the blocks' epsilon (transformers' rms_norm_eps is every norm's).
    template <class Act, DeviceTag D>
    static RMSNorm<Act, D> final_norm(ParameterRegistry& r, const std::string& name, const BlockShape& s) {
        return RMSNorm<Act, D>(r, name, s.channels, s.norm_eps);
    }
};

template <class Act, DeviceTag D>
using Llama = CausalLM<LlamaFamily, Act, D>;
using LlamaConfig = CausalLMConfig<LlamaFamily>;

// A Llama config: the vocabulary padded to a multiple of 64, the MLP's
// hidden width Llama's 8C/3 rounded up to a multiple of 64 unless given.
// kv_heads: grouped-query attention's key/value heads (0: as many as heads).
inline LlamaConfig make_llama_config(int vocab_size, int max_seq_len, int n_layer, int channels, int heads,
                                     int hidden = 0, int kv_heads = 0) {
    LlamaConfig c;
    c.vocab_size = vocab_size;
    c.padded_vocab_size = LlamaConfig::pad_vocab(vocab_size);
    c.max_seq_len = max_seq_len;
    c.n_layer = n_layer;
    c.block.channels = channels;
    c.block.heads = heads;
    c.block.kv_heads = kv_heads;
    c.block.hidden = hidden > 0 ? hidden : (8 * channels / 3 + 63) / 64 * 64;
    c.block.layers = n_layer;
    return c;
}

}  // namespace snug
