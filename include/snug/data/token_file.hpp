// llm.c token files: a header of 256 little-endian int32 (magic 20240520,
// version 1, token count at index 2, the rest zero) followed by the tokens as
// uint16. Reading checks every field and the exact file size; writing is
// atomic (temporary file, then rename). Shards are named by a glob pattern.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <glob.h>

#include "snug/core/error.hpp"
#include "snug/io/file.hpp"

namespace snug::data {

static_assert(std::endian::native == std::endian::little, "llm.c token files are little-endian");

inline constexpr std::int32_t token_file_magic = 20240520;
inline constexpr std::int32_t token_file_version = 1;
inline constexpr std::size_t token_file_header_bytes = 256 * sizeof(std::int32_t);

// The tokens of one llm.c token file, each checked to be < vocab_size.
// FileError names the file and the problem: missing, short header, wrong
// magic or version, size not matching the token count, an id out of range.
inline std::vector<std::int32_t> read_token_file(const std::filesystem::path& path, int vocab_size) {
    const std::string name = path.string();
    if (!std::filesystem::exists(path)) throw FileError(name + ": token file does not exist");
    const std::vector<unsigned char> bytes = io::read_file(path);
    if (bytes.size() < token_file_header_bytes)
        throw FileError(name + ": short header: " + std::to_string(bytes.size()) +
                        " bytes, an llm.c token file starts with a header of " +
                        std::to_string(token_file_header_bytes) + " bytes");
    std::int32_t header[256];
    std::memcpy(header, bytes.data(), token_file_header_bytes);
    if (header[0] != token_file_magic)
        throw FileError(name + ": wrong magic number " + std::to_string(header[0]) + " (expected " +
                        std::to_string(token_file_magic) + "): not an llm.c token file");
    if (header[1] != token_file_version)
        throw FileError(name + ": unsupported token file version " + std::to_string(header[1]) +
                        " (expected " + std::to_string(token_file_version) + ")");
    if (header[2] < 0)
        throw FileError(name + ": negative token count " + std::to_string(header[2]) + " in the header");
    const std::size_t count = static_cast<std::size_t>(header[2]);
    const std::size_t expected = token_file_header_bytes + count * sizeof(std::uint16_t);
    if (bytes.size() != expected)
        throw FileError(name + ": size mismatch: the header promises " + std::to_string(count) + " tokens, " +
                        std::to_string(expected) + " bytes in all, but the file has " +
                        std::to_string(bytes.size()) + " bytes (" +
                        (bytes.size() < expected ? "truncated" : "trailing data") + ")");
    std::vector<std::int32_t> tokens(count);
    const unsigned char* p = bytes.data() + token_file_header_bytes;
    for (std::size_t i = 0; i < count; ++i) {
        std::uint16_t id;
        std::memcpy(&id, p + 2 * i, sizeof id);
        if (static_cast<int>(id) >= vocab_size)
            throw FileError(name + ": token id " + std::to_string(id) + " at position " + std::to_string(i) +
                            " is out of range for a vocabulary of " + std::to_string(vocab_size));
        tokens[i] = id;
    }
    return tokens;
}

// Writes tokens (each 0..65535) as an llm.c token file, atomically. An id that
// does not fit uint16 throws snug::Error and leaves `path` untouched.
inline void write_token_file(const std::filesystem::path& path, std::span<const std::int32_t> tokens) {
    if (tokens.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
        throw Error(path.string() + ": " + std::to_string(tokens.size()) +
                    " tokens do not fit an llm.c token file (int32 count)");
    std::vector<std::uint16_t> ids(tokens.size());
    for (std::size_t i = 0; i < tokens.size(); ++i) {
        if (tokens[i] < 0 || tokens[i] > 65535)
            throw Error(path.string() + ": token id " + std::to_string(tokens[i]) + " at position " +
                        std::to_string(i) + " does not fit uint16");
        ids[i] = static_cast<std::uint16_t>(tokens[i]);
    }
    std::int32_t header[256] = {};
    header[0] = token_file_magic;
    header[1] = token_file_version;
    header[2] = static_cast<std::int32_t>(tokens.size());
    io::atomic_write(path, [&](io::FileWriter& w) {
        w.write(header, sizeof header);
        w.write(ids.data(), ids.size() * sizeof(std::uint16_t));
    });
}

// The files matching a POSIX glob pattern, sorted; FileError naming the
// pattern when nothing matches.
inline std::vector<std::filesystem::path> expand_glob(const std::string& pattern) {
    glob_t g{};
    const int rc = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &g);
    std::vector<std::filesystem::path> out;
    if (rc == 0)
        for (std::size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
    ::globfree(&g);
    if (rc == GLOB_NOMATCH) throw FileError("no file matches the pattern '" + pattern + "'");
    if (rc != 0) throw FileError("cannot expand the pattern '" + pattern + "' (read error or out of memory)");
    return out;
}

// All shards matching `pattern`, read in sorted order and concatenated.
inline std::vector<std::int32_t> read_token_shards(const std::string& pattern, int vocab_size) {
    std::vector<std::int32_t> all;
    for (const auto& path : expand_glob(pattern)) {
        std::vector<std::int32_t> part = read_token_file(path, vocab_size);
        all.insert(all.end(), part.begin(), part.end());
    }
    return all;
}

}  // namespace snug::data
