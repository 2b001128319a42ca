// Hugging Face Llama interop: a directory with `model.safetensors`
// (LlamaForCausalLM's tensor names) and `config.json` (a LlamaConfig), which
// transformers' from_pretrained loads, written from a snug::Llama's fp32
// weights; and such a directory (sharded or not) read back.
//
// snug keeps the Llama's tensors under the same names as transformers (the
// registry's "layers.3.self_attn...", transformers' "model.layers.3.self_attn..."),
// with two projections fused that transformers keeps apart, and padded
// vocabulary rows:
// - qkv_proj (C + 2 KV hs, C) is q_proj (C rows), k_proj and v_proj (KV hs
//   rows each, KV = num_key_value_heads), in that order of rows, each with
//   head h in rows [h hs, (h + 1) hs) — transformers' layout; RoPE pairs
//   (i, i + hs/2) in each head as transformers' rotate_half does, so no row
//   is permuted;
// - gate_up_proj (2H, C) is gate_proj then up_proj;
// - embed_tokens and lm_head have Vp >= V rows; the padded rows are dropped.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
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
#include "snug/io/json_fields.hpp"
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
    j["num_key_value_heads"] = b.key_value_heads();
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

// Where each of transformers' tensors lives in snug's weights: rows
// [first, first + rows) of the registry's tensor at `offset`, each row `cols`
// wide (0: a vector). The one mapping export and import both follow.
struct HFLlamaPiece {
    std::string name;  // transformers' ("model.layers.0.self_attn.q_proj.weight")
    std::int64_t offset, first, rows, cols;
    std::vector<std::int64_t> shape() const { return cols == 0 ? std::vector<std::int64_t>{rows} : std::vector<std::int64_t>{rows, cols}; }
};

inline std::vector<HFLlamaPiece> hf_llama_pieces(const LlamaConfig& config, const ParameterRegistry& registry) {
    const std::int64_t C = config.block.channels, H = config.block.hidden;
    const std::int64_t KVC = std::int64_t{config.block.key_value_heads()} * (C / config.block.heads);  // KV hs
    std::vector<HFLlamaPiece> pieces;
    for (const ParameterTensor& t : registry.tensors()) {
        const std::int64_t cols = t.shape.rank() == 2 ? t.shape[1] : 0;
        auto put = [&](const std::string& name, std::int64_t first, std::int64_t rows) {
            pieces.push_back({name, t.offset, first, rows, cols});
        };
        // The name without its last `n` characters, under transformers' "model.".
        auto stem = [&](std::size_t n) { return "model." + t.name.substr(0, t.name.size() - n); };
        if (t.name == "lm_head.weight") {
            put(t.name, 0, config.vocab_size);
        } else if (t.name == "embed_tokens.weight") {
            put("model." + t.name, 0, config.vocab_size);
        } else if (t.name.ends_with("self_attn.qkv_proj.weight")) {
            const std::string p = stem(std::string_view("qkv_proj.weight").size());
            put(p + "q_proj.weight", 0, C);
            put(p + "k_proj.weight", C, KVC);
            put(p + "v_proj.weight", C + KVC, KVC);
        } else if (t.name.ends_with("mlp.gate_up_proj.weight")) {
            const std::string p = stem(std::string_view("gate_up_proj.weight").size());
            put(p + "gate_proj.weight", 0, H);
            put(p + "up_proj.weight", H, H);
        } else {
            put("model." + t.name, 0, t.shape[0]);
        }
    }
    return pieces;
}

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
    std::map<std::string, SafeTensor> tensors;
    for (const HFLlamaPiece& p : hf_llama_pieces(config, model.registry()))
        tensors.emplace(p.name, detail::hf_rows(weights, p.offset, p.first, p.rows, p.cols, dtype));
    make_directories(dir, "Hugging Face export");
    write_safetensors(dir / hf_weights_file, tensors, {{"format", "pt"}});
    const std::string json = hf_llama_config(config, dtype).dump(2) + "\n";
    atomic_write(dir / hf_config_file, [&](FileWriter& w) { w.write(json.data(), json.size()); });
}


inline constexpr const char* hf_index_file = "model.safetensors.index.json";

// A Llama read from a Hugging Face directory: its shape, its fp32 weights in
// the registry's order (the padded vocabulary rows zero), and the dtype the
// file stored them in.
struct HFLlama {
    LlamaConfig config;
    std::vector<float> weights;
    DType dtype = DType::f32;
};

namespace detail {

// The config.json of a Llama as snug's LlamaConfig. FileError names the key
// and its value for anything snug's Llama does not compute.
inline LlamaConfig hf_llama_config_of(const nlohmann::json& j, const std::string& file) {
    const JsonFields F(file);
    auto fail = [&](const std::string& what) { throw FileError(file + ": " + what); };
    // A key present with a value other than snug's.
    auto only = [&](const char* key, const nlohmann::json& accepted, const std::string& why) {
        if (j.contains(key) && j[key] != accepted)
            fail(std::string(key) + " is " + json_excerpt(j[key]) + "; " + why);
    };
    only("model_type", "llama", "this reads a Llama (\"llama\")");
    only("hidden_act", "silu", "snug's Llama MLP is SwiGLU with SiLU (\"silu\")");
    only("attention_bias", false, "snug's Llama projections have no biases");
    only("mlp_bias", false, "snug's Llama projections have no biases");
    only("rope_scaling", nullptr, "snug's RoPE keeps one frequency per pair (theta^(-2i/hs)), unscaled");
    only("sliding_window", nullptr, "snug's attention reaches every earlier position");
    const int heads = F.i32(j, "num_attention_heads", "", 1);
    // transformers' default (absent or null): as many key/value heads as heads.
    const bool grouped = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null();
    const int kv_heads = grouped ? F.i32(j, "num_key_value_heads", "", 1) : heads;
    if (heads % kv_heads != 0)
        fail("num_key_value_heads is " + std::to_string(kv_heads) + ", which does not divide num_attention_heads " +
             std::to_string(heads) + " (each key/value head serves an equal group of query heads)");
    const int C = F.i32(j, "hidden_size", "", 1);
    if (j.contains("head_dim") && !j["head_dim"].is_null() && j["head_dim"] != C / heads)
        fail("head_dim is " + json_excerpt(j["head_dim"]) + "; snug's heads are hidden_size / num_attention_heads = " +
             std::to_string(C / heads) + " wide");
    LlamaConfig c = make_llama_config(F.i32(j, "vocab_size", "", 1), F.i32(j, "max_position_embeddings", "", 1),
                                      F.i32(j, "num_hidden_layers", "", 1), C, heads,
                                      F.i32(j, "intermediate_size", "", 1), kv_heads);
    auto positive = [&](const char* key, double fallback) {
        if (!j.contains(key)) return fallback;
        const double v = F.number(j, key);
        if (!(v > 0.0) || !std::isfinite(v)) fail(std::string(key) + " is " + json_excerpt(j[key]) + ", not above 0");
        return v;
    };
    c.block.norm_eps = positive("rms_norm_eps", 1e-6);  // transformers' defaults
    c.block.rope_theta = positive("rope_theta", 10000.0);
    return c;
}

}  // namespace detail

// Reads a Hugging Face Llama directory: config.json (LlamaConfig's fields)
// and model.safetensors, or the shards model.safetensors.index.json names,
// in fp32, bf16 or fp16, into snug's fused layout (hf_llama_pieces). A tied
// head (tie_word_embeddings) starts as a copy of embed_tokens; snug's Llama
// then trains the two apart. Rotary inv_freq buffers are skipped. FileError
// names the file and the problem: a missing or malformed file, a key whose
// value snug's Llama does not compute (named with its value), a shape with
// more parameters than the files hold (checked before anything of its size
// is allocated), a missing, unknown, repeated or misshapen tensor, a shard
// outside the directory.
inline HFLlama import_hf_llama(const std::filesystem::path& dir) {
    const std::string config_name = (dir / hf_config_file).string();
    const std::vector<unsigned char> text = read_file(dir / hf_config_file);
    const nlohmann::json j = parse_json_object(config_name, text.begin(), text.end());
    HFLlama m;
    m.config = detail::hf_llama_config_of(j, config_name);
    const bool tied = j.contains("tie_word_embeddings") && j["tie_word_embeddings"] == true;
    MemoryTracker tracker;
    std::optional<Llama<float, Meter>> model;  // its registry (nothing allocated); it checks the shape
    try {
        model.emplace(m.config, tracker);
    } catch (const Error& e) {  // a shape the layers refuse (ConfigError, ShapeError)
        throw FileError(config_name + ": " + e.what());
    }

    // The weights files: one, or the shards the index names (each once).
    std::vector<SafetensorsFile> files;
    if (std::filesystem::exists(dir / hf_index_file)) {
        const std::string index_name = (dir / hf_index_file).string();
        const std::vector<unsigned char> index_text = read_file(dir / hf_index_file);
        const nlohmann::json index = parse_json_object(index_name, index_text.begin(), index_text.end());
        const JsonFields F(index_name);
        std::set<std::string> shards;
        for (const auto& [tensor, shard] : F.object(index, "weight_map").items()) {
            const std::string name = F.as_string(shard, "weight_map." + tensor);
            if (name.empty() || name.find('/') != std::string::npos || name.find('\\') != std::string::npos ||
                name == "." || name == "..")
                throw FileError(index_name + ": weight_map." + tensor + " is " + json_excerpt(shard) +
                                ", not a file name in " + dir.string());
            shards.insert(name);
        }
        for (const std::string& name : shards) files.emplace_back(dir / name);
    } else {
        files.emplace_back(dir / hf_weights_file);
    }
    std::map<std::string, std::pair<const SafetensorsFile*, const SafeTensor*>> found;
    double have = 0.0;
    for (const SafetensorsFile& f : files)
        for (const auto& [name, t] : f.tensors()) {
            if (name.ends_with(".rotary_emb.inv_freq")) continue;
            if (!found.emplace(name, std::make_pair(&f, &t)).second)
                throw FileError(dir.string() + ": tensor '" + name + "' is in more than one weights file");
            have += static_cast<double>(t.numel());
        }
    // The shape must be the files' before anything is sized by it: a
    // config.json of a few bytes could otherwise ask for any amount of memory.
    const std::vector<HFLlamaPiece> pieces = hf_llama_pieces(m.config, model->registry());
    double want = 0.0;
    for (const HFLlamaPiece& p : pieces)
        if (!(tied && p.name == "lm_head.weight")) want += static_cast<double>(p.rows) * std::max<std::int64_t>(p.cols, 1);
    if (want > have)
        throw FileError(config_name + ": the Llama it describes has " + std::to_string(static_cast<std::uint64_t>(want)) +
                        " parameters in its files' layout, but the weights files hold only " +
                        std::to_string(static_cast<std::uint64_t>(have)) + " values: the config and the weights do "
                        "not match");

    m.weights.assign(static_cast<std::size_t>(model->num_parameters()), 0.0f);
    std::set<std::string> used;
    for (std::size_t k = 0; k < pieces.size(); ++k) {
        const HFLlamaPiece& p = pieces[k];
        const bool from_embedding = tied && p.name == "lm_head.weight" && found.count(p.name) == 0;
        const std::string source = from_embedding ? std::string("model.embed_tokens.weight") : p.name;
        const auto it = found.find(source);
        if (it == found.end()) throw FileError(dir.string() + ": missing tensor '" + p.name + "'");
        const auto& [file, t] = it->second;
        if (t->shape != p.shape())
            throw FileError(file->path() + ": tensor '" + source + "' has shape " + t->shape_str() + ", expected " +
                            detail::shape_str(p.shape()));
        if (k == 0) m.dtype = t->dtype;
        const std::vector<float> v = file->values<float>(source);
        std::copy(v.begin(), v.end(), m.weights.begin() + p.offset + p.first * std::max<std::int64_t>(p.cols, 1));
        used.insert(source);
    }
    for (const auto& [name, where] : found)
        if (used.count(name) == 0)
            throw FileError(where.first->path() + ": unexpected tensor '" + name + "' for a Llama of " +
                            std::to_string(m.config.n_layer) + " layers");
    return m;
}

}  // namespace snug::io
