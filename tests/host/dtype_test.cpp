// snug::DType and snug::dtype_traits: names, sizes, parsing, and the numeric
// limits checked against constants known from the format definitions.
#include <catch2/catch.hpp>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <string>

#include "snug/core/dtype.hpp"

namespace {

using snug::bfloat16;
using snug::DType;
using snug::dtype_traits;
using snug::half;

// The limits of a floating-point format with `precision` significand bits and
// maximum exponent `emax`, computed in double from the definition.
double max_finite_of(int precision, int emax) {
    return std::ldexp(2.0 - std::ldexp(1.0, 1 - precision), emax);
}

}  // namespace

TEST_CASE("dtype: names and sizes of the run-time tags", "[dtype]") {
    CHECK(snug::dtype_name(DType::f32) == "f32");
    CHECK(snug::dtype_name(DType::f64) == "f64");
    CHECK(snug::dtype_name(DType::f16) == "f16");
    CHECK(snug::dtype_name(DType::bf16) == "bf16");
    CHECK(snug::dtype_name(DType::i32) == "i32");
    CHECK(snug::dtype_name(DType::u16) == "u16");
    CHECK(snug::dtype_name(DType::u8) == "u8");

    CHECK(snug::dtype_size(DType::f32) == 4);
    CHECK(snug::dtype_size(DType::f64) == 8);
    CHECK(snug::dtype_size(DType::f16) == 2);
    CHECK(snug::dtype_size(DType::bf16) == 2);
    CHECK(snug::dtype_size(DType::i32) == 4);
    CHECK(snug::dtype_size(DType::u16) == 2);
    CHECK(snug::dtype_size(DType::u8) == 1);

    CHECK(snug::dtype_is_float(DType::bf16));
    CHECK(snug::dtype_is_float(DType::f64));
    CHECK_FALSE(snug::dtype_is_float(DType::i32));
    CHECK_FALSE(snug::dtype_is_float(DType::u8));
}

TEST_CASE("dtype: every name parses back to its tag", "[dtype]") {
    for (DType t : snug::all_dtypes) {
        const std::string name(snug::dtype_name(t));
        INFO(name);
        CHECK(snug::parse_dtype(name) == t);
    }
    CHECK(snug::parse_dtype("fp32") == DType::f32);
    CHECK(snug::parse_dtype("float") == DType::f32);
    CHECK(snug::parse_dtype("fp16") == DType::f16);
    CHECK(snug::parse_dtype("half") == DType::f16);
    CHECK(snug::parse_dtype("bfloat16") == DType::bf16);
    CHECK(snug::parse_dtype("double") == DType::f64);
    CHECK(snug::parse_dtype("uint8") == DType::u8);
}

TEST_CASE("dtype: a bad name throws ConfigError naming it and the valid ones", "[dtype]") {
    for (const char* bad : {"f8", "F32", "", "bf16 ", "float128", "i64"}) {
        INFO("input: '" << bad << "'");
        try {
            (void)snug::parse_dtype(bad);
            FAIL("parse_dtype accepted a bad name");
        } catch (const snug::ConfigError& e) {
            const std::string what = e.what();
            CHECK(what.find(std::string("'") + bad + "'") != std::string::npos);
            CHECK(what.find("f32") != std::string::npos);
            CHECK(what.find("bf16") != std::string::npos);
            CHECK(what.find("u8") != std::string::npos);
        }
    }
    // ConfigError is a snug::Error, so a trainer catching snug::Error sees it.
    CHECK_THROWS_AS(snug::parse_dtype("nope"), snug::Error);
}

TEST_CASE("dtype_traits: tags, names and sizes agree with the run-time functions", "[dtype]") {
    STATIC_REQUIRE(snug::dtype_of<float> == DType::f32);
    STATIC_REQUIRE(snug::dtype_of<double> == DType::f64);
    STATIC_REQUIRE(snug::dtype_of<half> == DType::f16);
    STATIC_REQUIRE(snug::dtype_of<bfloat16> == DType::bf16);
    STATIC_REQUIRE(snug::dtype_of<std::int32_t> == DType::i32);
    STATIC_REQUIRE(snug::dtype_of<std::uint16_t> == DType::u16);
    STATIC_REQUIRE(snug::dtype_of<std::uint8_t> == DType::u8);

    STATIC_REQUIRE(dtype_traits<float>::size == sizeof(float));
    STATIC_REQUIRE(dtype_traits<double>::size == sizeof(double));
    STATIC_REQUIRE(dtype_traits<half>::size == 2);
    STATIC_REQUIRE(dtype_traits<bfloat16>::size == 2);
    STATIC_REQUIRE(dtype_traits<std::int32_t>::size == 4);
    STATIC_REQUIRE(dtype_traits<std::uint16_t>::size == 2);
    STATIC_REQUIRE(dtype_traits<std::uint8_t>::size == 1);

    STATIC_REQUIRE(dtype_traits<half>::name == "f16");
    STATIC_REQUIRE(dtype_traits<bfloat16>::name == "bf16");
    CHECK(dtype_traits<float>::name == snug::dtype_name(dtype_traits<float>::dtype));
    CHECK(dtype_traits<double>::name == snug::dtype_name(dtype_traits<double>::dtype));
    CHECK(dtype_traits<std::int32_t>::name == snug::dtype_name(DType::i32));
    CHECK(dtype_traits<std::uint16_t>::name == snug::dtype_name(DType::u16));
    CHECK(dtype_traits<std::uint8_t>::name == snug::dtype_name(DType::u8));
    CHECK(dtype_traits<half>::size == snug::dtype_size(DType::f16));
    CHECK(dtype_traits<bfloat16>::size == snug::dtype_size(DType::bf16));
}

TEST_CASE("dtype_traits: limits of the floating-point types", "[dtype]") {
    // Known constants, and the same from the format definitions in double.
    CHECK(dtype_traits<half>::max_finite == 65504.0f);
    CHECK(static_cast<double>(dtype_traits<half>::max_finite) == max_finite_of(11, 15));
    CHECK(dtype_traits<half>::lowest == -65504.0f);
    CHECK(dtype_traits<half>::epsilon == static_cast<float>(std::ldexp(1.0, -10)));
    CHECK(dtype_traits<half>::min_normal == static_cast<float>(std::ldexp(1.0, -14)));

    CHECK(dtype_traits<bfloat16>::max_finite == 3.38953139e38f);
    CHECK(static_cast<double>(dtype_traits<bfloat16>::max_finite) == max_finite_of(8, 127));
    CHECK(dtype_traits<bfloat16>::lowest == -3.38953139e38f);
    CHECK(dtype_traits<bfloat16>::epsilon == static_cast<float>(std::ldexp(1.0, -7)));
    CHECK(dtype_traits<bfloat16>::min_normal == FLT_MIN);

    CHECK(dtype_traits<float>::max_finite == FLT_MAX);
    CHECK(static_cast<double>(dtype_traits<float>::max_finite) == max_finite_of(24, 127));
    CHECK(dtype_traits<float>::lowest == -FLT_MAX);
    CHECK(dtype_traits<float>::epsilon == FLT_EPSILON);
    CHECK(dtype_traits<float>::epsilon == static_cast<float>(std::ldexp(1.0, -23)));
    CHECK(dtype_traits<float>::min_normal == FLT_MIN);

    CHECK(dtype_traits<double>::max_finite == DBL_MAX);
    CHECK(dtype_traits<double>::lowest == -DBL_MAX);
    CHECK(dtype_traits<double>::epsilon == DBL_EPSILON);
    CHECK(dtype_traits<double>::min_normal == DBL_MIN);

    // The limits are values of the type: they survive conversion, and the
    // stored bit patterns are the ones the format defines.
    CHECK(half(dtype_traits<half>::max_finite).bits == 0x7BFF);
    CHECK(half(dtype_traits<half>::lowest).bits == 0xFBFF);
    CHECK(half(1.0f + dtype_traits<half>::epsilon).bits == 0x3C01);
    CHECK(half(dtype_traits<half>::min_normal).bits == 0x0400);
    CHECK(bfloat16(dtype_traits<bfloat16>::max_finite).bits == 0x7F7F);
    CHECK(bfloat16(dtype_traits<bfloat16>::lowest).bits == 0xFF7F);
    CHECK(bfloat16(1.0f + dtype_traits<bfloat16>::epsilon).bits == 0x3F81);
    CHECK(bfloat16(dtype_traits<bfloat16>::min_normal).bits == 0x0080);
}

TEST_CASE("FloatStorage: float, half and bfloat16 only", "[dtype]") {
    STATIC_REQUIRE(snug::FloatStorage<float>);
    STATIC_REQUIRE(snug::FloatStorage<half>);
    STATIC_REQUIRE(snug::FloatStorage<bfloat16>);
    STATIC_REQUIRE_FALSE(snug::FloatStorage<double>);
    STATIC_REQUIRE_FALSE(snug::FloatStorage<std::int32_t>);
    STATIC_REQUIRE_FALSE(snug::FloatStorage<std::uint16_t>);
    STATIC_REQUIRE_FALSE(snug::FloatStorage<const float>);
}
