// llm.c's tokenizer file: decoding from a file this test builds byte by byte
// (versions 1 and 2), and every corruption named.
#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "snug/core/error.hpp"
#include "snug/data/tokenizer.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

using snug::test::TempDir;

void put_le32(std::vector<unsigned char>& b, std::size_t at, std::uint32_t v) {
    for (int i = 0; i < 4; ++i) b[at + static_cast<std::size_t>(i)] = static_cast<unsigned char>(v >> (8 * i));
}

std::vector<unsigned char> tokenizer_bytes(const std::vector<std::string>& vocab, std::uint32_t version,
                                           std::uint32_t eot, std::uint32_t magic = 20240328) {
    std::vector<unsigned char> b(1024, 0);
    put_le32(b, 0, magic);
    put_le32(b, 4, version);
    put_le32(b, 8, static_cast<std::uint32_t>(vocab.size()));
    put_le32(b, 12, eot);
    for (const std::string& s : vocab) {
        b.push_back(static_cast<unsigned char>(s.size()));
        b.insert(b.end(), s.begin(), s.end());
    }
    return b;
}

void write_bytes(const fs::path& p, const std::vector<unsigned char>& bytes) {
    std::ofstream f(p, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// A fresh random vocabulary: tokens of 1..255 random bytes (any byte value).
std::vector<std::string> random_vocab(int n) {
    std::random_device rd;
    std::mt19937 rng(rd());
    std::vector<std::string> v;
    for (int i = 0; i < n; ++i) {
        const int len = 1 + static_cast<int>(rng() % (i == 0 ? 255 : 12));
        std::string s;
        for (int j = 0; j < len; ++j) s.push_back(static_cast<char>(rng() & 0xff));
        v.push_back(s);
    }
    return v;
}

}  // namespace

TEST_CASE("Tokenizer decodes every token of a version-2 file built by hand") {
    TempDir dir;
    const auto vocab = random_vocab(300);
    const fs::path p = dir.path / "tok.bin";
    write_bytes(p, tokenizer_bytes(vocab, 2, 299));
    const snug::data::Tokenizer tok(p);
    CHECK(tok.vocab_size() == 300);
    REQUIRE(tok.eot_token().has_value());
    CHECK(*tok.eot_token() == 299);
    for (int i = 0; i < 300; ++i) CHECK(tok.decode(i) == vocab[static_cast<std::size_t>(i)]);
    const std::vector<std::int32_t> ids = {5, 0, 17, 5};
    CHECK(tok.decode(ids) == vocab[5] + vocab[0] + vocab[17] + vocab[5]);
    CHECK_THROWS_AS(tok.decode(300), snug::Error);
    CHECK_THROWS_WITH(tok.decode(300), Contains("token id 300") && Contains("vocabulary of 300"));
    CHECK_THROWS_WITH(tok.decode(-2), Contains("token id -2"));
}

TEST_CASE("a version-1 file has GPT-2's end-of-text token only at GPT-2's vocabulary size") {
    TempDir dir;
    const fs::path p = dir.path / "v1.bin";
    write_bytes(p, tokenizer_bytes({"a", "bc", "def"}, 1, 0));
    const snug::data::Tokenizer small(p);
    CHECK_FALSE(small.eot_token().has_value());
    CHECK(small.decode(2) == "def");
    std::vector<std::string> gpt2(50257, "x");
    gpt2[50256] = "<|endoftext|>";
    write_bytes(p, tokenizer_bytes(gpt2, 1, 0));
    const snug::data::Tokenizer big(p);
    REQUIRE(big.eot_token().has_value());
    CHECK(*big.eot_token() == 50256);
    CHECK(big.decode(50256) == "<|endoftext|>");
}

TEST_CASE("a corrupt tokenizer file is refused with the file and the problem named") {
    TempDir dir;
    const auto vocab = random_vocab(20);
    const fs::path p = dir.path / "bad.bin";
    const std::string name = p.string();
    SECTION("missing") {
        CHECK_THROWS_AS(snug::data::Tokenizer(p), snug::FileError);
        CHECK_THROWS_WITH(snug::data::Tokenizer(p), Contains(name) && Contains("does not exist"));
    }
    SECTION("short header") {
        auto b = tokenizer_bytes(vocab, 2, 19);
        b.resize(1000);
        write_bytes(p, b);
        CHECK_THROWS_WITH(snug::data::Tokenizer(p), Contains(name) && Contains("short header"));
    }
    SECTION("wrong magic") {
        write_bytes(p, tokenizer_bytes(vocab, 2, 19, 20240520));
        CHECK_THROWS_AS(snug::data::Tokenizer(p), snug::FileError);
        CHECK_THROWS_WITH(snug::data::Tokenizer(p), Contains("magic") && Contains("20240520") && Contains("20240328"));
    }
    SECTION("wrong version") {
        write_bytes(p, tokenizer_bytes(vocab, 3, 19));
        CHECK_THROWS_WITH(snug::data::Tokenizer(p), Contains(name) && Contains("version 3"));
    }
    SECTION("end-of-text token outside the vocabulary") {
        write_bytes(p, tokenizer_bytes(vocab, 2, 20));
        CHECK_THROWS_WITH(snug::data::Tokenizer(p), Contains("end-of-text token 20"));
    }
    SECTION("truncated inside a token") {
        auto b = tokenizer_bytes(vocab, 2, 19);
        b.pop_back();
        write_bytes(p, b);
        CHECK_THROWS_WITH(snug::data::Tokenizer(p), Contains(name) && Contains("truncated") && Contains("token 19"));
    }
    SECTION("truncated between tokens") {
        auto b = tokenizer_bytes(vocab, 2, 19);
        b.resize(b.size() - vocab[19].size() - 1);
        write_bytes(p, b);
        CHECK_THROWS_WITH(snug::data::Tokenizer(p), Contains("truncated") && Contains("before token 19 of 20"));
    }
    SECTION("empty token") {
        auto v = vocab;
        v[4] = "";
        write_bytes(p, tokenizer_bytes(v, 2, 19));
        CHECK_THROWS_WITH(snug::data::Tokenizer(p), Contains("token 4 has length 0"));
    }
    SECTION("trailing data") {
        auto b = tokenizer_bytes(vocab, 2, 19);
        b.push_back(1);
        b.push_back('z');
        write_bytes(p, b);
        CHECK_THROWS_WITH(snug::data::Tokenizer(p), Contains("2 bytes of trailing data"));
    }
}
