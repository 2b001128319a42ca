// Where each GPT parameter lives inside one contiguous buffer: GPT declares its
// tensors into a ParameterRegistry (nn/parameters.hpp) in llm.c's order
// (tensors grouped by kind across layers), so an llm.c model file is one copy;
// the registry gives every tensor its GPT-2 name, its decay and its initial
// values.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "snug/core/error.hpp"
#include "snug/core/tensor.hpp"
#include "snug/nn/gpt_config.hpp"
#include "snug/nn/parameters.hpp"
#include "snug/optim/parameter_group.hpp"

namespace snug {

// The 16 grouped tensors in buffer order, with their shapes for a config.
enum class GPTTensor : int {
    wte, wpe, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb, lnfw, lnfb
};
inline constexpr int gpt_tensor_count = 16;

inline Shape gpt_tensor_shape(const GPTConfig& c, GPTTensor t) {
    const std::int64_t L = c.n_layer, C = c.channels;
    switch (t) {
        case GPTTensor::wte: return {c.padded_vocab_size, C};
        case GPTTensor::wpe: return {c.max_seq_len, C};
        case GPTTensor::ln1w: case GPTTensor::ln1b: case GPTTensor::ln2w: case GPTTensor::ln2b:
        case GPTTensor::attprojb: case GPTTensor::fcprojb: return {L, C};
        case GPTTensor::qkvw: return {L, 3 * C, C};
        case GPTTensor::qkvb: return {L, 3 * C};
        case GPTTensor::attprojw: return {L, C, C};
        case GPTTensor::fcw: return {L, 4 * C, C};
        case GPTTensor::fcb: return {L, 4 * C};
        case GPTTensor::fcprojw: return {L, C, 4 * C};
        case GPTTensor::lnfw: case GPTTensor::lnfb: return {C};
    }
    throw Error("unknown GPT tensor");
}

// GPT's tensors as a ParameterRegistry, in llm.c's order: the embeddings,
// then each per-layer kind for every layer in turn (ln_1.weight of h.0, h.1,
// ..., then ln_1.bias of every layer, ...), then ln_f — so an llm.c model file
// is one copy. Names are Hugging Face GPT2Model's; linear weights keep
// PyTorch nn.Linear's (out, in) layout (the exporter transposes for HF's
// Conv1D). Initialisation is GPT-2's: matmul weights and embeddings
// N(0, 0.02²), the two residual projections N(0, (0.02 / sqrt(2 L))²), biases
// 0, LayerNorm weights 1, padded vocabulary rows 0. 2-D weights decay.
// `kind_offsets[t]`, when given, receives where kind t starts.
inline ParameterRegistry gpt_parameter_registry(const GPTConfig& c,
                                                std::array<std::int64_t, gpt_tensor_count>* kind_offsets = nullptr) {
    const float residual_std = 0.02f / std::sqrt(2.0f * static_cast<float>(c.n_layer));
    const auto init = [&](GPTTensor t) {
        switch (t) {
            case GPTTensor::wte: return Init::normal(0.02f, std::int64_t{c.vocab_size} * c.channels);
            case GPTTensor::wpe: case GPTTensor::qkvw: case GPTTensor::fcw: return Init::normal(0.02f);
            case GPTTensor::attprojw: case GPTTensor::fcprojw: return Init::normal(residual_std);
            case GPTTensor::ln1w: case GPTTensor::ln2w: case GPTTensor::lnfw: return Init::ones();
            default: return Init::zeros();
        }
    };
    const auto decay = [](GPTTensor t) {
        switch (t) {
            case GPTTensor::wte: case GPTTensor::wpe: case GPTTensor::qkvw: case GPTTensor::attprojw:
            case GPTTensor::fcw: case GPTTensor::fcprojw: return Decay::yes;
            default: return Decay::no;
        }
    };
    constexpr const char* layer_suffix[gpt_tensor_count] = {
        nullptr, nullptr, "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
        "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
        "mlp.c_proj.weight", "mlp.c_proj.bias", nullptr, nullptr};
    constexpr const char* whole_name[gpt_tensor_count] = {
        "wte.weight", "wpe.weight", nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
        nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, "ln_f.weight", "ln_f.bias"};

    ParameterRegistry r;
    for (int i = 0; i < gpt_tensor_count; ++i) {
        const auto t = static_cast<GPTTensor>(i);
        const Shape shape = gpt_tensor_shape(c, t);
        const auto u = static_cast<std::size_t>(i);
        if (kind_offsets != nullptr) (*kind_offsets)[u] = r.total();
        if (whole_name[u] != nullptr) {
            r.add(whole_name[u], shape, init(t), decay(t));
            continue;
        }
        for (int l = 0; l < c.n_layer; ++l) {
            r.add("h." + std::to_string(l) + "." + layer_suffix[u], shape.inner(), init(t), decay(t));
        }
    }
    return r;
}

// Offsets (in elements) of the grouped tensors in the contiguous buffer, as
// gpt_parameter_registry lays them out.
struct GPTLayout {
    std::array<std::int64_t, gpt_tensor_count> offsets{};
    std::int64_t elements = 0;

    explicit GPTLayout(const GPTConfig& c) { elements = gpt_parameter_registry(c, &offsets).total(); }
    std::int64_t offset(GPTTensor t) const { return offsets[static_cast<std::size_t>(t)]; }
    std::int64_t total() const { return elements; }
};

// Pointers to one copy of every GPT tensor (parameters, gradients, moments...)
// inside a contiguous buffer of P.
template <class P>
struct GPTTensors {
    P* base = nullptr;
    GPTLayout layout;
    GPTConfig config;

    GPTTensors(P* buffer, const GPTConfig& c) : base(buffer), layout(c), config(c) {}

    P* operator[](GPTTensor t) const { return base + layout.offset(t); }
    // Layer l's slice of a grouped per-layer tensor.
    P* layer(GPTTensor t, int l) const {
        const Shape s = gpt_tensor_shape(config, t);
        return (*this)[t] + static_cast<std::int64_t>(l) * (s.numel() / s[0]);
    }
};

// Every GPT tensor by name, in buffer order (gpt_parameter_registry).
inline std::vector<ParameterTensor> gpt_named_tensors(const GPTConfig& c) {
    const ParameterRegistry r = gpt_parameter_registry(c);
    return {r.tensors().begin(), r.tensors().end()};
}

// Looks a name up among GPT's tensors; an unknown name throws, naming it.
inline ParameterTensor find_named_tensor(const GPTConfig& c, std::string_view name) {
    const ParameterRegistry r = gpt_parameter_registry(c);
    return r.find(name);
}

// GPT's groups for AdamW: 2-D weights (embeddings and matmuls) decay; biases
// and LayerNorm parameters do not. Neighbouring tensors of the same kind merge.
inline std::vector<ParameterGroup> gpt_parameter_groups(const GPTConfig& c) {
    return gpt_parameter_registry(c).groups();
}

}  // namespace snug
