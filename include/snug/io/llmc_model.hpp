// llm.c GPT-2 model files: a header of 256 little-endian int32 (magic 20240326,
// version 3 for fp32 or 5 for bf16 parameters, then max_seq_len, vocab_size,
// num_layers, num_heads, channels, padded_vocab_size; the rest zero) followed
// by every parameter in llm.c's order, which is snug's GPTLayout. Reading
// checks every header field and the exact file size, and streams the values
// into one fp32 vector; writing rounds to bf16 (nearest even) for version 5
// and is atomic (temporary file, then rename).
#pragma once

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "snug/core/error.hpp"
#include "snug/core/half.hpp"
#include "snug/io/file.hpp"
#include "snug/nn/gpt_config.hpp"
#include "snug/nn/gpt_parameters.hpp"

namespace snug::io {

static_assert(std::endian::native == std::endian::little, "llm.c model files are little-endian");

inline constexpr std::int32_t llmc_model_magic = 20240326;
inline constexpr std::size_t llmc_model_header_bytes = 256 * sizeof(std::int32_t);

// The parameter precision of a model file; the value is the header's version.
enum class LlmcVersion : std::int32_t { fp32 = 3, bf16 = 5 };

// A model read from an llm.c file: its shape, its parameters in fp32 in
// snug's (= llm.c's) layout, and the precision they were stored in.
struct LlmcModel {
    GPTConfig config;
    std::vector<float> weights;  // GPTLayout(config).total() values
    LlmcVersion version = LlmcVersion::fp32;
};

namespace detail {

inline std::size_t llmc_value_bytes(LlmcVersion v) { return v == LlmcVersion::fp32 ? 4 : 2; }

// The GPTConfig a header describes; FileError names the first bad field.
inline GPTConfig llmc_config_from_header(const std::int32_t* h, const std::string& name) {
    auto fail = [&](const std::string& what) { throw FileError(name + ": llm.c model header: " + what); };
    const char* fields[] = {"max_seq_len", "vocab_size", "num_layers", "num_heads", "channels", "padded_vocab_size"};
    for (int i = 0; i < 6; ++i)
        if (h[2 + i] <= 0)
            fail(std::string(fields[i]) + " (header[" + std::to_string(2 + i) + "]) must be positive, got " +
                 std::to_string(h[2 + i]));
    GPTConfig c;
    c.max_seq_len = h[2];
    c.vocab_size = h[3];
    c.n_layer = h[4];
    c.n_head = h[5];
    c.channels = h[6];
    c.padded_vocab_size = h[7];
    if (c.padded_vocab_size < c.vocab_size)
        fail("padded_vocab_size " + std::to_string(c.padded_vocab_size) + " is smaller than vocab_size " +
             std::to_string(c.vocab_size));
    if (c.channels % c.n_head != 0)
        fail("channels " + std::to_string(c.channels) + " is not divisible by num_heads " + std::to_string(c.n_head));
    // int32 fields can describe more parameters than an int64 counts; such a
    // header is corrupt (GPT-2 xl has 1.6e9).
    const double C = c.channels;
    const double estimate = (static_cast<double>(c.padded_vocab_size) + c.max_seq_len + 2.0) * C +
                            static_cast<double>(c.n_layer) * (12.0 * C * C + 13.0 * C);
    if (estimate > 1e15)
        fail("the sizes (L " + std::to_string(c.n_layer) + ", C " + std::to_string(c.channels) + ", Vp " +
             std::to_string(c.padded_vocab_size) + ", maxT " + std::to_string(c.max_seq_len) + ") imply " +
             std::to_string(estimate) + " parameters: corrupt header");
    return c;
}

}  // namespace detail

// Reads an llm.c model file (version 3 or 5). FileError names the file and
// the problem: missing, short header, wrong magic (saying when it is an llm.c
// token or tokenizer file instead), unsupported version, a header value that
// makes no sense, or a size that does not match the header (expected vs actual
// bytes). Holds no more than the returned fp32 vector and a small buffer.
inline LlmcModel read_llmc_model(const std::filesystem::path& path) {
    const std::string name = path.string();
    std::error_code ec;
    const std::uintmax_t size = std::filesystem::file_size(path, ec);
    if (ec) throw FileError(name + ": cannot read the llm.c model file: " + ec.message());
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (f == nullptr) throw FileError(name + ": cannot open for reading: " + std::strerror(errno));
    struct Closer {
        std::FILE* f;
        ~Closer() { std::fclose(f); }
    } closer{f};

    if (size < llmc_model_header_bytes)
        throw FileError(name + ": short header: " + std::to_string(size) + " bytes, an llm.c model file starts with a " +
                        "header of " + std::to_string(llmc_model_header_bytes) + " bytes");
    std::int32_t h[256];
    if (std::fread(h, 1, sizeof h, f) != sizeof h) throw FileError(name + ": read error in the header");
    if (h[0] != llmc_model_magic) {
        std::string hint;
        if (h[0] == 20240520) hint = " (that is an llm.c token file's magic: this is data, not a model)";
        if (h[0] == 20240328) hint = " (that is an llm.c tokenizer file's magic: this is a tokenizer, not a model)";
        throw FileError(name + ": wrong magic number " + std::to_string(h[0]) + " (expected " +
                        std::to_string(llmc_model_magic) + " for an llm.c model file)" + hint);
    }
    if (h[1] != static_cast<std::int32_t>(LlmcVersion::fp32) && h[1] != static_cast<std::int32_t>(LlmcVersion::bf16))
        throw FileError(name + ": unsupported llm.c model version " + std::to_string(h[1]) +
                        " (supported: 3 = fp32 parameters, 5 = bf16 parameters)");
    LlmcModel m;
    m.version = static_cast<LlmcVersion>(h[1]);
    m.config = detail::llmc_config_from_header(h, name);

    // Laying the model out names 12 tensors per layer; a header that claims
    // millions of layers in a file of a few KiB is refused before that, by a
    // lower bound on its parameters: each layer's four matrices hold 12 C².
    const double C = m.config.channels;
    const double at_least = static_cast<double>(m.config.n_layer) * 12.0 * C * C;
    const double available = static_cast<double>(size - llmc_model_header_bytes) / detail::llmc_value_bytes(m.version);
    if (at_least > available)
        throw FileError(name + ": size mismatch: the header's " + std::to_string(m.config.n_layer) +
                        " layers of " + std::to_string(m.config.channels) + " channels need at least " +
                        std::to_string(static_cast<std::int64_t>(at_least)) + " parameters, but the file has " +
                        std::to_string(size) + " bytes (truncated)");

    const std::int64_t count = GPTLayout(m.config).total();
    const std::size_t value_bytes = detail::llmc_value_bytes(m.version);
    const std::uintmax_t expected = llmc_model_header_bytes + static_cast<std::uintmax_t>(count) * value_bytes;
    if (size != expected)
        throw FileError(name + ": size mismatch: the header (version " + std::to_string(h[1]) + ", " +
                        std::to_string(count) + " parameters of " + std::to_string(value_bytes) + " bytes) promises " +
                        std::to_string(expected) + " bytes, but the file has " + std::to_string(size) + " bytes (" +
                        (size < expected ? "truncated" : "trailing data") + ")");

    m.weights.resize(static_cast<std::size_t>(count));
    const std::size_t n = m.weights.size();
    if (m.version == LlmcVersion::fp32) {
        if (std::fread(m.weights.data(), sizeof(float), n, f) != n)
            throw FileError(name + ": read error in the parameters");
    } else {
        std::vector<std::uint16_t> chunk(std::min<std::size_t>(n, std::size_t{1} << 20));
        for (std::size_t done = 0; done < n;) {
            const std::size_t k = std::min(chunk.size(), n - done);
            if (std::fread(chunk.data(), sizeof(std::uint16_t), k, f) != k)
                throw FileError(name + ": read error in the parameters");
            for (std::size_t i = 0; i < k; ++i) m.weights[done + i] = bfloat16_bits_to_float(chunk[i]);
            done += k;
        }
    }
    return m;
}

// Writes `weights` (fp32, GPTLayout(config) order) as an llm.c model file of
// the given version, atomically; bf16 values are rounded to nearest, ties to
// even. A config that makes no sense throws ConfigError, a wrong number of
// weights ShapeError, and neither leaves anything at `path`.
inline void write_llmc_model(const std::filesystem::path& path, const GPTConfig& config,
                             std::span<const float> weights, LlmcVersion version = LlmcVersion::fp32) {
    config.validate();
    const std::int64_t count = GPTLayout(config).total();
    if (static_cast<std::int64_t>(weights.size()) != count)
        throw ShapeError(path.string() + ": GPT weights: expected " + std::to_string(count) + " values, got " +
                         std::to_string(weights.size()));
    std::int32_t h[256] = {};
    h[0] = llmc_model_magic;
    h[1] = static_cast<std::int32_t>(version);
    h[2] = config.max_seq_len;
    h[3] = config.vocab_size;
    h[4] = config.n_layer;
    h[5] = config.n_head;
    h[6] = config.channels;
    h[7] = config.padded_vocab_size;
    atomic_write(path, [&](FileWriter& w) {
        w.write(h, sizeof h);
        if (version == LlmcVersion::fp32) {
            w.write(weights.data(), weights.size() * sizeof(float));
            return;
        }
        std::vector<std::uint16_t> chunk(std::min<std::size_t>(weights.size(), std::size_t{1} << 20));
        for (std::size_t done = 0; done < weights.size();) {
            const std::size_t k = std::min(chunk.size(), weights.size() - done);
            for (std::size_t i = 0; i < k; ++i) chunk[i] = float_to_bfloat16_bits(weights[done + i]);
            w.write(chunk.data(), k * sizeof(std::uint16_t));
            done += k;
        }
    });
}

}  // namespace snug::io
