// Hugging Face Llama out: a directory with `model.safetensors` (LlamaForCausalLM's
// tensor names) and `config.json` (a LlamaConfig), which transformers'
// from_pretrained loads, written from a snug::Llama's fp32 weights.
//
// snug keeps the Llama's tensors under the same names as transformers (the
// registry's "layers.3.self_attn...", transformers' "model.layers.3.self_attn..."),
// with two projections fused that transformers keeps apart, and padded
// vocabulary rows:
// - qkv_proj (3C, C) is q_proj, k_proj and v_proj, in that order of rows, each
//   with head h in rows [h hs, (h + 1) hs) — transformers' layout; RoPE pairs
//   (i, i + hs/2) in each head as transformers' rotate_half does, so no row
//   is permuted;
// - gate_up_proj (2H, C) is gate_proj then up_proj;
// - embed_tokens and lm_head have Vp >= V rows; the padded rows are dropped.
// Every key/value head is a query head's (num_key_value_heads = heads).
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "snug/core/dtype.hpp"
#include "snug/core/error.hpp"
#include "snug/core/half.hpp"
#include "snug/core/memory_tracker.hpp"
#include "snug/io/file.hpp"
#include "snug/io/hf_export.hpp"
#include "snug/io/safetensors.hpp"
#include "snug/meter/device.hpp"
#include "snug/nn/llama.hpp"

namespace snug::io {

// The config.json of a Llama with this shape (transformers' LlamaConfig).
inline nlohmann::json hf_llama_config(const LlamaConfig& c, DType dtype = DType::f32) {
    const LlamaBlockShape& b = c.block;
    nlohmann::json j;
    j["model_type"] = "llama";
    j["architectures"] = {"LlamaForCausalLM"};
    j["vocab_size"] = c.vocab_size;
    j["max_position_embeddings"] = c.max_seq_len;
    j["hidden_size"] = b.channels;
    j["intermediate_size"] = b.hidden;
    j["num_hidden_layers"] = c.n_layer;
    j["num_attention_heads"] = b.heads;
    j["num_key_value_heads"] = b.heads;
    j["head_dim"] = b.channels / b.heads;
    j["hidden_act"] = "silu";
    j["rms_norm_eps"] = b.norm_eps;
    j["rope_theta"] = b.rope_theta;
    j["rope_scaling"] = nullptr;
    j["attention_bias"] = false;
    j["attention_dropout"] = 0.0;
    j["mlp_bias"] = false;
    j["tie_word_embeddings"] = false;
    j["initializer_range"] = 0.02;
    j["torch_dtype"] = dtype == DType::bf16 ? "bfloat16" : "float32";
    return j;
}

namespace detail {

// The rows [first, first + rows) of a row-major (., cols) tensor of snug's
// fp32 buffer at `offset`, as a safetensors tensor of `dtype`. (Not inlined:
// GCC 12, inlining it into the export's loop, warns of a memset out of bounds
// that cannot happen, -Warray-bounds.)
[[gnu::noinline]] inline SafeTensor hf_rows(std::span<const float> weights, std::int64_t offset, std::int64_t first,
                          std::int64_t rows, std::int64_t cols, DType dtype) {
    SafeTensor s;
    s.dtype = dtype;
    s.shape = cols == 0 ? std::vector<std::int64_t>{rows} : std::vector<std::int64_t>{rows, cols};
    const std::int64_t n = rows * (cols == 0 ? 1 : cols);
    s.bytes.resize(static_cast<std::size_t>(n) * dtype_size(dtype));
    const float* src = weights.data() + offset + first * (cols == 0 ? 1 : cols);
    for (std::int64_t i = 0; i < n; ++i) {
        if (dtype == DType::f32) {
            std::memcpy(s.bytes.data() + i * 4, src + i, 4);
        } else {
            const std::uint16_t v = float_to_bfloat16_bits(src[i]);
            std::memcpy(s.bytes.data() + i * 2, &v, 2);
        }
    }
    return s;
}

}  // namespace detail

// Writes `dir`/model.safetensors and `dir`/config.json (creating `dir`), each
// atomically, from a Llama's fp32 weights in its registry's order, stored as
// DType::f32 or DType::bf16 (rounded to nearest even). Throws ShapeError for
// a weight count that is not the model's, before anything is written.
inline void export_hf_llama(const std::filesystem::path& dir, const LlamaConfig& config,
                            std::span<const float> weights, DType dtype = DType::f32) {
    if (dtype != DType::f32 && dtype != DType::bf16)
        throw Error("Hugging Face export to " + dir.string() + ": dtype " + std::string(dtype_name(dtype)) +
                    " is not supported (f32 or bf16)");
    MemoryTracker tracker;
    const Llama<float, Meter> model(config, tracker);  // the registry: names, shapes, offsets (nothing allocated)
    if (static_cast<std::int64_t>(weights.size()) != model.num_parameters())
        throw ShapeError("Hugging Face export to " + dir.string() + ": expected " +
                         std::to_string(model.num_parameters()) + " Llama weights, got " +
                         std::to_string(weights.size()));
    const std::int64_t C = config.block.channels, H = config.block.hidden;
    std::map<std::string, SafeTensor> tensors;
    auto put = [&](const std::string& name, const ParameterTensor& t, std::int64_t first, std::int64_t rows) {
        const std::int64_t cols = t.shape.rank() == 2 ? t.shape[1] : 0;
        tensors.emplace(name, detail::hf_rows(weights, t.offset, first, rows, cols, dtype));
    };
    for (const ParameterTensor& t : model.registry().tensors()) {
        const auto ends_with = [&](const std::string& s) {
            return t.name.size() > s.size() && t.name.compare(t.name.size() - s.size(), s.size(), s) == 0;
        };
        if (t.name == "lm_head.weight") {
            put(t.name, t, 0, config.vocab_size);
        } else if (t.name == "embed_tokens.weight") {
            put("model." + t.name, t, 0, config.vocab_size);
        } else if (ends_with("self_attn.qkv_proj.weight")) {
            const std::string stem = "model." + t.name.substr(0, t.name.size() - std::string("qkv_proj.weight").size());
            put(stem + "q_proj.weight", t, 0, C);
            put(stem + "k_proj.weight", t, C, C);
            put(stem + "v_proj.weight", t, 2 * C, C);
        } else if (ends_with("mlp.gate_up_proj.weight")) {
            const std::string stem = "model." + t.name.substr(0, t.name.size() - std::string("gate_up_proj.weight").size());
            put(stem + "gate_proj.weight", t, 0, H);
            put(stem + "up_proj.weight", t, H, H);
        } else {
            put("model." + t.name, t, 0, t.shape[0]);
        }
    }
    make_directories(dir, "Hugging Face export");
    write_safetensors(dir / hf_weights_file, tensors, {{"format", "pt"}});
    const std::string json = hf_llama_config(config, dtype).dump(2) + "\n";
    atomic_write(dir / hf_config_file, [&](FileWriter& w) { w.write(json.data(), json.size()); });
}

}  // namespace snug::io
