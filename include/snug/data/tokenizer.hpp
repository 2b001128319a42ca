// llm.c's GPT-2 tokenizer file, for decoding sampled token ids to text: a
// header of 256 little-endian uint32 (magic 20240328, version 1 or 2, vocab
// size, and in version 2 the end-of-text token), then for every token one
// uint8 length followed by that many bytes.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "snug/core/error.hpp"
#include "snug/io/file.hpp"

namespace snug::data {

static_assert(std::endian::native == std::endian::little, "llm.c tokenizer files are little-endian");

inline constexpr std::uint32_t tokenizer_file_magic = 20240328;

class Tokenizer {
public:
    // Reads and checks the whole file; FileError names the file and the
    // problem (missing, short header, magic, version, a vocabulary size the
    // file is too short to hold, a token running past the end, an empty token,
    // trailing bytes).
    explicit Tokenizer(const std::filesystem::path& path) {
        const std::string name = path.string();
        if (!std::filesystem::exists(path)) throw FileError(name + ": tokenizer file does not exist");
        const std::vector<unsigned char> bytes = io::read_file(path);
        constexpr std::size_t header_bytes = 256 * sizeof(std::uint32_t);
        if (bytes.size() < header_bytes)
            throw FileError(name + ": short header: " + std::to_string(bytes.size()) +
                            " bytes, an llm.c tokenizer file starts with a header of " +
                            std::to_string(header_bytes) + " bytes");
        std::uint32_t header[256];
        std::memcpy(header, bytes.data(), header_bytes);
        if (header[0] != tokenizer_file_magic)
            throw FileError(name + ": wrong magic number " + std::to_string(header[0]) + " (expected " +
                            std::to_string(tokenizer_file_magic) + "): not an llm.c tokenizer file");
        const std::uint32_t version = header[1];
        if (version != 1 && version != 2)
            throw FileError(name + ": unsupported tokenizer version " + std::to_string(version) +
                            " (expected 1 or 2)");
        if (header[2] == 0 || header[2] > (1u << 24))
            throw FileError(name + ": implausible vocabulary size " + std::to_string(header[2]));
        // Each token takes at least 2 bytes (its length and one byte): a
        // vocabulary the file cannot hold is refused before anything is sized by it.
        if (header[2] > (bytes.size() - header_bytes) / 2)
            throw FileError(name + ": truncated or corrupt header: a vocabulary of " + std::to_string(header[2]) +
                            " tokens needs at least " + std::to_string(2 * std::uint64_t{header[2]}) +
                            " bytes after the header, the file has " + std::to_string(bytes.size() - header_bytes));
        vocab_size_ = static_cast<int>(header[2]);
        if (version == 2) {
            if (header[3] >= header[2])
                throw FileError(name + ": end-of-text token " + std::to_string(header[3]) +
                                " is outside the vocabulary of " + std::to_string(header[2]));
            eot_ = static_cast<std::int32_t>(header[3]);
        } else if (vocab_size_ == 50257) {
            eot_ = 50256;  // version 1 files are GPT-2's, whose <|endoftext|> is the last id
        }
        offsets_.reserve(static_cast<std::size_t>(vocab_size_) + 1);
        offsets_.push_back(0);
        std::size_t at = header_bytes;
        for (int i = 0; i < vocab_size_; ++i) {
            if (at >= bytes.size())
                throw FileError(name + ": truncated: the file ends at byte " + std::to_string(bytes.size()) +
                                " before token " + std::to_string(i) + " of " + std::to_string(vocab_size_));
            const std::size_t len = bytes[at];
            if (len == 0) throw FileError(name + ": token " + std::to_string(i) + " has length 0");
            if (at + 1 + len > bytes.size())
                throw FileError(name + ": truncated: token " + std::to_string(i) + " of " +
                                std::to_string(vocab_size_) + " needs " + std::to_string(len) +
                                " bytes at offset " + std::to_string(at + 1) + " but the file has " +
                                std::to_string(bytes.size()) + " bytes");
            text_.append(reinterpret_cast<const char*>(bytes.data() + at + 1), len);
            offsets_.push_back(text_.size());
            at += 1 + len;
        }
        if (at != bytes.size())
            throw FileError(name + ": " + std::to_string(bytes.size() - at) + " bytes of trailing data after the " +
                            std::to_string(vocab_size_) + " tokens");
    }

    int vocab_size() const { return vocab_size_; }
    // The end-of-text token: from the header in version 2, 50256 for a
    // version-1 file of GPT-2's 50257 tokens, none otherwise.
    std::optional<std::int32_t> eot_token() const { return eot_; }

    // The bytes of one token (valid while the Tokenizer lives); snug::Error
    // naming the id and the vocabulary when it is out of range.
    std::string_view decode(std::int32_t id) const {
        if (id < 0 || id >= vocab_size_)
            throw Error("tokenizer: token id " + std::to_string(id) + " is outside the vocabulary of " +
                        std::to_string(vocab_size_));
        const auto i = static_cast<std::size_t>(id);
        return std::string_view(text_).substr(offsets_[i], offsets_[i + 1] - offsets_[i]);
    }

    // The concatenated bytes of a sequence of tokens.
    std::string decode(std::span<const std::int32_t> ids) const {
        std::string out;
        for (std::int32_t id : ids) out += decode(id);
        return out;
    }

private:
    int vocab_size_ = 0;
    std::optional<std::int32_t> eot_;
    std::string text_;                  // every token's bytes, back to back
    std::vector<std::size_t> offsets_;  // (vocab_size + 1) starts into text_
};

}  // namespace snug::data
