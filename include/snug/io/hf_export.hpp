// Hugging Face GPT-2 interop: a directory with `model.safetensors` (GPT2Model's
// tensor names) and `config.json` (a GPT2Config for GPT2LMHeadModel), which
// transformers' from_pretrained loads, and the import of such a directory back
// into snug's parameter layout.
//
// Differences from snug's buffer that the conversion handles:
// - wte is stored with the real vocabulary only, (V, C); the padded rows are
//   dropped on export and come back as zeros on import.
// - GPT-2's c_attn / c_proj / c_fc are Conv1D layers: their weights are stored
//   (in, out), the transpose of snug's nn.Linear-style (out, in).
// - The output head is tied to wte (tie_word_embeddings), so there is no
//   lm_head.weight.
// snug's GELU is the tanh approximation ("gelu_new") and its LayerNorm eps is
// 1e-5, as in GPT-2.
#pragma once

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "snug/core/dtype.hpp"
#include "snug/core/error.hpp"
#include "snug/core/half.hpp"
#include "snug/io/file.hpp"
#include "snug/io/json_fields.hpp"
#include "snug/io/safetensors.hpp"
#include "snug/nn/gpt_config.hpp"
#include "snug/nn/gpt_parameters.hpp"

namespace snug::io {

inline constexpr const char* hf_weights_file = "model.safetensors";
inline constexpr const char* hf_config_file = "config.json";

// A GPT-2 read from a Hugging Face directory: its shape, its parameters in fp32
// in snug's layout (padded wte rows zero), and the dtype they were stored in.
struct HFModel {
    GPTConfig config;
    std::vector<float> weights;  // GPTLayout(config).total() values
    DType dtype = DType::f32;
};

namespace detail {

// Whether a GPT-2 tensor name (without "transformer.") is a Conv1D weight,
// stored (in, out).
inline bool hf_is_conv1d_weight(std::string_view name) {
    for (std::string_view s : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"})
        if (name.size() > s.size() && name.substr(name.size() - s.size()) == s) return true;
    return false;
}

// The shape a named tensor has in the Hugging Face file.
inline std::vector<std::int64_t> hf_shape(const GPTConfig& c, const ParameterTensor& t) {
    if (t.name == "wte.weight") return {c.vocab_size, c.channels};
    if (hf_is_conv1d_weight(t.name)) return {t.shape[1], t.shape[0]};
    std::vector<std::int64_t> s;
    for (int i = 0; i < t.shape.rank(); ++i) s.push_back(t.shape[i]);
    return s;
}

inline std::string shape_str(const std::vector<std::int64_t>& s) {
    std::string out = "(";
    for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + ")";
}

}  // namespace detail

// The config.json of a GPT-2 with this shape (GPT2Config's field names).
// bos/eos are the last token id (GPT-2's <|endoftext|> is 50256 = V - 1).
inline nlohmann::json hf_gpt2_config(const GPTConfig& c, DType dtype = DType::f32) {
    nlohmann::json j;
    j["model_type"] = "gpt2";
    j["architectures"] = {"GPT2LMHeadModel"};
    j["vocab_size"] = c.vocab_size;
    j["n_positions"] = c.max_seq_len;
    j["n_ctx"] = c.max_seq_len;
    j["n_embd"] = c.channels;
    j["n_layer"] = c.n_layer;
    j["n_head"] = c.n_head;
    j["n_inner"] = nullptr;  // 4 n_embd
    j["activation_function"] = "gelu_new";
    j["layer_norm_epsilon"] = 1e-5;
    j["resid_pdrop"] = 0.0;
    j["embd_pdrop"] = 0.0;
    j["attn_pdrop"] = 0.0;
    j["initializer_range"] = 0.02;
    j["scale_attn_weights"] = true;
    j["scale_attn_by_inverse_layer_idx"] = false;
    j["reorder_and_upcast_attn"] = false;
    j["tie_word_embeddings"] = true;
    j["bos_token_id"] = c.vocab_size - 1;
    j["eos_token_id"] = c.vocab_size - 1;
    j["torch_dtype"] = dtype == DType::bf16 ? "bfloat16" : "float32";
    return j;
}

// Writes `dir`/model.safetensors and `dir`/config.json (creating `dir`), each
// atomically, from fp32 weights in GPTLayout(config) order, stored as
// DType::f32 or DType::bf16 (rounded to nearest even). The safetensors
// metadata holds {"format": "pt"} (what transformers expects) and snug's
// padded_vocab_size (for import; transformers ignores it).
inline void export_hf_gpt2(const std::filesystem::path& dir, const GPTConfig& config, std::span<const float> weights,
                           DType dtype = DType::f32) {
    config.validate();
    if (dtype != DType::f32 && dtype != DType::bf16)
        throw Error("Hugging Face export to " + dir.string() + ": dtype " + std::string(dtype_name(dtype)) +
                    " is not supported (f32 or bf16)");
    const std::int64_t count = GPTLayout(config).total();
    if (static_cast<std::int64_t>(weights.size()) != count)
        throw ShapeError("Hugging Face export to " + dir.string() + ": expected " + std::to_string(count) +
                         " GPT weights, got " + std::to_string(weights.size()));
    std::map<std::string, SafeTensor> tensors;
    for (const ParameterTensor& t : gpt_named_tensors(config)) {
        SafeTensor s;
        s.dtype = dtype;
        s.shape = detail::hf_shape(config, t);
        const std::int64_t n = s.numel();
        s.bytes.resize(static_cast<std::size_t>(n) * dtype_size(dtype));
        const float* src = weights.data() + t.offset;
        const bool transpose = detail::hf_is_conv1d_weight(t.name);
        const std::int64_t out_dim = t.shape[0];  // for a Conv1D weight: snug (out, in) -> file (in, out)
        for (std::int64_t i = 0; i < n; ++i) {
            // Element i of the file's row-major order.
            const float v = transpose ? src[(i % out_dim) * (n / out_dim) + i / out_dim] : src[i];
            if (dtype == DType::f32) {
                std::memcpy(s.bytes.data() + i * 4, &v, 4);
            } else {
                const std::uint16_t b = float_to_bfloat16_bits(v);
                std::memcpy(s.bytes.data() + i * 2, &b, 2);
            }
        }
        tensors.emplace(t.name, std::move(s));
    }
    make_directories(dir, "Hugging Face export");
    write_safetensors(dir / hf_weights_file, tensors,
                      {{"format", "pt"}, {"padded_vocab_size", std::to_string(config.padded_vocab_size)}});
    const std::string json = hf_gpt2_config(config, dtype).dump(2) + "\n";
    atomic_write(dir / hf_config_file, [&](FileWriter& w) { w.write(json.data(), json.size()); });
}

// Reads a Hugging Face GPT-2 directory (config.json + model.safetensors) into
// snug's layout. Tensor names may carry GPT2LMHeadModel's "transformer."
// prefix; the attention mask buffers (attn.bias, attn.masked_bias) are
// skipped, and lm_head.weight only when it equals wte (tied). The padded
// vocabulary is the file's padded_vocab_size metadata when present, else
// `padded_vocab` when positive, else GPTConfig::pad_vocab(V). FileError names
// the file and the problem: a missing or malformed file, a dimension that is
// not an integer in [1, 2^31 - 1], a config snug's GPT does not compute
// (activation, eps, n_inner, untied head), a shape with more parameters than
// the weights file holds (checked before anything is allocated), padding
// beyond max(V, 128) rows, a missing, unknown or misshapen tensor.
inline HFModel import_hf_gpt2(const std::filesystem::path& dir, int padded_vocab = 0) {
    const std::string config_name = (dir / hf_config_file).string();
    const std::vector<unsigned char> text = read_file(dir / hf_config_file);
    const nlohmann::json j = parse_json_object(config_name, text.begin(), text.end());
    const JsonFields F(config_name);
    auto fail = [&](const std::string& what) { throw FileError(config_name + ": " + what); };
    if (j.contains("model_type") && j["model_type"] != "gpt2")
        fail("model_type is " + json_excerpt(j["model_type"]) + ", expected \"gpt2\"");
    HFModel m;
    GPTConfig& c = m.config;  // dimensions: integers in [1, 2^31 - 1] (GPTConfig holds int)
    c.vocab_size = F.i32(j, "vocab_size", "", 1);
    c.max_seq_len = F.i32(j, "n_positions", "", 1);
    c.channels = F.i32(j, "n_embd", "", 1);
    c.n_layer = F.i32(j, "n_layer", "", 1);
    c.n_head = F.i32(j, "n_head", "", 1);
    const std::int64_t inner = 4 * std::int64_t{c.channels};
    if (j.contains("n_inner") && !j["n_inner"].is_null() && j["n_inner"] != inner)
        fail("n_inner is " + json_excerpt(j["n_inner"]) + "; snug's MLP has 4 n_embd = " +
             std::to_string(inner));
    if (j.contains("activation_function") && j["activation_function"] != "gelu_new" &&
        j["activation_function"] != "gelu_pytorch_tanh")
        fail("activation_function is " + json_excerpt(j["activation_function"]) +
             "; snug's GELU is the tanh approximation (\"gelu_new\")");
    if (j.contains("layer_norm_epsilon") &&
        (!j["layer_norm_epsilon"].is_number() || std::abs(j["layer_norm_epsilon"].get<double>() - 1e-5) > 1e-12))
        fail("layer_norm_epsilon is " + json_excerpt(j["layer_norm_epsilon"]) + "; snug's LayerNorm uses 1e-5");
    if (j.contains("tie_word_embeddings") && j["tie_word_embeddings"] == false)
        fail("tie_word_embeddings is false; snug's output head is tied to wte");
    if (j.contains("scale_attn_weights") && j["scale_attn_weights"] == false)
        fail("scale_attn_weights is false; snug scales attention by 1/sqrt(head size)");
    if (j.contains("scale_attn_by_inverse_layer_idx") && j["scale_attn_by_inverse_layer_idx"] == true)
        fail("scale_attn_by_inverse_layer_idx is true, which snug's attention does not do");

    const std::string weights_name = (dir / hf_weights_file).string();
    const SafetensorsFile file(dir / hf_weights_file);
    // The shape must be the weights file's before anything is sized by it: a
    // config.json of a few bytes could otherwise ask for any amount of memory.
    {
        double have = 0.0;
        for (const auto& [name, t] : file.tensors()) have += static_cast<double>(t.numel());
        const double C = c.channels;
        const double want = (static_cast<double>(c.vocab_size) + c.max_seq_len + 2.0) * C +
                            static_cast<double>(c.n_layer) * (12.0 * C * C + 13.0 * C);
        if (want > have) {
            char count[32];
            std::snprintf(count, sizeof count, want < 1e18 ? "%.0f" : "%.3g", want);
            fail("the GPT-2 shape it describes (n_layer " + std::to_string(c.n_layer) + ", n_embd " +
                 std::to_string(c.channels) + ", vocab_size " + std::to_string(c.vocab_size) + ", n_positions " +
                 std::to_string(c.max_seq_len) + ") has " + count + " parameters, but " + weights_name +
                 " holds only " + std::to_string(static_cast<std::uint64_t>(have)) +
                 " values: the config and the weights do not match");
        }
    }
    if (auto it = file.metadata().find("padded_vocab_size"); it != file.metadata().end()) {
        // The padded rows are not in the file but are allocated: at most
        // max(V, 128) of them (snug and llm.c pad to the next multiple of 128).
        const std::string& text_value = it->second;
        long long v = 0;
        const auto [end, ec] = std::from_chars(text_value.data(), text_value.data() + text_value.size(), v);
        const long long vocab = c.vocab_size, most = std::min<long long>(vocab + std::max(vocab, 128LL), INT_MAX);
        if (ec != std::errc() || end != text_value.data() + text_value.size() || v < vocab || v > most)
            throw FileError(weights_name + ": metadata padded_vocab_size '" + text_value.substr(0, 40) +
                            "' is not an integer in [vocab_size, vocab_size + max(vocab_size, 128)] = [" +
                            std::to_string(vocab) + ", " + std::to_string(most) + "]");
        padded_vocab = static_cast<int>(v);
    }
    c.padded_vocab_size = padded_vocab > 0 ? padded_vocab : GPTConfig::pad_vocab(c.vocab_size);
    try {
        c.validate();
    } catch (const ConfigError& e) {
        throw FileError(config_name + ": " + e.what());
    }

    // GPT2Model's name -> the name in the file (which may have the prefix).
    std::map<std::string, std::string> file_name;
    std::string lm_head;
    for (const auto& [full, t] : file.tensors()) {
        const std::string name = full.starts_with("transformer.") ? full.substr(12) : full;
        if (name == "lm_head.weight") {
            lm_head = full;
            continue;
        }
        if (name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias")) continue;
        if (!file_name.emplace(name, full).second)
            throw FileError(weights_name + ": tensor '" + name + "' appears twice (with and without 'transformer.')");
    }
    const std::vector<ParameterTensor> named = gpt_named_tensors(c);
    std::set<std::string> known;
    for (const ParameterTensor& t : named) known.insert(t.name);
    for (const auto& [name, full] : file_name)
        if (known.count(name) == 0)
            throw FileError(weights_name + ": unexpected tensor '" + full + "' for a GPT-2 of " +
                            std::to_string(c.n_layer) + " layers");

    m.weights.assign(static_cast<std::size_t>(GPTLayout(c).total()), 0.0f);
    for (std::size_t k = 0; k < named.size(); ++k) {
        const ParameterTensor& t = named[k];
        auto it = file_name.find(t.name);
        if (it == file_name.end()) throw FileError(weights_name + ": missing tensor '" + t.name + "'");
        const SafeTensor& s = file.at(it->second);
        const std::vector<std::int64_t> want = detail::hf_shape(c, t);
        if (s.shape != want)
            throw FileError(weights_name + ": tensor '" + it->second + "' has shape " + s.shape_str() +
                            ", expected " + detail::shape_str(want));
        if (k == 0) m.dtype = s.dtype;
        const std::vector<float> v = file.values<float>(it->second);
        float* dst = m.weights.data() + t.offset;
        if (detail::hf_is_conv1d_weight(t.name)) {
            const std::int64_t out_dim = t.shape[0], in_dim = t.shape[1];  // file (in, out) -> snug (out, in)
            for (std::int64_t i = 0; i < in_dim; ++i)
                for (std::int64_t o = 0; o < out_dim; ++o)
                    dst[o * in_dim + i] = v[static_cast<std::size_t>(i * out_dim + o)];
        } else {
            std::copy(v.begin(), v.end(), dst);
        }
    }
    if (!lm_head.empty()) {
        const SafeTensor& s = file.at(lm_head);
        const std::vector<std::int64_t> want = {c.vocab_size, c.channels};
        if (s.shape != want)
            throw FileError(weights_name + ": '" + lm_head + "' has shape " + s.shape_str() + ", expected " +
                            detail::shape_str(want) + " (tied to wte)");
        const std::vector<float> head = file.values<float>(lm_head);
        const float* wte = m.weights.data() + GPTLayout(c).offset(GPTTensor::wte);
        for (std::size_t i = 0; i < head.size(); ++i)
            if (head[i] != wte[i])
                throw FileError(weights_name + ": '" + lm_head + "' differs from wte.weight at element " +
                                std::to_string(i) + " (" + std::to_string(head[i]) + " vs " + std::to_string(wte[i]) +
                                "); snug's output head is tied to wte");
    }
    return m;
}

}  // namespace snug::io
