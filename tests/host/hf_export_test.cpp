// Hugging Face GPT-2 export and import (io/hf_export.hpp): export -> import is
// exact; the safetensors header, parsed here independently, has exactly GPT-2's
// names and shapes; Conv1D weights are the transpose of snug's; config.json has
// GPT2Config's fields; import accepts GPT2LMHeadModel's prefixed names, a tied
// lm_head and the mask buffers, and rejects what snug's GPT cannot compute.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "snug/io/file.hpp"
#include "snug/io/hf_export.hpp"
#include "snug/io/safetensors.hpp"
#include "snug/nn/gpt.hpp"
#include "support/host_support.hpp"
#include "support/temp_dir.hpp"

namespace {

using Catch::Matchers::Contains;
namespace fs = std::filesystem;

// 2 layers, C = 8, 2 heads, V = 10 padded to 16, 8 positions.
snug::GPTConfig tiny_config() {
    snug::GPTConfig c;
    c.vocab_size = 10;
    c.padded_vocab_size = 16;
    c.max_seq_len = 8;
    c.n_layer = 2;
    c.n_head = 2;
    c.channels = 8;
    return c;
}

// Random weights with the padded wte rows zero (they are not exported).
std::vector<float> tiny_weights(const snug::GPTConfig& c, std::uint32_t seed) {
    std::vector<float> w = snug::test::random_values<float>(
        static_cast<std::size_t>(snug::GPTLayout(c).total()), seed, -1.0, 1.0);
    for (std::int64_t i = std::int64_t{c.vocab_size} * c.channels; i < std::int64_t{c.padded_vocab_size} * c.channels;
         ++i)
        w[static_cast<std::size_t>(i)] = 0.0f;
    return w;
}

// An independent reader of a safetensors file: the JSON header and the data.
struct RawSafetensors {
    nlohmann::json header;
    std::vector<unsigned char> data;
    std::size_t file_size = 0;

    explicit RawSafetensors(const fs::path& p) {
        const std::vector<unsigned char> bytes = snug::io::read_file(p);
        file_size = bytes.size();
        std::uint64_t n = 0;
        std::memcpy(&n, bytes.data(), 8);
        header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n));
        data.assign(bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n), bytes.end());
    }
    // Element i of an F32 tensor.
    float f32(const std::string& name, std::int64_t i) const {
        const std::uint64_t begin = header.at(name).at("data_offsets")[0].get<std::uint64_t>();
        float v;
        std::memcpy(&v, data.data() + begin + static_cast<std::uint64_t>(i) * 4, 4);
        return v;
    }
};

std::string import_error(const fs::path& dir) {
    try {
        (void)snug::io::import_hf_gpt2(dir);
    } catch (const snug::FileError& e) {
        return e.what();
    }
    FAIL_CHECK("no FileError importing " << dir);
    return "";
}

}  // namespace

TEST_CASE("export then import is exact, padded vocabulary included") {
    snug::test::TempDir dir;
    const snug::GPTConfig c = tiny_config();
    const std::vector<float> w = tiny_weights(c, 1);
    snug::io::export_hf_gpt2(dir.path, c, w);
    const snug::io::HFModel m = snug::io::import_hf_gpt2(dir.path);
    CHECK(m.dtype == snug::DType::f32);
    CHECK(m.config.vocab_size == 10);
    CHECK(m.config.padded_vocab_size == 16);
    CHECK(m.config.max_seq_len == 8);
    CHECK(m.config.n_layer == 2);
    CHECK(m.config.n_head == 2);
    CHECK(m.config.channels == 8);
    CHECK(m.weights == w);
}

TEST_CASE("a bf16 export imports as each value rounded to bf16") {
    snug::test::TempDir dir;
    const snug::GPTConfig c = tiny_config();
    const std::vector<float> w = tiny_weights(c, 2);
    snug::io::export_hf_gpt2(dir.path, c, w, snug::DType::bf16);
    const RawSafetensors raw(dir.path / "model.safetensors");
    CHECK(raw.header.at("h.0.mlp.c_fc.weight").at("dtype") == "BF16");
    const snug::io::HFModel m = snug::io::import_hf_gpt2(dir.path);
    CHECK(m.dtype == snug::DType::bf16);
    REQUIRE(m.weights.size() == w.size());
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < w.size(); ++i) {
        const snug::bfloat16 b = snug::bfloat16(m.weights[i]);
        wrong += static_cast<float>(b) != m.weights[i] || !snug::test::is_rne(static_cast<double>(w[i]), b);
    }
    CHECK(wrong == 0);
    const nlohmann::json j = nlohmann::json::parse(snug::io::read_file(dir.path / "config.json"));
    CHECK(j.at("torch_dtype") == "bfloat16");
}

TEST_CASE("the safetensors header has exactly GPT-2's names and shapes") {
    snug::test::TempDir dir;
    const snug::GPTConfig c = tiny_config();
    snug::io::export_hf_gpt2(dir.path, c, tiny_weights(c, 3));
    const RawSafetensors raw(dir.path / "model.safetensors");

    // V = 10, maxT = 8, C = 8: Conv1D weights are (in, out).
    using Entry = std::pair<std::string, std::vector<std::int64_t>>;
    std::set<Entry> want = {{"wte.weight", {10, 8}}, {"wpe.weight", {8, 8}}, {"ln_f.weight", {8}}, {"ln_f.bias", {8}}};
    for (const char* l : {"0", "1"}) {
        const std::string h = std::string("h.") + l + ".";
        want.insert({h + "ln_1.weight", {8}});
        want.insert({h + "ln_1.bias", {8}});
        want.insert({h + "attn.c_attn.weight", {8, 24}});
        want.insert({h + "attn.c_attn.bias", {24}});
        want.insert({h + "attn.c_proj.weight", {8, 8}});
        want.insert({h + "attn.c_proj.bias", {8}});
        want.insert({h + "ln_2.weight", {8}});
        want.insert({h + "ln_2.bias", {8}});
        want.insert({h + "mlp.c_fc.weight", {8, 32}});
        want.insert({h + "mlp.c_fc.bias", {32}});
        want.insert({h + "mlp.c_proj.weight", {32, 8}});
        want.insert({h + "mlp.c_proj.bias", {8}});
    }
    REQUIRE(want.size() == 28);

    std::set<Entry> got;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
    for (const auto& [name, entry] : raw.header.items()) {
        if (name == "__metadata__") continue;
        CHECK(entry.at("dtype") == "F32");
        got.insert({name, entry.at("shape").get<std::vector<std::int64_t>>()});
        ranges.emplace_back(entry.at("data_offsets")[0].get<std::uint64_t>(),
                            entry.at("data_offsets")[1].get<std::uint64_t>());
    }
    CHECK(got == want);
    // The data is tiled without gaps or overlaps (the safetensors loaders insist).
    std::sort(ranges.begin(), ranges.end());
    std::uint64_t end = 0;
    for (const auto& [b, e] : ranges) {
        CHECK(b == end);
        end = e;
    }
    CHECK(end == raw.data.size());
    CHECK(raw.header.at("__metadata__").at("format") == "pt");
}

TEST_CASE("Conv1D weights are stored transposed, the rest as they are") {
    snug::test::TempDir dir;
    const snug::GPTConfig c = tiny_config();
    const std::vector<float> w = tiny_weights(c, 4);
    snug::io::export_hf_gpt2(dir.path, c, w);
    const RawSafetensors raw(dir.path / "model.safetensors");
    const snug::GPTTensors<const float> t(w.data(), c);
    const int C = 8;

    // h.1.mlp.c_fc.weight: file (in = C, out = 4C); snug fcw layer 1 is (4C, C).
    const float* fcw = t.layer(snug::GPTTensor::fcw, 1);
    std::size_t mismatches = 0;
    for (int in = 0; in < C; ++in)
        for (int out = 0; out < 4 * C; ++out)
            mismatches += raw.f32("h.1.mlp.c_fc.weight", in * 4 * C + out) != fcw[out * C + in];
    // h.0.attn.c_attn.weight: file (C, 3C); snug qkvw layer 0 is (3C, C).
    const float* qkvw = t.layer(snug::GPTTensor::qkvw, 0);
    for (int in = 0; in < C; ++in)
        for (int out = 0; out < 3 * C; ++out)
            mismatches += raw.f32("h.0.attn.c_attn.weight", in * 3 * C + out) != qkvw[out * C + in];
    // h.0.mlp.c_proj.weight: file (4C, C); snug fcprojw layer 0 is (C, 4C).
    const float* fcprojw = t.layer(snug::GPTTensor::fcprojw, 0);
    for (int in = 0; in < 4 * C; ++in)
        for (int out = 0; out < C; ++out)
            mismatches += raw.f32("h.0.mlp.c_proj.weight", in * C + out) != fcprojw[out * 4 * C + in];
    CHECK(mismatches == 0);
    // Not square by accident: the transposed and the plain reading differ.
    CHECK(raw.f32("h.1.mlp.c_fc.weight", 1) != fcw[1]);

    // Biases, LayerNorms and embeddings are copied as they are.
    const float* qkvb = t.layer(snug::GPTTensor::qkvb, 1);
    for (int i = 0; i < 3 * C; ++i) mismatches += raw.f32("h.1.attn.c_attn.bias", i) != qkvb[i];
    const float* ln2w = t.layer(snug::GPTTensor::ln2w, 0);
    for (int i = 0; i < C; ++i) mismatches += raw.f32("h.0.ln_2.weight", i) != ln2w[i];
    for (int i = 0; i < 10 * C; ++i) mismatches += raw.f32("wte.weight", i) != t[snug::GPTTensor::wte][i];
    for (int i = 0; i < 8 * C; ++i) mismatches += raw.f32("wpe.weight", i) != t[snug::GPTTensor::wpe][i];
    for (int i = 0; i < C; ++i) mismatches += raw.f32("ln_f.bias", i) != t[snug::GPTTensor::lnfb][i];
    CHECK(mismatches == 0);
}

TEST_CASE("config.json has GPT2Config's fields for GPT2LMHeadModel") {
    snug::test::TempDir dir;
    const snug::GPTConfig c = tiny_config();
    snug::io::export_hf_gpt2(dir.path / "sub" / "model", c, tiny_weights(c, 5));  // creates the directories
    const nlohmann::json j = nlohmann::json::parse(snug::io::read_file(dir.path / "sub" / "model" / "config.json"));
    CHECK(j.at("model_type") == "gpt2");
    CHECK(j.at("architectures") == nlohmann::json::array({"GPT2LMHeadModel"}));
    CHECK(j.at("vocab_size") == 10);  // the real vocabulary, not the padded one
    CHECK(j.at("n_positions") == 8);
    CHECK(j.at("n_ctx") == 8);
    CHECK(j.at("n_embd") == 8);
    CHECK(j.at("n_layer") == 2);
    CHECK(j.at("n_head") == 2);
    CHECK(j.at("n_inner").is_null());
    CHECK(j.at("activation_function") == "gelu_new");
    CHECK(j.at("layer_norm_epsilon").get<double>() == 1e-5);
    CHECK(j.at("tie_word_embeddings") == true);
    CHECK(j.at("resid_pdrop").get<double>() == 0.0);
    CHECK(j.at("embd_pdrop").get<double>() == 0.0);
    CHECK(j.at("attn_pdrop").get<double>() == 0.0);
    CHECK(j.at("torch_dtype") == "float32");
    CHECK(fs::exists(dir.path / "sub" / "model" / "model.safetensors"));
    // Nothing but the two files (no temporaries left).
    CHECK(std::distance(fs::directory_iterator(dir.path / "sub" / "model"), fs::directory_iterator()) == 2);
}

TEST_CASE("import accepts GPT2LMHeadModel's names, a tied head and the mask buffers") {
    snug::test::TempDir dir;
    const snug::GPTConfig c = tiny_config();
    const std::vector<float> w = tiny_weights(c, 6);
    snug::io::export_hf_gpt2(dir.path, c, w);
    const snug::io::SafetensorsFile exported(dir.path / "model.safetensors");

    std::map<std::string, snug::io::SafeTensor> renamed;
    for (const auto& [name, t] : exported.tensors()) renamed["transformer." + name] = t;
    renamed["lm_head.weight"] = exported.at("wte.weight");
    snug::io::SafeTensor mask{snug::DType::f32, {1, 1, 8, 8}, std::vector<unsigned char>(64 * 4, 0)};
    renamed["transformer.h.0.attn.bias"] = mask;
    renamed["transformer.h.1.attn.masked_bias"] = snug::io::SafeTensor{snug::DType::f32, {}, {0, 0, 0, 0}};

    SECTION("prefixed, tied, with buffers: the same weights") {
        snug::io::write_safetensors(dir.path / "model.safetensors", renamed, {{"padded_vocab_size", "16"}});
        const snug::io::HFModel m = snug::io::import_hf_gpt2(dir.path);
        CHECK(m.config.padded_vocab_size == 16);
        CHECK(m.weights == w);
    }
    SECTION("without padded_vocab_size metadata the vocabulary is padded as GPTConfig::pad_vocab says") {
        snug::io::write_safetensors(dir.path / "model.safetensors", renamed);
        const snug::io::HFModel m = snug::io::import_hf_gpt2(dir.path);
        CHECK(m.config.padded_vocab_size == 10);  // pad_vocab(10): small vocabularies stay unpadded
        const snug::io::HFModel m32 = snug::io::import_hf_gpt2(dir.path, 32);
        CHECK(m32.config.padded_vocab_size == 32);
        // Same tensors, other offsets: compare through the names.
        for (const snug::ParameterTensor& t : snug::gpt_named_tensors(m.config)) {
            const snug::ParameterTensor orig = snug::find_named_tensor(c, t.name);
            const std::int64_t n = t.name == "wte.weight" ? 10 * 8 : t.shape.numel();
            bool same = true;
            for (std::int64_t i = 0; i < n; ++i)
                same = same && m.weights[static_cast<std::size_t>(t.offset + i)] ==
                                   w[static_cast<std::size_t>(orig.offset + i)];
            INFO(t.name);
            CHECK(same);
        }
    }
    SECTION("an untied head is refused") {
        std::vector<unsigned char>& b = renamed["lm_head.weight"].bytes;
        b[4 * 17] ^= 0x01;  // flip a low mantissa bit of element 17
        snug::io::write_safetensors(dir.path / "model.safetensors", renamed);
        CHECK_THAT(import_error(dir.path), Contains("lm_head.weight") && Contains("element 17") && Contains("tied"));
    }
    SECTION("a missing tensor is named") {
        renamed.erase("transformer.h.1.mlp.c_proj.bias");
        snug::io::write_safetensors(dir.path / "model.safetensors", renamed);
        CHECK_THAT(import_error(dir.path), Contains("model.safetensors") && Contains("missing") &&
                                               Contains("h.1.mlp.c_proj.bias"));
    }
    SECTION("an unknown tensor is named") {
        renamed["transformer.h.2.ln_1.weight"] = exported.at("ln_f.weight");
        snug::io::write_safetensors(dir.path / "model.safetensors", renamed);
        CHECK_THAT(import_error(dir.path), Contains("unexpected") && Contains("h.2.ln_1.weight"));
    }
    SECTION("a weight in nn.Linear's (out, in) shape is refused") {
        renamed["transformer.h.0.attn.c_attn.weight"].shape = {24, 8};
        snug::io::write_safetensors(dir.path / "model.safetensors", renamed);
        CHECK_THAT(import_error(dir.path), Contains("h.0.attn.c_attn.weight") && Contains("(24, 8)") &&
                                               Contains("(8, 24)"));
    }
}

TEST_CASE("import refuses configurations snug's GPT does not compute") {
    snug::test::TempDir dir;
    const snug::GPTConfig c = tiny_config();
    snug::io::export_hf_gpt2(dir.path, c, tiny_weights(c, 7));
    const nlohmann::json good = nlohmann::json::parse(snug::io::read_file(dir.path / "config.json"));
    auto with = [&](const std::string& key, const nlohmann::json& value) {
        nlohmann::json j = good;
        j[key] = value;
        const std::string s = j.dump();
        snug::io::atomic_write(dir.path / "config.json", [&](snug::io::FileWriter& f) { f.write(s.data(), s.size()); });
        return import_error(dir.path);
    };
    CHECK_THAT(with("activation_function", "gelu"), Contains("config.json") && Contains("activation_function"));
    CHECK_THAT(with("layer_norm_epsilon", 1e-6), Contains("layer_norm_epsilon"));
    CHECK_THAT(with("n_inner", 40), Contains("n_inner") && Contains("32"));
    CHECK_THAT(with("tie_word_embeddings", false), Contains("tie_word_embeddings"));
    CHECK_THAT(with("model_type", "llama"), Contains("model_type"));
    CHECK_THAT(with("n_head", 3), Contains("channels") && Contains("n_head"));
    CHECK_THAT(with("n_embd", "eight"), Contains("n_embd"));
    // A different but consistent shape: the tensors no longer fit.
    CHECK_THAT(with("n_embd", 16), Contains("model.safetensors") && Contains("shape"));
    // The accepted spelling of the same GELU.
    nlohmann::json j = good;
    j["activation_function"] = "gelu_pytorch_tanh";
    const std::string s = j.dump();
    snug::io::atomic_write(dir.path / "config.json", [&](snug::io::FileWriter& f) { f.write(s.data(), s.size()); });
    CHECK_NOTHROW(snug::io::import_hf_gpt2(dir.path));
}

TEST_CASE("export checks its input") {
    snug::test::TempDir dir;
    const snug::GPTConfig c = tiny_config();
    const std::vector<float> w = tiny_weights(c, 8);
    CHECK_THROWS_AS(snug::io::export_hf_gpt2(dir.path / "a", c, std::vector<float>(w.size() + 1)), snug::ShapeError);
    CHECK_THROWS_AS(snug::io::export_hf_gpt2(dir.path / "b", c, w, snug::DType::f16), snug::Error);
    CHECK(fs::is_empty(dir.path));
}
