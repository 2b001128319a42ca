// Hugging Face Llama export (io/hf_llama.hpp): the file holds exactly
// LlamaForCausalLM's names and shapes; q/k/v and gate/up are the fused
// projections' row blocks, in transformers' order; the padded vocabulary rows
// are dropped; bf16 is the weights rounded; config.json has LlamaConfig's
// fields; a wrong weight count writes nothing.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "snug/io/file.hpp"
#include "snug/io/hf_llama.hpp"
#include "snug/io/safetensors.hpp"
#include "snug/nn/llama.hpp"
#include "support/host_support.hpp"
#include "support/temp_dir.hpp"

namespace {

using Catch::Matchers::Contains;

// 2 layers, C = 8, 2 heads of 4, MLP 12, V = 10 (padded to 64), 8 positions.
snug::LlamaConfig tiny_llama() {
    snug::LlamaConfig c = snug::make_llama_config(10, 8, 2, 8, 2, 12);
    c.block.norm_eps = 1e-6;
    c.block.rope_theta = 500000.0;
    return c;
}

std::vector<float> weights_of(const snug::LlamaConfig& c, std::uint32_t seed) {
    snug::MemoryTracker tracker;
    const snug::Llama<float, snug::Meter> m(c, tracker);
    return snug::test::random_values<float>(static_cast<std::size_t>(m.num_parameters()), seed, -1.0, 1.0);
}

// Where snug keeps a tensor: its offset in the weights.
std::int64_t offset_of(const snug::LlamaConfig& c, const std::string& name) {
    snug::MemoryTracker tracker;
    const snug::Llama<float, snug::Meter> m(c, tracker);
    for (const snug::ParameterTensor& t : m.registry().tensors())
        if (t.name == name) return t.offset;
    FAIL("no tensor " << name);
    return -1;
}

}  // namespace

TEST_CASE("hf llama export: LlamaForCausalLM's names and shapes, the fused projections split in its order") {
    snug::test::TempDir dir;
    const snug::LlamaConfig c = tiny_llama();
    const std::vector<float> w = weights_of(c, 11);
    snug::io::export_hf_llama(dir.path, c, w);
    const snug::io::SafetensorsFile f(dir.path / "model.safetensors");

    using Shape = std::vector<std::int64_t>;
    std::map<std::string, Shape> expected = {{"model.embed_tokens.weight", {10, 8}},
                                             {"lm_head.weight", {10, 8}},
                                             {"model.norm.weight", {8}}};
    for (int l = 0; l < 2; ++l) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        expected[p + "input_layernorm.weight"] = {8};
        expected[p + "post_attention_layernorm.weight"] = {8};
        for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"})
            expected[p + "self_attn." + proj + ".weight"] = {8, 8};
        expected[p + "mlp.gate_proj.weight"] = {12, 8};
        expected[p + "mlp.up_proj.weight"] = {12, 8};
        expected[p + "mlp.down_proj.weight"] = {8, 12};
    }
    std::map<std::string, Shape> found;
    for (const auto& [name, t] : f.tensors()) {
        found[name] = t.shape;
        CHECK(t.dtype == snug::DType::f32);
    }
    CHECK(found == expected);
    CHECK(f.meta("format") == "pt");

    // Element (r, k) of an exported (rows, cols) tensor is row `first + r` of
    // snug's tensor `name`.
    auto same_rows = [&](const std::string& hf, const std::string& name, std::int64_t first, std::int64_t cols) {
        const std::vector<float> v = f.values<float>(hf);
        const std::int64_t base = offset_of(c, name) + first * cols;
        for (std::size_t i = 0; i < v.size(); ++i)
            if (v[i] != w[static_cast<std::size_t>(base) + i]) {
                FAIL_CHECK(hf << " element " << i << " is " << v[i] << ", snug's " << name << " has "
                              << w[static_cast<std::size_t>(base) + i]);
                return;
            }
        SUCCEED(hf);
    };
    same_rows("model.layers.1.self_attn.q_proj.weight", "layers.1.self_attn.qkv_proj.weight", 0, 8);
    same_rows("model.layers.1.self_attn.k_proj.weight", "layers.1.self_attn.qkv_proj.weight", 8, 8);
    same_rows("model.layers.1.self_attn.v_proj.weight", "layers.1.self_attn.qkv_proj.weight", 16, 8);
    same_rows("model.layers.0.self_attn.o_proj.weight", "layers.0.self_attn.o_proj.weight", 0, 8);
    same_rows("model.layers.0.mlp.gate_proj.weight", "layers.0.mlp.gate_up_proj.weight", 0, 8);
    same_rows("model.layers.0.mlp.up_proj.weight", "layers.0.mlp.gate_up_proj.weight", 12, 8);
    same_rows("model.layers.0.mlp.down_proj.weight", "layers.0.mlp.down_proj.weight", 0, 12);
    same_rows("model.layers.1.post_attention_layernorm.weight", "layers.1.post_attention_layernorm.weight", 0, 1);
    same_rows("model.norm.weight", "norm.weight", 0, 1);
    same_rows("model.embed_tokens.weight", "embed_tokens.weight", 0, 8);  // the first V of Vp rows
    same_rows("lm_head.weight", "lm_head.weight", 0, 8);
}

TEST_CASE("hf llama export: config.json is transformers' LlamaConfig of the model") {
    snug::test::TempDir dir;
    const snug::LlamaConfig c = tiny_llama();
    snug::io::export_hf_llama(dir.path, c, weights_of(c, 12));
    const std::vector<unsigned char> bytes = snug::io::read_file(dir.path / "config.json");
    const nlohmann::json j = nlohmann::json::parse(bytes.begin(), bytes.end());
    CHECK(j.at("model_type") == "llama");
    CHECK(j.at("architectures") == nlohmann::json::array({"LlamaForCausalLM"}));
    CHECK(j.at("vocab_size") == 10);
    CHECK(j.at("hidden_size") == 8);
    CHECK(j.at("intermediate_size") == 12);
    CHECK(j.at("num_hidden_layers") == 2);
    CHECK(j.at("num_attention_heads") == 2);
    CHECK(j.at("num_key_value_heads") == 2);
    CHECK(j.at("head_dim") == 4);
    CHECK(j.at("max_position_embeddings") == 8);
    CHECK(j.at("hidden_act") == "silu");
    CHECK(j.at("rms_norm_eps").get<double>() == 1e-6);
    CHECK(j.at("rope_theta").get<double>() == 500000.0);
    CHECK(j.at("tie_word_embeddings") == false);
    CHECK(j.at("attention_bias") == false);
    CHECK(j.at("mlp_bias") == false);
    CHECK(j.at("rope_scaling").is_null());
    CHECK(j.at("torch_dtype") == "float32");
}

TEST_CASE("hf llama export: bf16 holds each weight rounded to bfloat16") {
    snug::test::TempDir dir;
    const snug::LlamaConfig c = tiny_llama();
    const std::vector<float> w = weights_of(c, 13);
    snug::io::export_hf_llama(dir.path, c, w, snug::DType::bf16);
    const snug::io::SafetensorsFile f(dir.path / "model.safetensors");
    CHECK(f.at("model.layers.0.self_attn.k_proj.weight").dtype == snug::DType::bf16);
    const std::vector<float> k = f.values<float>("model.layers.0.self_attn.k_proj.weight");
    const std::int64_t base = offset_of(c, "layers.0.self_attn.qkv_proj.weight") + 8 * 8;
    for (std::size_t i = 0; i < k.size(); ++i) {
        const double x = w[static_cast<std::size_t>(base) + i];
        INFO("element " << i);
        CHECK(std::abs(k[i] - x) <= std::abs(x) * 0x1p-8);  // half an ulp of bf16's 8-bit significand
    }
}

TEST_CASE("hf llama export: a weight count that is not the model's is refused, nothing written") {
    snug::test::TempDir dir;
    const snug::LlamaConfig c = tiny_llama();
    std::vector<float> w = weights_of(c, 14);
    w.pop_back();
    CHECK_THROWS_WITH(snug::io::export_hf_llama(dir.path / "out", c, w),
                      Contains("expected " + std::to_string(w.size() + 1) + " Llama weights, got " +
                               std::to_string(w.size())));
    CHECK_FALSE(std::filesystem::exists(dir.path / "out"));
}
