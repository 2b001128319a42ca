// Byte counts as people write them: parse_bytes("12GiB") reads budgets and
// flags, format_bytes(n) writes reports ("11.50 GiB"), and 12_GiB writes a
// count in code (snug::literals).
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <string_view>

#include "snug/core/error.hpp"

namespace snug {
namespace detail {

struct ByteUnit {
    std::string_view symbol;
    std::uint64_t multiplier;
};

// Decimal units are powers of 1000 (SI), binary units powers of 1024 (IEC).
inline constexpr std::array<ByteUnit, 13> byte_units{{
    {"B", 1},
    {"kB", 1000ull},
    {"MB", 1000ull * 1000},
    {"GB", 1000ull * 1000 * 1000},
    {"TB", 1000ull * 1000 * 1000 * 1000},
    {"PB", 1000ull * 1000 * 1000 * 1000 * 1000},
    {"EB", 1000ull * 1000 * 1000 * 1000 * 1000 * 1000},
    {"KiB", 1ull << 10},
    {"MiB", 1ull << 20},
    {"GiB", 1ull << 30},
    {"TiB", 1ull << 40},
    {"PiB", 1ull << 50},
    {"EiB", 1ull << 60},
}};

// Most digits accepted after the decimal point: 10^9 fits the exact
// integer arithmetic below, and 1e-9 GiB is already about one byte.
inline constexpr int max_fraction_digits = 9;

}  // namespace detail

// Reads a byte count:
//   size := digits ["." digits] [" "] [unit]
//   unit := B | kB | MB | GB | TB | PB | EB        (powers of 1000)
//         | KiB | MiB | GiB | TiB | PiB | EiB      (powers of 1024)
// Examples: "12GiB", "512MiB", "1.5GiB", "100MB", "11.50 GiB" (what
// format_bytes writes), "1024" (bytes). Units are case-sensitive, written as
// SI and IEC write them: "mb" or "GIB" is an error, not a guess (is "mb"
// megabits?). A fraction needs a unit larger than a byte and at most 9
// digits; the result is rounded to the nearest byte ("0.1KiB" -> 102).
// Anything else (empty, a sign, a space before or after, an unknown unit,
// a value past SIZE_MAX) throws snug::ConfigError naming the string.
inline std::size_t parse_bytes(std::string_view text) {
    auto fail = [text](std::string_view why) {
        return ConfigError("invalid byte size \"" + std::string(text) + "\": " + std::string(why) +
                           " (write e.g. 12GiB, 512MiB, 1.5GiB, 100MB or 1024)");
    };
    constexpr std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
    auto is_digit = [](char c) { return c >= '0' && c <= '9'; };

    std::size_t i = 0;
    std::uint64_t whole = 0;
    for (; i < text.size() && is_digit(text[i]); ++i) {
        auto d = static_cast<std::uint64_t>(text[i] - '0');
        if (whole > (max - d) / 10) throw fail("too large");
        whole = whole * 10 + d;
    }
    if (i == 0) throw fail("expected a number of bytes");

    std::uint64_t fraction = 0;  // the digits after the point, as an integer
    std::uint64_t fraction_scale = 1;  // 10^(number of those digits)
    int fraction_digits = 0;
    if (i < text.size() && text[i] == '.') {
        for (++i; i < text.size() && is_digit(text[i]); ++i) {
            if (fraction_digits == detail::max_fraction_digits)
                throw fail("more than 9 digits after the decimal point");
            fraction = fraction * 10 + static_cast<std::uint64_t>(text[i] - '0');
            fraction_scale *= 10;
            ++fraction_digits;
        }
        if (fraction_digits == 0) throw fail("expected digits after the decimal point");
    }

    bool spaced = false;
    if (i < text.size() && text[i] == ' ') {
        spaced = true;
        ++i;
    }
    std::string_view symbol = text.substr(i);
    std::uint64_t multiplier = 1;
    if (symbol.empty()) {
        if (spaced) throw fail("expected a unit after the space");
    } else {
        bool found = false;
        for (const auto& unit : detail::byte_units) {
            if (unit.symbol == symbol) {
                multiplier = unit.multiplier;
                found = true;
                break;
            }
        }
        if (!found)
            throw fail("unknown unit \"" + std::string(symbol) +
                       "\"; units are B, kB, MB, GB, TB, PB, EB (powers of 1000) and KiB, MiB, "
                       "GiB, TiB, PiB, EiB (powers of 1024), case-sensitive");
    }
    if (fraction_digits > 0 && multiplier == 1) throw fail("a fraction of a byte");

    if (whole != 0 && multiplier > max / whole) throw fail("too large");
    std::uint64_t total = whole * multiplier;
    if (fraction_digits > 0) {
        // fraction * multiplier / fraction_scale, exactly, rounded half up:
        // split multiplier = q * scale + r so that no product overflows
        // (fraction < scale <= 1e9, r < scale).
        std::uint64_t q = multiplier / fraction_scale;
        std::uint64_t r = multiplier % fraction_scale;
        std::uint64_t part = fraction * q + (fraction * r + fraction_scale / 2) / fraction_scale;
        if (part > max - total) throw fail("too large");
        total += part;
    }
    if constexpr (sizeof(std::size_t) < sizeof(std::uint64_t)) {
        if (total > std::numeric_limits<std::size_t>::max()) throw fail("too large for this platform");
    }
    return static_cast<std::size_t>(total);
}

// Writes a byte count for people: below 1 KiB exactly ("17 B"), above it
// in the largest binary unit that keeps the value at least 1, with two
// decimals ("11.50 GiB", "512.00 MiB").
inline std::string format_bytes(std::size_t bytes) {
    if (bytes < 1024) return std::to_string(bytes) + " B";
    constexpr std::array<const char*, 6> units{"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    std::size_t u = 0;
    double scale = 1024.0;
    while (u + 1 < units.size() && static_cast<double>(bytes) >= scale * 1024.0) {
        scale *= 1024.0;
        ++u;
    }
    double value = static_cast<double>(bytes) / scale;
    // Rounding to two decimals may give "1024.00": say 1.00 of the next unit.
    if (std::round(value * 100.0) >= 102400.0 && u + 1 < units.size()) {
        value /= 1024.0;
        ++u;
    }
    std::array<char, 48> text{};
    std::snprintf(text.data(), text.size(), "%.2f %s", value, units[u]);
    return text.data();
}

// Byte counts in code, as the flags write them: 12_GiB, 512_MiB, 4_KiB
// (using namespace snug::literals). A count past SIZE_MAX does not compile
// where the value is needed at compile time.
namespace literals {
namespace detail {
consteval std::size_t scaled(unsigned long long n, int shift) {
    if (n > (std::numeric_limits<std::size_t>::max() >> shift)) throw "byte count past SIZE_MAX";
    return static_cast<std::size_t>(n) << shift;
}
}  // namespace detail
consteval std::size_t operator""_KiB(unsigned long long n) { return detail::scaled(n, 10); }
consteval std::size_t operator""_MiB(unsigned long long n) { return detail::scaled(n, 20); }
consteval std::size_t operator""_GiB(unsigned long long n) { return detail::scaled(n, 30); }
}  // namespace literals

}  // namespace snug
