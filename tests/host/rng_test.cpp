// Philox4x32-10 against Random123's published known-answer vectors, and the
// statistical and replay properties the layers rely on.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "snug/core/rng.hpp"

using snug::Philox4;

namespace {

struct Kat {
    Philox4 counter;
    std::uint32_t key0, key1;
    Philox4 expected;
};

}  // namespace

TEST_CASE("philox4x32_10 matches Random123's known-answer vectors") {
    // Random123 tests/kat_vectors, the three "philox4x32 10" lines: counter, key, result.
    const Kat kats[] = {
        {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
        {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}}, 0xffffffff, 0xffffffff,
         {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
        {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}}, 0xa4093822, 0x299f31d0,
         {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
    };
    for (const Kat& k : kats) {
        const Philox4 out = snug::philox4x32_10(k.counter, k.key0, k.key1);
        for (int i = 0; i < 4; ++i) CHECK(out.v[i] == k.expected.v[i]);
    }
}

TEST_CASE("random_bits is a pure function of (seed, offset, index)") {
    // Element i of a stream is word i % 4 of block i / 4.
    const Philox4 block = snug::random_block(42, 7, 3);
    for (std::uint64_t w = 0; w < 4; ++w) CHECK(snug::random_bits(42, 7, 12 + w) == block.v[w]);
    // Different seeds, offsets and indices give different streams.
    CHECK(snug::random_bits(42, 7, 12) != snug::random_bits(43, 7, 12));
    CHECK(snug::random_bits(42, 7, 12) != snug::random_bits(42, 8, 12));
    CHECK(snug::random_bits(42, 7, 12) != snug::random_bits(42, 7, 13));
    // 64-bit seeds and offsets use their high halves too.
    CHECK(snug::random_bits(1ull << 40, 0, 0) != snug::random_bits(0, 0, 0));
    CHECK(snug::random_bits(0, 1ull << 40, 0) != snug::random_bits(0, 0, 0));
}

TEST_CASE("uniform floats u lie in 0 <= u < 1 with the right mean and variance") {
    CHECK(snug::bits_to_uniform(0) == 0.0f);
    CHECK(snug::bits_to_uniform(0xffffffffu) < 1.0f);
    CHECK(snug::bits_to_uniform(0xffffffffu) == 1.0f - 1.0f / 16777216.0f);
    const int n = 200000;
    double sum = 0, sum2 = 0;
    for (int i = 0; i < n; ++i) {
        const double u = snug::random_uniform(5, 0, static_cast<std::uint64_t>(i));
        REQUIRE(u >= 0.0);
        REQUIRE(u < 1.0);
        sum += u;
        sum2 += u * u;
    }
    const double mean = sum / n, var = sum2 / n - mean * mean;
    // Standard error of the mean is sqrt(1/12/n) ~ 6.5e-4; allow 5 sigma.
    CHECK(std::abs(mean - 0.5) < 3.3e-3);
    CHECK(std::abs(var - 1.0 / 12.0) < 2e-3);
}

TEST_CASE("Generator replays from its saved position") {
    snug::Generator g(123, 4);
    for (int i = 0; i < 10; ++i) g.next_u32();
    const std::uint64_t saved = g.position();
    std::vector<std::uint32_t> first;
    for (int i = 0; i < 8; ++i) first.push_back(g.next_u32());
    snug::Generator h(123, 4);
    h.set_position(saved);
    for (std::uint32_t v : first) CHECK(h.next_u32() == v);
    // The sequence is the stream (seed, offset) read in order.
    snug::Generator k(123, 4);
    for (std::uint64_t i = 0; i < 6; ++i) CHECK(k.next_u32() == snug::random_bits(123, 4, i));
}

TEST_CASE("Generator::below is unbiased and in range, normal has unit variance") {
    snug::Generator g(9);
    std::vector<int> counts(7, 0);
    const int n = 70000;
    for (int i = 0; i < n; ++i) {
        const std::uint32_t r = g.below(7);
        REQUIRE(r < 7);
        ++counts[r];
    }
    for (int c : counts) CHECK(std::abs(c - n / 7) < 5 * std::sqrt(n / 7.0));  // 5 sigma
    double sum = 0, sum2 = 0;
    const int m = 100000;
    for (int i = 0; i < m; ++i) {
        const double x = g.normal();
        sum += x;
        sum2 += x * x;
    }
    CHECK(std::abs(sum / m) < 0.02);
    CHECK(std::abs(sum2 / m - 1.0) < 0.03);
}
