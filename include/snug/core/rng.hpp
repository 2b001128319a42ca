// Counter-based random numbers (Philox4x32-10): the same (seed, offset, index)
// gives the same bits on the host and on the device, with no state to carry.
// That is what lets a checkpointed layer replay its dropout mask exactly.
#pragma once

#include <cmath>
#include <cstdint>

#include "snug/core/config.hpp"

namespace snug {

// Four 32-bit words: one Philox counter block or one output block.
struct Philox4 {
    std::uint32_t v[4];
};

namespace detail {

// Multiplier and Weyl key increment of Philox4x32 (Salmon et al., SC'11).
inline constexpr std::uint32_t philox_m0 = 0xD2511F53u;
inline constexpr std::uint32_t philox_m1 = 0xCD9E8D57u;
inline constexpr std::uint32_t philox_w0 = 0x9E3779B9u;
inline constexpr std::uint32_t philox_w1 = 0xBB67AE85u;

SNUG_HD void philox_round(Philox4& c, std::uint32_t k0, std::uint32_t k1) {
    const std::uint64_t p0 = static_cast<std::uint64_t>(philox_m0) * c.v[0];
    const std::uint64_t p1 = static_cast<std::uint64_t>(philox_m1) * c.v[2];
    const auto hi0 = static_cast<std::uint32_t>(p0 >> 32), lo0 = static_cast<std::uint32_t>(p0);
    const auto hi1 = static_cast<std::uint32_t>(p1 >> 32), lo1 = static_cast<std::uint32_t>(p1);
    c = Philox4{{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
}

}  // namespace detail

// Philox4x32 with 10 rounds: a bijection of the 128-bit counter under a
// 64-bit key. Matches Random123's known-answer vectors (tests/host/rng_test.cpp).
SNUG_HD Philox4 philox4x32_10(Philox4 counter, std::uint32_t key0, std::uint32_t key1) {
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            key0 += detail::philox_w0;
            key1 += detail::philox_w1;
        }
        detail::philox_round(counter, key0, key1);
    }
    return counter;
}

// The block of four words that holds elements 4·block .. 4·block+3 of the
// stream (seed, offset). A kernel thread that handles four consecutive
// elements calls this once.
SNUG_HD Philox4 random_block(std::uint64_t seed, std::uint64_t offset, std::uint64_t block) {
    const Philox4 counter{{static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(block >> 32),
                           static_cast<std::uint32_t>(offset), static_cast<std::uint32_t>(offset >> 32)}};
    return philox4x32_10(counter, static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32));
}

// 32 random bits for element `index` of the stream (seed, offset).
SNUG_HD std::uint32_t random_bits(std::uint64_t seed, std::uint64_t offset, std::uint64_t index) {
    return random_block(seed, offset, index >> 2).v[index & 3];
}

// Maps 32 random bits to a float in [0, 1) with 24 bits of resolution; exact
// integer arithmetic, so it is bit-identical on host and device.
SNUG_HD float bits_to_uniform(std::uint32_t bits) {
    return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

SNUG_HD float random_uniform(std::uint64_t seed, std::uint64_t offset, std::uint64_t index) {
    return bits_to_uniform(random_bits(seed, offset, index));
}

// A sequential generator for host-side work (weight initialisation, data
// sampling): a (seed, offset) stream read in order. Its state is two numbers,
// so a checkpoint saves it exactly.
class Generator {
public:
    explicit Generator(std::uint64_t seed, std::uint64_t offset = 0) : seed_(seed), offset_(offset) {}

    std::uint32_t next_u32() { return random_bits(seed_, offset_, index_++); }
    // Uniform in [0, 1).
    float uniform() { return bits_to_uniform(next_u32()); }
    // Uniform integer in [0, n) for n > 0, by rejection (no modulo bias).
    std::uint32_t below(std::uint32_t n) {
        const std::uint32_t limit = static_cast<std::uint32_t>(-n) % n;  // 2^32 mod n
        for (;;) {
            const std::uint32_t r = next_u32();
            const std::uint64_t m = static_cast<std::uint64_t>(r) * n;
            if (static_cast<std::uint32_t>(m) >= limit) return static_cast<std::uint32_t>(m >> 32);
        }
    }
    // Standard normal by Box-Muller in double (host only: libm results are not
    // promised bit-identical to the device's).
    float normal() {
        const double u1 = (static_cast<double>(next_u32()) + 1.0) / 4294967296.0;  // (0, 1]
        const double u2 = static_cast<double>(next_u32()) / 4294967296.0;          // [0, 1)
        return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
    }

    std::uint64_t seed() const { return seed_; }
    std::uint64_t offset() const { return offset_; }
    // Position in the stream: how many 32-bit draws were taken.
    std::uint64_t position() const { return index_; }
    void set_position(std::uint64_t index) { index_ = index; }

private:
    std::uint64_t seed_;
    std::uint64_t offset_;
    std::uint64_t index_ = 0;
};

}  // namespace snug
