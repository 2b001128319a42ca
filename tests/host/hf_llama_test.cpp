// Hugging Face Llama export (io/hf_llama.hpp): the file holds exactly
// LlamaForCausalLM's names and shapes; q/k/v and gate/up are the fused
// projections' row blocks, in transformers' order; the padded vocabulary rows
// are dropped; bf16 is the weights rounded; config.json has LlamaConfig's
// fields; a wrong weight count writes nothing.
#include <catch2/catch.hpp>

#include <algorithm>
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

// ---- import ------------------------------------------------------------------

namespace {

nlohmann::json read_json(const std::filesystem::path& p) {
    const std::vector<unsigned char> bytes = snug::io::read_file(p);
    return nlohmann::json::parse(bytes.begin(), bytes.end());
}

void write_json(const std::filesystem::path& p, const nlohmann::json& j) {
    const std::string text = j.dump(2);
    snug::io::atomic_write(p, [&](snug::io::FileWriter& w) { w.write(text.data(), text.size()); });
}

std::map<std::string, snug::io::SafeTensor> tensors_of(const std::filesystem::path& p) {
    return snug::io::SafetensorsFile(p).tensors();
}

// The weights as an export keeps them: the padded vocabulary rows zero.
std::vector<float> unpadded(const snug::LlamaConfig& c, std::vector<float> w) {
    for (const char* name : {"embed_tokens.weight", "lm_head.weight"}) {
        const std::int64_t at = offset_of(c, name);
        const std::int64_t C = c.block.channels;
        for (std::int64_t i = std::int64_t{c.vocab_size} * C; i < std::int64_t{c.padded_vocab_size} * C; ++i)
            w[static_cast<std::size_t>(at + i)] = 0.0f;
    }
    return w;
}

}  // namespace

TEST_CASE("hf llama import: an export reads back to the same config and weights, bf16 and sharded too") {
    snug::test::TempDir dir;
    const snug::LlamaConfig c = tiny_llama();
    const std::vector<float> w = weights_of(c, 21);
    snug::io::export_hf_llama(dir.path, c, w);
    const snug::io::HFLlama m = snug::io::import_hf_llama(dir.path);
    CHECK(m.config.vocab_size == 10);
    CHECK(m.config.padded_vocab_size == 64);
    CHECK(m.config.max_seq_len == 8);
    CHECK(m.config.n_layer == 2);
    CHECK(m.config.block.channels == 8);
    CHECK(m.config.block.heads == 2);
    CHECK(m.config.block.hidden == 12);
    CHECK(m.config.block.norm_eps == 1e-6);
    CHECK(m.config.block.rope_theta == 500000.0);
    CHECK(m.dtype == snug::DType::f32);
    CHECK(m.weights == unpadded(c, w));

    SECTION("bf16: each weight within bf16's rounding") {
        snug::io::export_hf_llama(dir.path, c, w, snug::DType::bf16);
        const snug::io::HFLlama b = snug::io::import_hf_llama(dir.path);
        CHECK(b.dtype == snug::DType::bf16);
        const std::vector<float> want = unpadded(c, w);
        REQUIRE(b.weights.size() == want.size());
        for (std::size_t i = 0; i < want.size(); ++i)
            if (std::abs(b.weights[i] - want[i]) > std::abs(want[i]) * 0x1p-8) FAIL("weight " << i);
    }
    SECTION("sharded: model.safetensors.index.json names the files") {
        auto all = tensors_of(dir.path / "model.safetensors");
        std::filesystem::remove(dir.path / "model.safetensors");
        std::map<std::string, snug::io::SafeTensor> first, second;
        nlohmann::json map = nlohmann::json::object();
        for (auto& [name, t] : all) {
            const bool one = name.find("layers.1.") == std::string::npos;
            (one ? first : second).emplace(name, t);
            map[name] = one ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
        }
        snug::io::write_safetensors(dir.path / "model-00001-of-00002.safetensors", first);
        snug::io::write_safetensors(dir.path / "model-00002-of-00002.safetensors", second);
        write_json(dir.path / "model.safetensors.index.json", {{"metadata", {{"total_size", 0}}}, {"weight_map", map}});
        CHECK(snug::io::import_hf_llama(dir.path).weights == unpadded(c, w));

        map["lm_head.weight"] = "../elsewhere.safetensors";
        write_json(dir.path / "model.safetensors.index.json", {{"weight_map", map}});
        CHECK_THROWS_WITH(snug::io::import_hf_llama(dir.path),
                          Contains("weight_map.lm_head.weight is \"../elsewhere.safetensors\", not a file name"));
    }
    SECTION("a tied head starts as the embedding; rotary buffers are skipped") {
        auto all = tensors_of(dir.path / "model.safetensors");
        all.erase("lm_head.weight");
        all.emplace("model.layers.0.self_attn.rotary_emb.inv_freq",
                    snug::io::SafeTensor{snug::DType::f32, {2}, std::vector<unsigned char>(8, 0)});
        snug::io::write_safetensors(dir.path / "model.safetensors", all);
        nlohmann::json j = read_json(dir.path / "config.json");
        j["tie_word_embeddings"] = true;
        write_json(dir.path / "config.json", j);
        const snug::io::HFLlama t = snug::io::import_hf_llama(dir.path);
        const std::int64_t head = offset_of(c, "lm_head.weight"), embed = offset_of(c, "embed_tokens.weight");
        for (std::int64_t i = 0; i < 10 * 8; ++i)
            REQUIRE(t.weights[static_cast<std::size_t>(head + i)] == w[static_cast<std::size_t>(embed + i)]);
    }
}

TEST_CASE("hf llama: grouped-query attention's k_proj and v_proj hold the key/value heads, both ways") {
    snug::test::TempDir dir;
    // C = 16: 4 query heads of 4 channels, 2 key/value heads (k_proj, v_proj 8 rows each).
    const snug::LlamaConfig c = snug::make_llama_config(10, 8, 2, 16, 4, 12, 2);
    const std::vector<float> w = weights_of(c, 23);
    snug::io::export_hf_llama(dir.path, c, w);
    const nlohmann::json j = read_json(dir.path / "config.json");
    CHECK(j.at("num_attention_heads") == 4);
    CHECK(j.at("num_key_value_heads") == 2);
    CHECK(j.at("head_dim") == 4);
    const snug::io::SafetensorsFile f(dir.path / "model.safetensors");
    using Shape = std::vector<std::int64_t>;
    CHECK(f.tensors().at("model.layers.1.self_attn.q_proj.weight").shape == Shape{16, 16});
    CHECK(f.tensors().at("model.layers.1.self_attn.k_proj.weight").shape == Shape{8, 16});
    CHECK(f.tensors().at("model.layers.1.self_attn.v_proj.weight").shape == Shape{8, 16});
    // v_proj is rows 24..31 of snug's fused qkv (16 query rows, 8 key rows).
    const std::vector<float> v = f.values<float>("model.layers.1.self_attn.v_proj.weight");
    const auto qkv = static_cast<std::size_t>(offset_of(c, "layers.1.self_attn.qkv_proj.weight"));
    CHECK(std::equal(v.begin(), v.end(), w.begin() + static_cast<std::ptrdiff_t>(qkv + 24 * 16)));

    const snug::io::HFLlama m = snug::io::import_hf_llama(dir.path);
    CHECK(m.config.block.heads == 4);
    CHECK(m.config.block.key_value_heads() == 2);
    CHECK(m.weights == unpadded(c, w));
    // Without the key, transformers' default: as many key/value heads as
    // heads, which the files' k_proj and v_proj do not hold.
    nlohmann::json no_kv = j;
    no_kv.erase("num_key_value_heads");
    write_json(dir.path / "config.json", no_kv);
    CHECK_THROWS_WITH(snug::io::import_hf_llama(dir.path), Contains("the config and the weights do not match"));
}

TEST_CASE("hf llama import: what snug's Llama does not compute is refused, naming the key and its value") {
    snug::test::TempDir dir;
    const snug::LlamaConfig c = tiny_llama();
    snug::io::export_hf_llama(dir.path, c, weights_of(c, 22));
    const nlohmann::json good = read_json(dir.path / "config.json");
    auto refused = [&](const char* key, const nlohmann::json& value, const std::string& words) {
        nlohmann::json j = good;
        j[key] = value;
        write_json(dir.path / "config.json", j);
        INFO(key);
        CHECK_THROWS_WITH(snug::io::import_hf_llama(dir.path),
                          Contains("config.json: " + std::string(key) + " is " + value.dump()) && Contains(words));
    };
    refused("num_key_value_heads", 3, "does not divide num_attention_heads 2");
    refused("rope_scaling", nlohmann::json{{"rope_type", "linear"}, {"factor", 2.0}}, "one frequency per pair");
    refused("hidden_act", "gelu", "SiLU");
    refused("attention_bias", true, "no biases");
    refused("mlp_bias", true, "no biases");
    refused("model_type", "mistral", "\"llama\"");
    refused("head_dim", 8, "4 wide");
    refused("rms_norm_eps", -1.0, "not above 0");
    refused("sliding_window", 4096, "every earlier position");
    nlohmann::json j = good;
    j["num_hidden_layers"] = 3;
    write_json(dir.path / "config.json", j);
    CHECK_THROWS_WITH(snug::io::import_hf_llama(dir.path), Contains("the config and the weights do not match"));
}

TEST_CASE("hf llama import: a missing, unexpected or misshapen tensor is refused by name") {
    snug::test::TempDir dir;
    const snug::LlamaConfig c = tiny_llama();
    snug::io::export_hf_llama(dir.path, c, weights_of(c, 23));
    const auto good = tensors_of(dir.path / "model.safetensors");
    auto with = [&](auto change) {
        auto t = good;
        change(t);
        snug::io::write_safetensors(dir.path / "model.safetensors", t);
    };
    with([](auto& t) {  // renamed: as many values in the file, the name missing
        t.emplace("model.layers.1.self_attn.v.weight", t.at("model.layers.1.self_attn.v_proj.weight"));
        t.erase("model.layers.1.self_attn.v_proj.weight");
    });
    CHECK_THROWS_WITH(snug::io::import_hf_llama(dir.path),
                      Contains("missing tensor 'model.layers.1.self_attn.v_proj.weight'"));
    with([](auto& t) { t.emplace("model.layers.0.extra.weight", t.at("model.norm.weight")); });
    CHECK_THROWS_WITH(snug::io::import_hf_llama(dir.path),
                      Contains("unexpected tensor 'model.layers.0.extra.weight' for a Llama of 2 layers"));
    with([](auto& t) {
        t.at("model.layers.0.mlp.up_proj.weight") =
            snug::io::SafeTensor{snug::DType::f32, {8, 12}, std::vector<unsigned char>(8 * 12 * 4, 0)};
    });
    CHECK_THROWS_WITH(snug::io::import_hf_llama(dir.path),
                      Contains("tensor 'model.layers.0.mlp.up_proj.weight' has shape (8, 12), expected (12, 8)"));
}
