// Where each GPT parameter lives inside one contiguous buffer. The order is
// llm.c's (tensors grouped by kind across layers), so an llm.c model file is
// one copy; named entries give every per-layer tensor its GPT-2 name.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "snug/core/error.hpp"
#include "snug/core/tensor.hpp"
#include "snug/nn/gpt_config.hpp"
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

// Offsets (in elements) of the grouped tensors in the contiguous buffer.
struct GPTLayout {
    std::array<std::int64_t, gpt_tensor_count + 1> offsets{};  // offsets[16] = total elements

    explicit GPTLayout(const GPTConfig& c) {
        for (int i = 0; i < gpt_tensor_count; ++i)
            offsets[static_cast<std::size_t>(i + 1)] =
                offsets[static_cast<std::size_t>(i)] + gpt_tensor_shape(c, static_cast<GPTTensor>(i)).numel();
    }
    std::int64_t offset(GPTTensor t) const { return offsets[static_cast<std::size_t>(t)]; }
    std::int64_t total() const { return offsets[gpt_tensor_count]; }
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

// One named tensor of the GPT-2 naming scheme (Hugging Face GPT2Model names).
// Linear weights keep PyTorch nn.Linear's (out, in) layout here; Hugging
// Face's Conv1D stores them transposed, which the exporter handles.
struct NamedTensor {
    std::string name;     // "wte.weight", "h.3.attn.c_attn.weight", ...
    std::int64_t offset;  // in elements, in the contiguous buffer
    Shape shape;
};

inline std::vector<NamedTensor> gpt_named_tensors(const GPTConfig& c) {
    const GPTLayout layout(c);
    std::vector<NamedTensor> out;
    auto whole = [&](GPTTensor t, std::string name) {
        out.push_back({std::move(name), layout.offset(t), gpt_tensor_shape(c, t)});
    };
    whole(GPTTensor::wte, "wte.weight");
    whole(GPTTensor::wpe, "wpe.weight");
    struct PerLayer {
        GPTTensor tensor;
        const char* suffix;
    };
    const PerLayer per_layer[] = {
        {GPTTensor::ln1w, "ln_1.weight"},        {GPTTensor::ln1b, "ln_1.bias"},
        {GPTTensor::qkvw, "attn.c_attn.weight"}, {GPTTensor::qkvb, "attn.c_attn.bias"},
        {GPTTensor::attprojw, "attn.c_proj.weight"}, {GPTTensor::attprojb, "attn.c_proj.bias"},
        {GPTTensor::ln2w, "ln_2.weight"},        {GPTTensor::ln2b, "ln_2.bias"},
        {GPTTensor::fcw, "mlp.c_fc.weight"},     {GPTTensor::fcb, "mlp.c_fc.bias"},
        {GPTTensor::fcprojw, "mlp.c_proj.weight"}, {GPTTensor::fcprojb, "mlp.c_proj.bias"},
    };
    for (int l = 0; l < c.n_layer; ++l) {
        for (const PerLayer& p : per_layer) {
            const Shape s = gpt_tensor_shape(c, p.tensor);
            const Shape one = s.inner();
            out.push_back({"h." + std::to_string(l) + "." + p.suffix, layout.offset(p.tensor) + l * one.numel(), one});
        }
    }
    whole(GPTTensor::lnfw, "ln_f.weight");
    whole(GPTTensor::lnfb, "ln_f.bias");
    return out;
}

// Looks a name up in gpt_named_tensors; an unknown name throws, naming it.
inline NamedTensor find_named_tensor(const GPTConfig& c, std::string_view name) {
    for (NamedTensor& t : gpt_named_tensors(c))
        if (t.name == name) return t;
    throw Error("GPT has no tensor named '" + std::string(name) + "'");
}

// Whether AdamW's weight decay applies: 2-D weights (matmuls and embeddings)
// decay; biases and LayerNorm parameters do not.
inline bool gpt_tensor_decays(GPTTensor t) {
    switch (t) {
        case GPTTensor::wte: case GPTTensor::wpe: case GPTTensor::qkvw: case GPTTensor::attprojw:
        case GPTTensor::fcw: case GPTTensor::fcprojw: return true;
        default: return false;
    }
}

// GPT's groups: 2-D weights (embeddings and matmuls) decay; biases and
// LayerNorm parameters do not. Neighbouring tensors of the same kind merge.
inline std::vector<ParameterGroup> gpt_parameter_groups(const GPTConfig& c) {
    const GPTLayout layout(c);
    std::vector<ParameterGroup> groups;
    for (int i = 0; i < gpt_tensor_count; ++i) {
        const auto t = static_cast<GPTTensor>(i);
        const std::int64_t offset = layout.offset(t), count = gpt_tensor_shape(c, t).numel();
        const bool decay = gpt_tensor_decays(t);
        if (!groups.empty() && groups.back().decay == decay && groups.back().offset + groups.back().count == offset)
            groups.back().count += count;
        else
            groups.push_back({offset, count, decay});
    }
    return groups;
}

}  // namespace snug
