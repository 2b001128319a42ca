// CRC-32 as zlib, PNG and ISO-HDLC define it (reflected polynomial
// 0xEDB88320, initial value and final XOR 0xFFFFFFFF), slicing by 8 bytes:
// the checksum of snug's training-state files (train/state_file.hpp).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace snug::io {

namespace detail {

// CRC-32 tables for slicing by 8: crc32_tables[0] is the byte-at-a-time table;
// crc32_tables[k][b] the CRC contribution of byte b followed by k zero bytes.
constexpr std::array<std::array<std::uint32_t, 256>, 8> make_crc32_tables() {
    std::array<std::array<std::uint32_t, 256>, 8> t{};
    for (std::uint32_t b = 0; b < 256; ++b) {
        std::uint32_t c = b;
        for (int i = 0; i < 8; ++i) c = (c & 1u) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
        t[0][b] = c;
    }
    for (std::size_t k = 1; k < 8; ++k)
        for (std::size_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
    return t;
}
inline constexpr auto crc32_tables = make_crc32_tables();

}  // namespace detail

// CRC-32 (zlib / PNG), slicing by 8 bytes. Crc32::of("123456789", 9) == 0xCBF43926.
class Crc32 {
public:
    void update(const void* data, std::size_t n) noexcept {
        const auto* p = static_cast<const unsigned char*>(data);
        std::uint32_t c = state_;
        for (; n >= 8; n -= 8, p += 8) {
            const std::uint32_t lo = c ^ (std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 |
                                          std::uint32_t{p[2]} << 16 | std::uint32_t{p[3]} << 24);
            const std::uint32_t hi = std::uint32_t{p[4]} | std::uint32_t{p[5]} << 8 | std::uint32_t{p[6]} << 16 |
                                     std::uint32_t{p[7]} << 24;
            c = tables[7][lo & 0xff] ^ tables[6][(lo >> 8) & 0xff] ^ tables[5][(lo >> 16) & 0xff] ^
                tables[4][lo >> 24] ^ tables[3][hi & 0xff] ^ tables[2][(hi >> 8) & 0xff] ^
                tables[1][(hi >> 16) & 0xff] ^ tables[0][hi >> 24];
        }
        for (; n > 0; --n, ++p) c = tables[0][(c ^ *p) & 0xff] ^ (c >> 8);
        state_ = c;
    }
    std::uint32_t value() const noexcept { return state_ ^ 0xFFFFFFFFu; }

    static std::uint32_t of(const void* data, std::size_t n) noexcept {
        Crc32 c;
        c.update(data, n);
        return c.value();
    }

private:
    static constexpr const auto& tables = detail::crc32_tables;

    std::uint32_t state_ = 0xFFFFFFFFu;
};

}  // namespace snug::io
