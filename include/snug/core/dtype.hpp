// Element types: the run-time tag snug::DType (names, sizes, parsing from a
// config string) and the compile-time snug::dtype_traits<T> that maps a C++
// element type to its tag and numeric limits; concept snug::FloatStorage.
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "snug/core/error.hpp"
#include "snug/core/half.hpp"

namespace snug {

// The element type of a tensor or of a file's payload, known at run time.
enum class DType : std::uint8_t { f32, f64, f16, bf16, i32, u16, u8 };

// Every DType, in declaration order.
inline constexpr std::array<DType, 7> all_dtypes{DType::f32, DType::f64, DType::f16, DType::bf16,
                                                 DType::i32, DType::u16, DType::u8};

// "f32", "f64", "f16", "bf16", "i32", "u16", "u8".
constexpr std::string_view dtype_name(DType t) {
    switch (t) {
        case DType::f32: return "f32";
        case DType::f64: return "f64";
        case DType::f16: return "f16";
        case DType::bf16: return "bf16";
        case DType::i32: return "i32";
        case DType::u16: return "u16";
        case DType::u8: return "u8";
    }
    return "?";
}

// Bytes per element.
constexpr std::size_t dtype_size(DType t) {
    switch (t) {
        case DType::f32: return 4;
        case DType::f64: return 8;
        case DType::f16: return 2;
        case DType::bf16: return 2;
        case DType::i32: return 4;
        case DType::u16: return 2;
        case DType::u8: return 1;
    }
    return 0;
}

// True for f32, f64, f16 and bf16.
constexpr bool dtype_is_float(DType t) {
    return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16;
}

// The DType named by `s`: a name from dtype_name, or one of the common
// spellings fp32/float32/float, fp64/float64/double, fp16/float16/half,
// bfloat16, int32, uint16, uint8 (exact, lower case). Anything else throws
// ConfigError naming the bad string and the valid names.
inline DType parse_dtype(std::string_view s) {
    static constexpr std::pair<std::string_view, DType> aliases[] = {
        {"fp32", DType::f32},      {"float32", DType::f32}, {"float", DType::f32},
        {"fp64", DType::f64},      {"float64", DType::f64}, {"double", DType::f64},
        {"fp16", DType::f16},      {"float16", DType::f16}, {"half", DType::f16},
        {"bfloat16", DType::bf16}, {"int32", DType::i32},   {"uint16", DType::u16},
        {"uint8", DType::u8},
    };
    for (DType t : all_dtypes) {
        if (s == dtype_name(t)) return t;
    }
    for (const auto& [alias, t] : aliases) {
        if (s == alias) return t;
    }
    std::string valid;
    for (DType t : all_dtypes) {
        if (!valid.empty()) valid += ", ";
        valid += dtype_name(t);
    }
    throw ConfigError("unknown dtype '" + std::string(s) + "' (valid: " + valid +
                      "; also fp32, fp16, bfloat16, ...)");
}

namespace detail {
template <class>
inline constexpr bool unsupported_dtype = false;
}  // namespace detail

// dtype_traits<T>: T's DType tag, name and size; for floating-point T also
//   compute_type  the type arithmetic on T is done in (float for the 16-bit types),
//   max_finite    the largest finite value, lowest = -max_finite,
//   epsilon       machine epsilon, the distance from 1 to the next value,
//   min_normal    the smallest positive normal value,
// all as compute_type values (each exactly representable in T).
// Only the element types snug stores are defined; any other T fails to compile.
template <class T>
struct dtype_traits {
    static_assert(detail::unsupported_dtype<T>,
                  "snug::dtype_traits<T>: T is not a snug element type; supported are float, "
                  "double, snug::half, snug::bfloat16, std::int32_t, std::uint16_t, std::uint8_t");
};

template <>
struct dtype_traits<float> {
    static constexpr DType dtype = DType::f32;
    static constexpr std::string_view name = "f32";
    static constexpr std::size_t size = 4;
    using compute_type = float;
    static constexpr float max_finite = std::numeric_limits<float>::max();
    static constexpr float lowest = -max_finite;
    static constexpr float epsilon = 0x1p-23f;
    static constexpr float min_normal = 0x1p-126f;
};

template <>
struct dtype_traits<double> {
    static constexpr DType dtype = DType::f64;
    static constexpr std::string_view name = "f64";
    static constexpr std::size_t size = 8;
    using compute_type = double;
    static constexpr double max_finite = std::numeric_limits<double>::max();
    static constexpr double lowest = -max_finite;
    static constexpr double epsilon = 0x1p-52;
    static constexpr double min_normal = 0x1p-1022;
};

template <>
struct dtype_traits<half> {
    static constexpr DType dtype = DType::f16;
    static constexpr std::string_view name = "f16";
    static constexpr std::size_t size = 2;
    using compute_type = float;
    static constexpr float max_finite = 65504.0f;  // 0x7BFF: (2 - 2^-10) * 2^15
    static constexpr float lowest = -max_finite;
    static constexpr float epsilon = 0x1p-10f;
    static constexpr float min_normal = 0x1p-14f;
};

template <>
struct dtype_traits<bfloat16> {
    static constexpr DType dtype = DType::bf16;
    static constexpr std::string_view name = "bf16";
    static constexpr std::size_t size = 2;
    using compute_type = float;
    static constexpr float max_finite = 0x1.FEp127f;  // 0x7F7F: (2 - 2^-7) * 2^127
    static constexpr float lowest = -max_finite;
    static constexpr float epsilon = 0x1p-7f;
    static constexpr float min_normal = 0x1p-126f;
};

template <>
struct dtype_traits<std::int32_t> {
    static constexpr DType dtype = DType::i32;
    static constexpr std::string_view name = "i32";
    static constexpr std::size_t size = 4;
};

template <>
struct dtype_traits<std::uint16_t> {
    static constexpr DType dtype = DType::u16;
    static constexpr std::string_view name = "u16";
    static constexpr std::size_t size = 2;
};

template <>
struct dtype_traits<std::uint8_t> {
    static constexpr DType dtype = DType::u8;
    static constexpr std::string_view name = "u8";
    static constexpr std::size_t size = 1;
};

// The DType tag of element type T (fails to compile for an unsupported T).
template <class T>
inline constexpr DType dtype_of = dtype_traits<T>::dtype;

// The floating-point types a training tensor may be stored in: fp32 and the
// two 16-bit storage types. The one float concept: the CUDA kernels and the
// host GEMM take these; the host references also take double (HostFloat).
template <class T>
concept FloatStorage = std::same_as<T, float> || std::same_as<T, half> || std::same_as<T, bfloat16>;

}  // namespace snug
