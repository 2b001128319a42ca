// Host elementwise kernels (residual_forward, add_inplace, scale_inplace, cast)
// and the shared helpers of snug/host/math.hpp (acc_t, load/store with
// round-to-nearest-even, parallel_ranges, the size check). References: double
// arithmetic (a sum or product of two floats is exact in double, so rounding it
// to float is the correctly rounded answer), 16-bit values decoded from their
// bits by formula, and rounding judged by the two neighbouring 16-bit values.
#include "snug/host/elementwise.hpp"

#include <atomic>
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "snug/host/math.hpp"

namespace {

using snug::bfloat16;
using snug::half;
using snug::host::acc_t;
using snug::host::Device;

static_assert(std::is_same_v<acc_t<float>, float>);
static_assert(std::is_same_v<acc_t<double>, double>);
static_assert(std::is_same_v<acc_t<half>, float>);
static_assert(std::is_same_v<acc_t<bfloat16>, float>);

template <class T>
std::uint16_t bits_of(T v) {
    return v.bits;
}

// The value of a half from its bits, by the IEEE formula.
double half_value(std::uint16_t b) {
    const int sign = (b >> 15) != 0 ? -1 : 1;
    const int e = (b >> 10) & 0x1F;
    const int m = b & 0x3FF;
    if (e == 0x1F) return m != 0 ? std::numeric_limits<double>::quiet_NaN() : sign * std::numeric_limits<double>::infinity();
    if (e == 0) return sign * std::ldexp(m, -24);
    return sign * std::ldexp(1024 + m, e - 25);
}

// The value of a bfloat16 from its bits, by the IEEE formula (8-bit exponent).
double bf16_value(std::uint16_t b) {
    const int sign = (b >> 15) != 0 ? -1 : 1;
    const int e = (b >> 7) & 0xFF;
    const int m = b & 0x7F;
    if (e == 0xFF) return m != 0 ? std::numeric_limits<double>::quiet_NaN() : sign * std::numeric_limits<double>::infinity();
    if (e == 0) return sign * std::ldexp(m, -133);
    return sign * std::ldexp(128 + m, e - 134);
}

template <class T>
double value16(std::uint16_t b) {
    if constexpr (std::is_same_v<T, half>) {
        return half_value(b);
    } else {
        return bf16_value(b);
    }
}

// True when the finite 16-bit value with bits `b` is the round-to-nearest-even
// image of x: no neighbour (b - 1, b + 1 in magnitude) is nearer, and on a tie
// the mantissa of b is even.
template <class T>
bool is_rne(double x, std::uint16_t b) {
    const double v = value16<T>(b);
    const std::uint16_t mag = b & 0x7FFF;
    const std::uint16_t sign = b & 0x8000;
    const double d = std::fabs(x - v);
    const std::uint16_t max_finite = std::is_same_v<T, half> ? 0x7BFF : 0x7F7F;
    for (int step : {-1, 1}) {
        const int nm = mag + step;
        if (nm < 0 || nm > max_finite) continue;
        // Stepping below +0 in magnitude means the other sign's smallest value.
        const double nv = value16<T>(static_cast<std::uint16_t>(sign | nm));
        const double nd = std::fabs(x - nv);
        if (nd < d) return false;
        if (nd == d && (b & 1) != 0) return false;
    }
    return true;
}

std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float scale = 1.0F) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> dist(0.0F, scale);
    std::vector<float> v(n);
    for (auto& x : v) {
        do {
            x = dist(gen);
        } while (x == 0.0F);
    }
    return v;
}

template <class T>
std::vector<T> rounded(const std::vector<float>& v) {
    std::vector<T> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) out[i] = T(v[i]);
    return out;
}

template <class T>
std::vector<float> widened(const std::vector<T>& v) {
    std::vector<float> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<float>(v[i]);
    return out;
}

}  // namespace

// ---- math.hpp ------------------------------------------------------------------

TEST_CASE("store rounds to nearest even on 16-bit, load widens exactly", "[math]") {
    using snug::host::load;
    using snug::host::store;
    half h{};
    store(&h, 1.0F + 0x1p-11F);  // halfway between 1 and 1 + 2^-10: even is 1
    CHECK(h.bits == 0x3C00);
    store(&h, 1.0F + 3 * 0x1p-11F);  // halfway between 1 + 2^-10 and 1 + 2^-9: even is the upper
    CHECK(h.bits == 0x3C02);
    store(&h, 1.0F + 0x1p-11F + 0x1p-20F);  // just above the tie: up
    CHECK(h.bits == 0x3C01);
    CHECK(load(&h) == 1.0F + 0x1p-10F);

    bfloat16 b{};
    store(&b, 1.0F + 0x1p-8F);  // tie between 1 and 1 + 2^-7
    CHECK(b.bits == 0x3F80);
    store(&b, 1.0F + 3 * 0x1p-8F);
    CHECK(b.bits == 0x3F82);
    store(&b, -(1.0F + 0x1p-8F + 0x1p-20F));
    CHECK(b.bits == 0xBF81);
    CHECK(load(&b) == -(1.0F + 0x1p-7F));

    double d = 0.0;
    store(&d, 0.1);
    CHECK(d == 0.1);  // double stays double
    float f = 0.0F;
    store(&f, 0.1F);
    CHECK(f == 0.1F);
}

TEST_CASE("parallel_ranges covers every index exactly once", "[math]") {
    for (std::int64_t n : {0, 1, 7, 1000, 100003}) {
        for (std::int64_t grain : {1, 10, 4096, 1000000}) {
            std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
            std::atomic<int> calls{0};
            std::atomic<int> empty{0};
            // (No Catch2 assertion inside the tasks: they may run on other threads.)
            snug::host::parallel_ranges(n, grain, [&](std::int64_t b, std::int64_t e) {
                ++calls;
                if (b >= e) ++empty;
                for (std::int64_t i = b; i < e; ++i) ++hits[static_cast<std::size_t>(i)];
            });
            int wrong = 0;
            for (auto& h : hits) wrong += h.load() != 1;
            CHECK(wrong == 0);
            CHECK(empty.load() == 0);
            if (n > 0 && n < 2 * grain) CHECK(calls.load() == 1);
        }
    }
}

TEST_CASE("negative sizes throw ShapeError naming the value", "[elementwise]") {
    const Device dev;
    float x = 1.0F;
    CHECK_THROWS_AS(snug::host::residual_forward(dev, &x, &x, &x, -1), snug::ShapeError);
    CHECK_THROWS_AS(snug::host::add_inplace(dev, &x, &x, -5), snug::ShapeError);
    CHECK_THROWS_AS(snug::host::scale_inplace(dev, &x, -2, 2.0F), snug::ShapeError);
    CHECK_THROWS_WITH(snug::host::cast(dev, &x, &x, -3), Catch::Contains("n = -3"));
    // n = 0 touches nothing.
    snug::host::residual_forward<float>(dev, nullptr, nullptr, nullptr, 0);
}

// ---- residual_forward / add_inplace / scale_inplace ------------------------------

TEST_CASE("residual_forward and add_inplace: float is the correctly rounded sum", "[elementwise]") {
    const Device dev;
    // Large enough for the parallel path (elementwise_grain is 2^18).
    for (std::int64_t n : {std::int64_t{1}, std::int64_t{37}, std::int64_t{1001}, (std::int64_t{1} << 19) + 3}) {
        const auto a = random_floats(static_cast<std::size_t>(n), 1, 3.0F);
        const auto b = random_floats(static_cast<std::size_t>(n), 2, 0.01F);
        std::vector<float> out(a.size(), std::numeric_limits<float>::quiet_NaN());
        snug::host::residual_forward(dev, out.data(), a.data(), b.data(), n);
        std::vector<float> dst = a;
        snug::host::add_inplace(dev, dst.data(), b.data(), n);
        std::size_t bad = 0;
        for (std::size_t i = 0; i < a.size(); ++i) {
            const float ref = static_cast<float>(static_cast<double>(a[i]) + static_cast<double>(b[i]));
            bad += (out[i] != ref) + (dst[i] != ref);
        }
        CHECK(bad == 0);
    }
}

TEST_CASE("residual_forward may write over an input", "[elementwise]") {
    const Device dev;
    const auto a = random_floats(301, 3);
    const auto b = random_floats(301, 4);
    std::vector<float> out(301);
    snug::host::residual_forward(dev, out.data(), a.data(), b.data(), 301);
    std::vector<float> inplace = a;
    snug::host::residual_forward(dev, inplace.data(), inplace.data(), b.data(), 301);
    CHECK(inplace == out);
}

TEST_CASE("residual_forward and add_inplace in double", "[elementwise]") {
    const Device dev;
    std::vector<double> a{0.1, -2.5, 1e-300, 3.0}, b{0.2, 1.25, 1e-300, -1.0};
    std::vector<double> out(4);
    snug::host::residual_forward(dev, out.data(), a.data(), b.data(), 4);
    CHECK(out == std::vector<double>{0.1 + 0.2, -1.25, 2e-300, 2.0});
    snug::host::add_inplace(dev, a.data(), b.data(), 4);
    CHECK(a == out);
}

TEMPLATE_TEST_CASE("16-bit residual_forward / add_inplace / scale_inplace = float kernel on the rounded inputs, "
                   "rounded once to nearest even",
                   "[elementwise]", half, bfloat16) {
    const Device dev;
    const std::int64_t n = 4099;
    const auto a16 = rounded<TestType>(random_floats(n, 5, 2.0F));
    const auto b16 = rounded<TestType>(random_floats(n, 6, 0.05F));
    const auto a = widened(a16);
    const auto b = widened(b16);

    std::vector<float> sum(n);
    snug::host::residual_forward(dev, sum.data(), a.data(), b.data(), n);
    std::vector<TestType> out16(n);
    snug::host::residual_forward(dev, out16.data(), a16.data(), b16.data(), n);
    std::vector<TestType> acc16 = a16;
    snug::host::add_inplace(dev, acc16.data(), b16.data(), n);
    std::vector<float> scaled = a;
    snug::host::scale_inplace(dev, scaled.data(), n, 0.3F);
    std::vector<TestType> scaled16 = a16;
    snug::host::scale_inplace(dev, scaled16.data(), n, 0.3F);

    std::size_t bad = 0;
    std::size_t not_rne = 0;
    for (std::int64_t i = 0; i < n; ++i) {
        bad += bits_of(out16[i]) != bits_of(TestType(sum[i]));
        bad += bits_of(acc16[i]) != bits_of(TestType(sum[i]));
        bad += bits_of(scaled16[i]) != bits_of(TestType(scaled[i]));
        // The exact sum of two 16-bit values is a float (no rounding there), so
        // the stored value must be its round-to-nearest-even image.
        not_rne += !is_rne<TestType>(static_cast<double>(a[i]) + b[i], out16[i].bits);
    }
    CHECK(bad == 0);
    CHECK(not_rne == 0);
}

TEST_CASE("16-bit residual ties go to even", "[elementwise]") {
    const Device dev;
    // 1 + 2^-11 lies halfway between the halves 1 and 1 + 2^-10.
    const std::vector<half> a{half(1.0F), half(1.0F + 0x1p-10F), half(-1.0F)};
    const std::vector<half> b{half(0x1p-11F), half(0x1p-11F), half(-0x1p-11F)};
    std::vector<half> out(3);
    snug::host::residual_forward(dev, out.data(), a.data(), b.data(), 3);
    CHECK(out[0].bits == 0x3C00);  // down to the even 1
    CHECK(out[1].bits == 0x3C02);  // up to the even 1 + 2^-9
    CHECK(out[2].bits == 0xBC00);
}

TEST_CASE("scale_inplace: float is the correctly rounded product", "[elementwise]") {
    const Device dev;
    const std::int64_t n = 777;
    const auto x0 = random_floats(n, 7, 10.0F);
    std::vector<float> x = x0;
    const float s = 0.123456F;
    snug::host::scale_inplace(dev, x.data(), n, s);
    std::size_t bad = 0;
    for (std::int64_t i = 0; i < n; ++i) {
        bad += x[i] != static_cast<float>(static_cast<double>(x0[i]) * static_cast<double>(s));
    }
    CHECK(bad == 0);
}

// ---- cast ----------------------------------------------------------------------

TEMPLATE_TEST_CASE("cast 16-bit -> float/double is exact for every bit pattern", "[cast]", half, bfloat16) {
    const Device dev;
    std::vector<TestType> all(65536);
    for (std::uint32_t i = 0; i < 65536; ++i) all[i] = TestType::from_bits(static_cast<std::uint16_t>(i));
    std::vector<float> f(65536);
    std::vector<double> d(65536);
    snug::host::cast(dev, f.data(), all.data(), 65536);
    snug::host::cast(dev, d.data(), all.data(), 65536);
    std::size_t bad = 0;
    for (std::uint32_t i = 0; i < 65536; ++i) {
        const double ref = value16<TestType>(static_cast<std::uint16_t>(i));
        if (std::isnan(ref)) {
            bad += !std::isnan(f[i]) + !std::isnan(d[i]);
        } else {
            bad += (static_cast<double>(f[i]) != ref) + (d[i] != ref);
        }
    }
    CHECK(bad == 0);
}

TEMPLATE_TEST_CASE("cast float -> 16-bit rounds to nearest even (midpoints and near-midpoints)", "[cast]", half,
                   bfloat16) {
    const Device dev;
    const std::uint16_t max_finite = std::is_same_v<TestType, half> ? 0x7BFF : 0x7F7F;
    // For each pair of consecutive positive finite values: the midpoint, and
    // the floats either side of it, with both signs.
    std::vector<float> in;
    for (std::uint32_t k = 0; k < max_finite; k += 7) {
        const double lo = value16<TestType>(static_cast<std::uint16_t>(k));
        const double hi = value16<TestType>(static_cast<std::uint16_t>(k + 1));
        const auto mid = static_cast<float>((lo + hi) / 2);  // exact in float
        for (float x : {mid, std::nextafter(mid, 0.0F), std::nextafter(mid, 1e30F), static_cast<float>(lo)}) {
            in.push_back(x);
            in.push_back(-x);
        }
    }
    std::vector<TestType> out(in.size());
    snug::host::cast(dev, out.data(), in.data(), static_cast<std::int64_t>(in.size()));
    std::size_t not_rne = 0;
    for (std::size_t i = 0; i < in.size(); ++i) not_rne += !is_rne<TestType>(in[i], out[i].bits);
    CHECK(not_rne == 0);

    // Beyond the largest finite value plus half an ulp: infinity.
    const float big = std::is_same_v<TestType, half> ? 65520.0F : 3.4e38F;
    std::vector<float> over{big, -big, std::numeric_limits<float>::infinity()};
    std::vector<TestType> o(3);
    snug::host::cast(dev, o.data(), over.data(), 3);
    CHECK(is_inf(o[0]));
    CHECK(is_inf(o[1]));
    CHECK((o[1].bits & 0x8000) != 0);
    CHECK(is_inf(o[2]));
}

TEST_CASE("cast between the 16-bit types rounds once, double -> float rounds once", "[cast]") {
    const Device dev;
    std::vector<half> all(65536);
    for (std::uint32_t i = 0; i < 65536; ++i) all[i] = half::from_bits(static_cast<std::uint16_t>(i));
    std::vector<bfloat16> b(65536);
    snug::host::cast(dev, b.data(), all.data(), 65536);
    std::size_t bad = 0;
    for (std::uint32_t i = 0; i < 65536; ++i) {
        const double v = half_value(static_cast<std::uint16_t>(i));
        if (std::isnan(v)) {
            bad += !is_nan(b[i]);
        } else if (std::isinf(v)) {
            bad += !is_inf(b[i]);
        } else {
            bad += !is_rne<bfloat16>(v, b[i].bits);
        }
    }
    CHECK(bad == 0);

    // bfloat16 -> half: exact when representable, infinity past 65504.
    std::vector<bfloat16> src{bfloat16(1.5F), bfloat16(70000.0F), bfloat16(-0.0F)};
    std::vector<half> dst(3);
    snug::host::cast(dev, dst.data(), src.data(), 3);
    CHECK(dst[0].bits == 0x3E00);
    CHECK(is_inf(dst[1]));
    CHECK(dst[2].bits == 0x8000);

    std::vector<double> d{0.1, 1.0 + 0x1p-24, 1.0 + 0x1p-24 + 0x1p-40, -3.0};
    std::vector<float> f(4);
    snug::host::cast(dev, f.data(), d.data(), 4);
    CHECK(f[0] == 0.1F);
    CHECK(f[1] == 1.0F);                // tie: even
    CHECK(f[2] == 1.0F + 0x1p-23F);     // above the tie
    CHECK(f[3] == -3.0F);
    std::vector<float> same(4);
    snug::host::cast(dev, same.data(), f.data(), 4);
    CHECK(same == f);
}
