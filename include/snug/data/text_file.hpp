// Byte-level text: any file's bytes as tokens 0..255 (vocab 256), so a model
// trains on a text file with no tokenizer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "snug/core/error.hpp"
#include "snug/io/file.hpp"

namespace snug::data {

inline constexpr int byte_vocab_size = 256;

// The file's bytes as tokens; FileError when it cannot be read or is empty.
inline std::vector<std::int32_t> read_text_file(const std::filesystem::path& path) {
    if (!std::filesystem::exists(path)) throw FileError(path.string() + ": text file does not exist");
    const std::vector<unsigned char> bytes = io::read_file(path);
    if (bytes.empty()) throw FileError(path.string() + ": text file is empty, there is nothing to train on");
    return std::vector<std::int32_t>(bytes.begin(), bytes.end());
}

}  // namespace snug::data
