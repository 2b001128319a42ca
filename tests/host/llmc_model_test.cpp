// llm.c model files (io/llmc_model.hpp): files built byte by byte here are read
// back right, writing and reading round-trip (fp32 exactly, bf16 as
// round-to-nearest-even), every malformed file gives a FileError that names
// the problem, and a GPT loaded from a round-tripped file computes the same
// logits as one loaded from the original weights.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "snug/io/file.hpp"
#include "snug/io/llmc_model.hpp"
#include "snug/nn/gpt.hpp"
#include "support/host_run.hpp"
#include "support/host_support.hpp"
#include "support/temp_dir.hpp"

namespace {

using Catch::Matchers::Contains;
namespace fs = std::filesystem;

// An independent writer: the 256-int32 header, then the raw value bytes.
void write_raw(const fs::path& p, const std::vector<std::int32_t>& header_start, const void* values, std::size_t bytes) {
    std::int32_t header[256] = {};
    std::memcpy(header, header_start.data(), header_start.size() * sizeof(std::int32_t));
    std::FILE* f = std::fopen(p.c_str(), "wb");
    REQUIRE(f != nullptr);
    REQUIRE(std::fwrite(header, 1, sizeof header, f) == sizeof header);
    if (bytes != 0) REQUIRE(std::fwrite(values, 1, bytes, f) == bytes);
    std::fclose(f);
}

// The message of the FileError that reading `p` throws ("" and a failed check
// when nothing is thrown).
std::string read_error(const fs::path& p) {
    try {
        (void)snug::io::read_llmc_model(p);
    } catch (const snug::FileError& e) {
        return e.what();
    }
    FAIL_CHECK("no FileError reading " << p);
    return "";
}

// A small model with a padded vocabulary: 50 real tokens, 64 rows.
snug::GPTConfig small_config() {
    snug::GPTConfig c;
    c.vocab_size = 50;
    c.padded_vocab_size = 64;
    c.max_seq_len = 16;
    c.n_layer = 2;
    c.n_head = 2;
    c.channels = 16;
    return c;
}

// Vp C + maxT C + L (12 C^2 + 13 C) + 2 C, counted by hand for small_config.
constexpr std::size_t small_count = 64 * 16 + 16 * 16 + 2 * (12 * 16 * 16 + 13 * 16) + 2 * 16;  // 7872

}  // namespace

TEST_CASE("a tiny fp32 llm.c file built by hand reads back field by field") {
    snug::test::TempDir dir;
    const fs::path p = dir.path / "tiny.bin";
    // maxT 4, V 5, L 1, NH 2, C 4, Vp 8: 8*4 + 4*4 + (12*16 + 13*4) + 2*4 = 300 values.
    std::vector<float> values(300);
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.25f - 7.0f;
    write_raw(p, {20240326, 3, 4, 5, 1, 2, 4, 8}, values.data(), values.size() * sizeof(float));

    const snug::io::LlmcModel m = snug::io::read_llmc_model(p);
    CHECK(m.version == snug::io::LlmcVersion::fp32);
    CHECK(m.config.max_seq_len == 4);
    CHECK(m.config.vocab_size == 5);
    CHECK(m.config.n_layer == 1);
    CHECK(m.config.n_head == 2);
    CHECK(m.config.channels == 4);
    CHECK(m.config.padded_vocab_size == 8);
    REQUIRE(m.weights.size() == 300);
    CHECK(m.weights == values);
    // llm.c's order: wpe starts after the Vp*C = 32 values of wte, lnfb is the
    // last C = 4 values; snug's layout agrees.
    const snug::GPTTensors<const float> t(m.weights.data(), m.config);
    CHECK(t[snug::GPTTensor::wpe][0] == values[32]);
    CHECK(t[snug::GPTTensor::qkvw][0] == values[32 + 16 + 4 + 4]);
    CHECK(t[snug::GPTTensor::lnfb][0] == values[296]);
}

TEST_CASE("a tiny bf16 llm.c file built by hand reads back exactly") {
    snug::test::TempDir dir;
    const fs::path p = dir.path / "tiny_bf16.bin";
    // Known bf16 patterns: 1.0 = 0x3F80, -2.0 = 0xC000, 0.5 = 0x3F00, 3.140625 = 0x4049, 1 + 2^-7 = 0x3F81.
    const std::uint16_t known[] = {0x3F80, 0xC000, 0x3F00, 0x4049, 0x3F81};
    const float known_values[] = {1.0f, -2.0f, 0.5f, 3.140625f, 1.0078125f};
    std::vector<std::uint16_t> bits(300);
    for (std::size_t i = 0; i < bits.size(); ++i) bits[i] = known[i % 5];
    write_raw(p, {20240326, 5, 4, 5, 1, 2, 4, 8}, bits.data(), bits.size() * 2);

    const snug::io::LlmcModel m = snug::io::read_llmc_model(p);
    CHECK(m.version == snug::io::LlmcVersion::bf16);
    REQUIRE(m.weights.size() == 300);
    for (std::size_t i = 0; i < m.weights.size(); ++i) {
        INFO("value " << i);
        CHECK(m.weights[i] == known_values[i % 5]);
    }
}

TEST_CASE("write then read: version 3 is exact, the header is llm.c's") {
    snug::test::TempDir dir;
    const fs::path p = dir.path / "model.bin";
    const snug::GPTConfig c = small_config();
    const std::vector<float> w = snug::test::random_values<float>(small_count, 11, -2.0, 2.0);
    snug::io::write_llmc_model(p, c, w, snug::io::LlmcVersion::fp32);

    // The bytes, read independently.
    const std::vector<unsigned char> bytes = snug::io::read_file(p);
    REQUIRE(bytes.size() == 1024 + 4 * small_count);
    std::int32_t h[256];
    std::memcpy(h, bytes.data(), sizeof h);
    CHECK(h[0] == 20240326);
    CHECK(h[1] == 3);
    CHECK(h[2] == 16);  // max_seq_len
    CHECK(h[3] == 50);  // vocab_size
    CHECK(h[4] == 2);   // num_layers
    CHECK(h[5] == 2);   // num_heads
    CHECK(h[6] == 16);  // channels
    CHECK(h[7] == 64);  // padded_vocab_size
    bool rest_zero = true;
    for (int i = 8; i < 256; ++i) rest_zero = rest_zero && h[i] == 0;
    CHECK(rest_zero);
    std::vector<float> raw(small_count);
    std::memcpy(raw.data(), bytes.data() + 1024, 4 * small_count);
    CHECK(raw == w);

    const snug::io::LlmcModel m = snug::io::read_llmc_model(p);
    CHECK(m.version == snug::io::LlmcVersion::fp32);
    CHECK(m.config.vocab_size == c.vocab_size);
    CHECK(m.config.padded_vocab_size == c.padded_vocab_size);
    CHECK(m.config.max_seq_len == c.max_seq_len);
    CHECK(m.config.n_layer == c.n_layer);
    CHECK(m.config.n_head == c.n_head);
    CHECK(m.config.channels == c.channels);
    CHECK(m.weights == w);
}

TEST_CASE("write then read: version 5 holds each value rounded to bf16, nearest even") {
    snug::test::TempDir dir;
    const fs::path p = dir.path / "model_bf16.bin";
    const snug::GPTConfig c = small_config();
    std::vector<float> w = snug::test::random_values<float>(small_count, 12, -3.0, 3.0);
    // Hand-rounded cases (bf16 keeps 7 mantissa bits, so near 1 its step is 2^-7):
    //   1 + 2^-8            halfway between 1 (even) and 1 + 2^-7: -> 1        (0x3F80)
    //   1 + 3 * 2^-8        halfway between 1 + 2^-7 (odd) and 1 + 2^-6: -> 1 + 2^-6 (0x3F82)
    //   1 + 2^-8 + 2^-20    just above halfway: -> 1 + 2^-7                     (0x3F81)
    //   -(1 + 2^-8 - 2^-20) just below halfway: -> -1                           (0xBF80)
    const float cases[] = {1.00390625f, 1.01171875f, 1.0f + 0.00390625f + 0.00000095367431640625f,
                           -(1.0f + 0.00390625f - 0.00000095367431640625f)};
    const float rounded[] = {1.0f, 1.015625f, 1.0078125f, -1.0f};
    const std::uint16_t rounded_bits[] = {0x3F80, 0x3F82, 0x3F81, 0xBF80};
    const std::size_t at[] = {0, 1000, 5000, small_count - 1};
    for (int k = 0; k < 4; ++k) w[at[k]] = cases[k];
    snug::io::write_llmc_model(p, c, w, snug::io::LlmcVersion::bf16);

    const std::vector<unsigned char> bytes = snug::io::read_file(p);
    REQUIRE(bytes.size() == 1024 + 2 * small_count);
    std::int32_t version = 0;
    std::memcpy(&version, bytes.data() + 4, 4);
    CHECK(version == 5);
    for (int k = 0; k < 4; ++k) {
        std::uint16_t b = 0;
        std::memcpy(&b, bytes.data() + 1024 + 2 * at[k], 2);
        CHECK(b == rounded_bits[k]);
    }

    const snug::io::LlmcModel m = snug::io::read_llmc_model(p);
    CHECK(m.version == snug::io::LlmcVersion::bf16);
    REQUIRE(m.weights.size() == small_count);
    for (int k = 0; k < 4; ++k) CHECK(m.weights[at[k]] == rounded[k]);
    std::size_t not_snug = 0, not_rne = 0;
    for (std::size_t i = 0; i < small_count; ++i) {
        not_snug += m.weights[i] != static_cast<float>(snug::bfloat16(w[i]));
        const snug::bfloat16 b = snug::bfloat16(m.weights[i]);  // exact: the value is a bf16
        not_rne += !snug::test::is_rne(static_cast<double>(w[i]), b) || static_cast<float>(b) != m.weights[i];
    }
    CHECK(not_snug == 0);
    CHECK(not_rne == 0);
}

TEST_CASE("malformed llm.c model files throw FileError naming the problem") {
    snug::test::TempDir dir;
    const std::vector<std::int32_t> good = {20240326, 3, 4, 5, 1, 2, 4, 8};
    // maxT 4, V 5, L 1, NH 2, C 4, Vp 8: 300 values, 1024 + 1200 = 2224 bytes in fp32.
    auto file = [&](const std::string& name, const std::vector<std::int32_t>& header, std::size_t n = 300 * 4) {
        const fs::path p = dir.path / name;
        std::vector<float> v(n / 4 + 1, 0.5f);
        write_raw(p, header, v.data(), n);
        return p;
    };

    SECTION("missing file") {
        const std::string e = read_error(dir.path / "nope.bin");
        CHECK_THAT(e, Contains("nope.bin"));
    }
    SECTION("short header") {
        const fs::path p = dir.path / "short.bin";
        std::FILE* f = std::fopen(p.c_str(), "wb");
        const char junk[100] = {};
        std::fwrite(junk, 1, sizeof junk, f);
        std::fclose(f);
        const std::string e = read_error(p);
        CHECK_THAT(e, Contains("short.bin") && Contains("100 bytes") && Contains("1024"));
    }
    SECTION("wrong magic") {
        auto h = good;
        h[0] = 12345;
        const std::string e = read_error(file("magic.bin", h));
        CHECK_THAT(e, Contains("magic.bin") && Contains("magic") && Contains("12345") && Contains("20240326"));
    }
    SECTION("a token file's magic") {
        auto h = good;
        h[0] = 20240520;
        const std::string e = read_error(file("tokens.bin", h));
        CHECK_THAT(e, Contains("20240520") && Contains("token file"));
    }
    SECTION("a tokenizer file's magic") {
        auto h = good;
        h[0] = 20240328;
        const std::string e = read_error(file("tok.bin", h));
        CHECK_THAT(e, Contains("20240328") && Contains("tokenizer"));
    }
    SECTION("unsupported version") {
        auto h = good;
        h[1] = 4;
        const std::string e = read_error(file("v4.bin", h));
        CHECK_THAT(e, Contains("v4.bin") && Contains("version 4") && Contains("3") && Contains("5"));
    }
    SECTION("a non-positive header value") {
        const char* names[] = {"max_seq_len", "vocab_size", "num_layers", "num_heads", "channels",
                               "padded_vocab_size"};
        for (int i = 0; i < 6; ++i) {
            auto h = good;
            h[static_cast<std::size_t>(2 + i)] = i % 2 == 0 ? 0 : -3;
            const std::string e = read_error(file("bad" + std::to_string(i) + ".bin", h));
            CHECK_THAT(e, Contains(names[i]) && Contains(i % 2 == 0 ? "got 0" : "got -3") && Contains("positive"));
        }
    }
    SECTION("padded vocabulary smaller than the vocabulary") {
        auto h = good;
        h[7] = 4;  // V = 5
        const std::string e = read_error(file("vp.bin", h));
        CHECK_THAT(e, Contains("padded_vocab_size 4") && Contains("vocab_size 5"));
    }
    SECTION("channels not divisible by heads") {
        auto h = good;
        h[5] = 3;  // C = 4
        const std::string e = read_error(file("heads.bin", h));
        CHECK_THAT(e, Contains("channels 4") && Contains("num_heads 3") && Contains("divisible"));
    }
    SECTION("truncated: one value short") {
        const std::string e = read_error(file("trunc.bin", good, 299 * 4));
        CHECK_THAT(e, Contains("trunc.bin") && Contains("2224 bytes") && Contains("2220 bytes") &&
                          Contains("truncated"));
    }
    SECTION("trailing data") {
        const std::string e = read_error(file("long.bin", good, 301 * 4));
        CHECK_THAT(e, Contains("2224 bytes") && Contains("2228 bytes") && Contains("trailing"));
    }
    SECTION("a bf16 header over fp32 data") {
        auto h = good;
        h[1] = 5;  // expects 1024 + 600 bytes
        const std::string e = read_error(file("mixed.bin", h));
        CHECK_THAT(e, Contains("1624 bytes") && Contains("2224 bytes"));
    }
}

TEST_CASE("writing checks the weights and leaves nothing behind on error") {
    snug::test::TempDir dir;
    const fs::path p = dir.path / "w.bin";
    const snug::GPTConfig c = small_config();
    const std::vector<float> short_w(small_count - 1, 0.0f);
    CHECK_THROWS_AS(snug::io::write_llmc_model(p, c, short_w), snug::ShapeError);
    snug::GPTConfig bad = c;
    bad.n_head = 3;
    const std::vector<float> w(small_count, 0.0f);
    CHECK_THROWS_AS(snug::io::write_llmc_model(p, bad, w), snug::ConfigError);
    CHECK(fs::is_empty(dir.path));
}

TEST_CASE("a GPT loaded from a round-tripped llm.c file gives the original logits") {
    snug::test::TempDir dir;
    const snug::GPTConfig c = small_config();
    std::vector<float> w = snug::gpt_initial_weights(c, 5);
    // Non-trivial biases and LayerNorm parameters too.
    const std::vector<float> noise = snug::test::random_values<float>(w.size(), 6, -0.1, 0.1);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = 10.0f * w[i] + noise[i];
    const int B = 2, T = 7;
    const std::vector<std::int32_t> tokens = {3, 17, 49, 0, 22, 8, 31, 44, 1, 2, 12, 9, 40, 27};

    auto logits_of = [&](const snug::GPTConfig& config, const std::vector<float>& weights) {
        snug::test::HostRun run;
        snug::GPT<float, snug::Host> model(config, run.tracker);
        model.load_weights(run.ctx.device, weights);
        model.forward(run.ctx, tokens.data(), nullptr, B, T, 0.0f);
        const float* l = model.logits().data();
        std::vector<float> out(l, l + static_cast<std::ptrdiff_t>(B) * T * config.padded_vocab_size);
        model.release(run.ctx);
        return out;
    };
    const std::vector<float> want = logits_of(c, w);

    snug::io::write_llmc_model(dir.path / "m3.bin", c, w, snug::io::LlmcVersion::fp32);
    const snug::io::LlmcModel m3 = snug::io::read_llmc_model(dir.path / "m3.bin");
    CHECK(logits_of(m3.config, m3.weights) == want);

    // bf16: the same logits as a GPT given the bf16-rounded weights directly.
    std::vector<float> w16(w.size());
    for (std::size_t i = 0; i < w.size(); ++i) w16[i] = static_cast<float>(snug::bfloat16(w[i]));
    snug::io::write_llmc_model(dir.path / "m5.bin", c, w, snug::io::LlmcVersion::bf16);
    const snug::io::LlmcModel m5 = snug::io::read_llmc_model(dir.path / "m5.bin");
    const std::vector<float> got16 = logits_of(m5.config, m5.weights);
    CHECK(got16 == logits_of(c, w16));
    CHECK(got16 != want);  // the rounding is visible
}
