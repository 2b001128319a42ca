// Data files and batches: llm.c token files (round trip, byte layout checked
// by hand, every corruption named), shards by glob, byte-level text files,
// the batch loader's windows and wrap-around, and the train/val split.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "snug/core/error.hpp"
#include "snug/data/loader.hpp"
#include "snug/data/text_file.hpp"
#include "snug/data/token_file.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

using snug::test::TempDir;

std::mt19937_64 fresh_rng() {
    std::random_device rd;
    return std::mt19937_64((static_cast<std::uint64_t>(rd()) << 32) | rd());
}

std::vector<std::int32_t> random_tokens(std::size_t n, int vocab, std::mt19937_64& rng) {
    std::uniform_int_distribution<int> d(0, vocab - 1);
    std::vector<std::int32_t> out(n);
    for (auto& t : out) t = d(rng);
    return out;
}

void write_bytes(const fs::path& p, const std::vector<unsigned char>& bytes) {
    std::ofstream f(p, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<unsigned char> read_bytes(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::vector<unsigned char>(std::istreambuf_iterator<char>(f), {});
}

void put_le32(std::vector<unsigned char>& b, std::size_t at, std::uint32_t v) {
    for (int i = 0; i < 4; ++i) b[at + static_cast<std::size_t>(i)] = static_cast<unsigned char>(v >> (8 * i));
}

// An llm.c token file built byte by byte, independently of write_token_file.
std::vector<unsigned char> token_file_bytes(const std::vector<std::int32_t>& tokens, std::int32_t magic = 20240520,
                                            std::int32_t version = 1) {
    std::vector<unsigned char> b(1024 + 2 * tokens.size(), 0);
    put_le32(b, 0, static_cast<std::uint32_t>(magic));
    put_le32(b, 4, static_cast<std::uint32_t>(version));
    put_le32(b, 8, static_cast<std::uint32_t>(tokens.size()));
    for (std::size_t i = 0; i < tokens.size(); ++i) {
        b[1024 + 2 * i] = static_cast<unsigned char>(tokens[i] & 0xff);
        b[1024 + 2 * i + 1] = static_cast<unsigned char>(tokens[i] >> 8);
    }
    return b;
}

}  // namespace

TEST_CASE("write_token_file writes llm.c's layout, and read_token_file reads it back") {
    TempDir dir;
    auto rng = fresh_rng();
    const auto tokens = random_tokens(3001, 50257, rng);
    const fs::path p = dir.path / "tokens.bin";
    snug::data::write_token_file(p, tokens);
    CHECK(read_bytes(p) == token_file_bytes(tokens));
    CHECK(snug::data::read_token_file(p, 50257) == tokens);
    // No temporary file is left behind.
    CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 1);
}

TEST_CASE("read_token_file reads a file built by hand, including ids at the top of uint16") {
    TempDir dir;
    auto rng = fresh_rng();
    auto tokens = random_tokens(500, 65536, rng);
    tokens[0] = 65535;
    tokens[1] = 0;
    const fs::path p = dir.path / "hand.bin";
    write_bytes(p, token_file_bytes(tokens));
    CHECK(snug::data::read_token_file(p, 65536) == tokens);
    write_bytes(p, token_file_bytes({}));
    CHECK(snug::data::read_token_file(p, 10).empty());
}

TEST_CASE("a corrupt token file is refused with the file and the problem named") {
    TempDir dir;
    auto rng = fresh_rng();
    const auto tokens = random_tokens(100, 1000, rng);
    const fs::path p = dir.path / "bad.bin";
    const std::string name = p.string();

    SECTION("missing") {
        CHECK_THROWS_AS(snug::data::read_token_file(p, 1000), snug::FileError);
        CHECK_THROWS_WITH(snug::data::read_token_file(p, 1000), Contains(name) && Contains("does not exist"));
    }
    SECTION("short header") {
        auto b = token_file_bytes(tokens);
        b.resize(100);
        write_bytes(p, b);
        CHECK_THROWS_AS(snug::data::read_token_file(p, 1000), snug::FileError);
        CHECK_THROWS_WITH(snug::data::read_token_file(p, 1000),
                          Contains(name) && Contains("short header") && Contains("100 bytes"));
    }
    SECTION("wrong magic") {
        write_bytes(p, token_file_bytes(tokens, 20240326));
        CHECK_THROWS_WITH(snug::data::read_token_file(p, 1000),
                          Contains(name) && Contains("magic") && Contains("20240326") && Contains("20240520"));
    }
    SECTION("wrong version") {
        write_bytes(p, token_file_bytes(tokens, 20240520, 2));
        CHECK_THROWS_WITH(snug::data::read_token_file(p, 1000), Contains(name) && Contains("version 2"));
    }
    SECTION("truncated") {
        auto b = token_file_bytes(tokens);
        b.pop_back();
        write_bytes(p, b);
        CHECK_THROWS_AS(snug::data::read_token_file(p, 1000), snug::FileError);
        CHECK_THROWS_WITH(snug::data::read_token_file(p, 1000),
                          Contains(name) && Contains("truncated") && Contains("1224 bytes") &&
                              Contains("1223 bytes"));
    }
    SECTION("trailing data") {
        auto b = token_file_bytes(tokens);
        b.push_back(0);
        b.push_back(0);
        write_bytes(p, b);
        CHECK_THROWS_WITH(snug::data::read_token_file(p, 1000),
                          Contains(name) && Contains("trailing data") && Contains("1226 bytes"));
    }
    SECTION("negative count") {
        auto b = token_file_bytes(tokens);
        put_le32(b, 8, 0xFFFFFFFFu);
        write_bytes(p, b);
        CHECK_THROWS_WITH(snug::data::read_token_file(p, 1000), Contains("negative token count -1"));
    }
    SECTION("id out of range") {
        auto bad = tokens;
        bad[37] = 1000;
        write_bytes(p, token_file_bytes(bad));
        CHECK_THROWS_AS(snug::data::read_token_file(p, 1000), snug::FileError);
        CHECK_THROWS_WITH(snug::data::read_token_file(p, 1000),
                          Contains(name) && Contains("token id 1000") && Contains("position 37") &&
                              Contains("vocabulary of 1000"));
        CHECK(snug::data::read_token_file(p, 1001) == bad);
    }
}

TEST_CASE("write_token_file refuses ids that do not fit uint16 and leaves the old file alone") {
    TempDir dir;
    const fs::path p = dir.path / "keep.bin";
    const std::vector<std::int32_t> good = {1, 2, 3};
    snug::data::write_token_file(p, good);
    const auto before = read_bytes(p);
    for (std::int32_t bad : {65536, -1}) {
        const std::vector<std::int32_t> tokens = {5, 6, bad, 7};
        CHECK_THROWS_AS(snug::data::write_token_file(p, tokens), snug::Error);
        CHECK_THROWS_WITH(snug::data::write_token_file(p, tokens),
                          Contains("token id " + std::to_string(bad)) && Contains("position 2"));
        CHECK(read_bytes(p) == before);
    }
    CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 1);
}

TEST_CASE("expand_glob lists shards sorted, read_token_shards concatenates them, no match is named") {
    TempDir dir;
    auto rng = fresh_rng();
    std::vector<std::vector<std::int32_t>> shards;
    // Written out of order: the result must still be sorted by name.
    for (int i : {2, 0, 1}) {
        shards.resize(3);
        shards[static_cast<std::size_t>(i)] = random_tokens(100 + 10 * static_cast<std::size_t>(i), 50257, rng);
        write_bytes(dir.path / ("train_00" + std::to_string(i) + ".bin"),
                    token_file_bytes(shards[static_cast<std::size_t>(i)]));
    }
    write_bytes(dir.path / "val_000.bin", token_file_bytes({1, 2, 3}));
    const std::string pattern = (dir.path / "train_*.bin").string();
    const auto paths = snug::data::expand_glob(pattern);
    REQUIRE(paths.size() == 3);
    for (int i = 0; i < 3; ++i)
        CHECK(paths[static_cast<std::size_t>(i)].filename() == "train_00" + std::to_string(i) + ".bin");
    std::vector<std::int32_t> expected;
    for (const auto& s : shards) expected.insert(expected.end(), s.begin(), s.end());
    CHECK(snug::data::read_token_shards(pattern, 50257) == expected);

    const std::string none = (dir.path / "test_*.bin").string();
    CHECK_THROWS_AS(snug::data::expand_glob(none), snug::FileError);
    CHECK_THROWS_WITH(snug::data::expand_glob(none), Contains(none) && Contains("no file matches"));
    CHECK_THROWS_WITH(snug::data::read_token_shards(none, 50257), Contains(none));
}

TEST_CASE("a text file's bytes are its tokens, an empty or missing file is an error") {
    TempDir dir;
    auto rng = fresh_rng();
    std::vector<unsigned char> bytes(4096);
    for (auto& b : bytes) b = static_cast<unsigned char>(rng());
    bytes[0] = 0;
    bytes[1] = 255;
    const fs::path p = dir.path / "text.txt";
    write_bytes(p, bytes);
    const auto tokens = snug::data::read_text_file(p);
    REQUIRE(tokens.size() == bytes.size());
    for (std::size_t i = 0; i < bytes.size(); ++i) CHECK(tokens[i] == static_cast<int>(bytes[i]));
    CHECK(snug::data::byte_vocab_size == 256);

    const fs::path empty = dir.path / "empty.txt";
    write_bytes(empty, {});
    CHECK_THROWS_AS(snug::data::read_text_file(empty), snug::FileError);
    CHECK_THROWS_WITH(snug::data::read_text_file(empty), Contains(empty.string()) && Contains("empty"));
    const fs::path missing = dir.path / "missing.txt";
    CHECK_THROWS_WITH(snug::data::read_text_file(missing), Contains(missing.string()) && Contains("does not exist"));
}

TEST_CASE("BatchLoader reads consecutive windows, targets shifted by one, and wraps") {
    // Token i has value i + 7, so a batch's first token gives its position.
    const int B = 3, T = 5;
    for (std::int64_t n : {16, 17, 30, 31, 32, 100}) {
        std::vector<std::int32_t> stream(static_cast<std::size_t>(n));
        for (std::int64_t i = 0; i < n; ++i) stream[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i + 7);
        snug::data::BatchLoader loader(stream, B, T, "train data");
        std::vector<std::int32_t> x(B * T), y(B * T);
        // Walk until the loader returns to position 0, recording each start.
        std::vector<std::int64_t> starts;
        for (int step = 0; step < 50; ++step) {
            const std::int64_t before = loader.position();
            loader.next(x.data(), y.data());
            const std::int64_t start = x[0] - 7;
            CHECK(start == before);
            for (int i = 0; i < B * T; ++i) {
                CHECK(x[static_cast<std::size_t>(i)] == start + i + 7);
                CHECK(y[static_cast<std::size_t>(i)] == start + i + 8);
                CHECK(y[static_cast<std::size_t>(i)] - 7 < n);  // never reads past the end
            }
            starts.push_back(start);
            if (loader.position() == 0) break;
        }
        INFO("stream of " << n);
        // Starts are 0, 15, 30, ... while a window of 16 fits: count by hand.
        std::int64_t fit = 0;
        while (fit * 15 + 16 <= n) ++fit;
        CHECK(static_cast<std::int64_t>(starts.size()) == fit);
        CHECK(loader.batches_per_epoch() == fit);
        for (std::size_t k = 0; k < starts.size(); ++k) CHECK(starts[k] == static_cast<std::int64_t>(k) * 15);
    }
}

TEST_CASE("BatchLoader's position saves and restores the data order") {
    auto rng = fresh_rng();
    const auto stream = random_tokens(1000, 256, rng);
    snug::data::BatchLoader loader(stream, 2, 8, "train data");
    std::vector<std::int32_t> x(16), y(16), x2(16), y2(16);
    for (int i = 0; i < 5; ++i) loader.next(x.data(), y.data());
    const std::int64_t saved = loader.position();
    CHECK(saved == 5 * 16);
    loader.next(x.data(), y.data());
    snug::data::BatchLoader resumed(stream, 2, 8, "train data");
    resumed.set_position(saved);
    resumed.next(x2.data(), y2.data());
    CHECK(x == x2);
    CHECK(y == y2);
    CHECK_THROWS_WITH(resumed.set_position(1000), Contains("train data") && Contains("position 1000"));
    CHECK_THROWS_AS(resumed.set_position(-1), snug::Error);
    // A position whose window does not fit wraps to the start.
    resumed.set_position(990);
    resumed.next(x2.data(), y2.data());
    CHECK(x2[0] == stream[0]);
}

TEST_CASE("a stream shorter than one batch is refused with the sizes named") {
    auto rng = fresh_rng();
    CHECK_THROWS_AS(snug::data::BatchLoader(random_tokens(100, 256, rng), 4, 256, "val data"), snug::Error);
    CHECK_THROWS_WITH(snug::data::BatchLoader(random_tokens(100, 256, rng), 4, 256, "val data"),
                      Contains("val data: 100 tokens is shorter than one batch of B*T+1 = 1025"));
    // Exactly one batch is enough; one token less is not.
    CHECK_NOTHROW(snug::data::BatchLoader(random_tokens(1025, 256, rng), 4, 256, "val data"));
    CHECK_THROWS_WITH(snug::data::BatchLoader(random_tokens(1024, 256, rng), 4, 256, "val data"),
                      Contains("1024 tokens"));
    CHECK_THROWS_AS(snug::data::BatchLoader(random_tokens(100, 256, rng), 0, 4, "val data"), snug::ConfigError);
}

TEST_CASE("split_train_val keeps the head for training and the tail for validation") {
    auto rng = fresh_rng();
    const auto stream = random_tokens(1000, 256, rng);
    const auto split = snug::data::split_train_val(stream, 0.1);
    REQUIRE(split.train.size() == 900);
    REQUIRE(split.val.size() == 100);
    CHECK(std::equal(split.train.begin(), split.train.end(), stream.begin()));
    CHECK(std::equal(split.val.begin(), split.val.end(), stream.begin() + 900));
    CHECK(snug::data::split_train_val(stream, 0.0555).val.size() == 56);  // rounded to nearest
    CHECK_THROWS_AS(snug::data::split_train_val(stream, 0.0), snug::ConfigError);
    CHECK_THROWS_AS(snug::data::split_train_val(stream, 1.0), snug::ConfigError);
    CHECK_THROWS_WITH(snug::data::split_train_val(stream, 1.5), Contains("1.5"));
    const std::vector<std::int32_t> tiny = {1, 2, 3};
    CHECK_THROWS_WITH(snug::data::split_train_val(tiny, 0.01), Contains("empty"));
    CHECK_THROWS_WITH(snug::data::split_train_val(tiny, 0.1, "text file notes.txt"),
                      Contains("text file notes.txt: cannot split its 3 tokens"));
}
