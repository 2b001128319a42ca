// Test support for the CUDA-vs-host comparisons in tests/cuda: fresh seeds,
// random inputs, device copies in and out, outputs poisoned with NaN before a
// kernel runs, and the two comparisons (same bits; close within a tolerance,
// either relative to |host| + rms(host) or to a caller-given scale per element).
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "snug/snug.hpp"

namespace snug::test {

// A seed no earlier run used; tests print it so a failure can be replayed.
inline std::uint64_t fresh_seed() {
    std::random_device device;
    return (static_cast<std::uint64_t>(device()) << 32) ^ device();
}

template <class T>
double to_double(T x) {
    return static_cast<double>(static_cast<float>(x));
}

// n values uniform in [lo, hi), rounded to T, never zero.
template <class T>
std::vector<T> random_values(Generator& rng, std::size_t n, float lo, float hi) {
    std::vector<T> out(n);
    for (T& x : out) {
        do {
            x = T(lo + (hi - lo) * rng.uniform());
        } while (static_cast<float>(x) == 0.0f);
    }
    return out;
}

// n values uniform in [lo, hi), rounded to T (zero allowed).
template <class T>
std::vector<T> uniform_values(Generator& rng, std::size_t n, float lo, float hi) {
    std::vector<T> out(n);
    for (T& x : out) x = T(lo + (hi - lo) * rng.uniform());
    return out;
}

// Device memory holding a copy of `host`.
template <class T>
Buffer<T, Cuda> to_device(MemoryTracker& tracker, const std::vector<T>& host, const char* what = "test data") {
    Buffer<T, Cuda> d(tracker, MemoryCategory::temporaries, host.size(), what);
    cuda::copy_to_device(d.data(), std::span<const T>(host));
    return d;
}

// n elements of 0xFF bytes: NaN in every float type, so an element no kernel
// wrote fails every comparison. Complete on return, whatever stream runs next.
template <class T>
Buffer<T, Cuda> poisoned(MemoryTracker& tracker, std::size_t n, const char* what = "poisoned output") {
    Buffer<T, Cuda> d(tracker, MemoryCategory::temporaries, n, what);
    cuda::check(cudaMemset(d.data(), 0xFF, d.bytes()));
    cuda::check(cudaDeviceSynchronize());
    return d;
}

template <class T>
std::vector<T> to_host(const Buffer<T, Cuda>& d) {
    std::vector<T> out(d.size());
    cuda::copy_to_host(std::span<T>(out), d.data());
    return out;
}

// The bits of a float, half, bfloat16 or integer (an 8-bit code).
template <class T>
std::uint32_t bits_of(T x) {
    if constexpr (std::is_same_v<T, float>) {
        return std::bit_cast<std::uint32_t>(x);
    } else if constexpr (std::is_integral_v<T>) {
        return static_cast<std::uint32_t>(x);
    } else {
        return x.bits;
    }
}

// How check_same_bits treats NaN: `exact` wants the same NaN bits too;
// `any_nan` lets any NaN match any NaN (CUDA's half -> float keeps no
// canonical NaN, see core_test.cu).
enum class NanMatch { exact, any_nan };

template <class T>
void check_same_bits(const std::vector<T>& device, const std::vector<T>& host, const std::string& what,
                     NanMatch nan = NanMatch::exact) {
    REQUIRE(device.size() == host.size());
    std::size_t bad = 0;
    for (std::size_t i = 0; i < host.size(); ++i) {
        const bool both_nan = std::isnan(static_cast<float>(device[i])) && std::isnan(static_cast<float>(host[i]));
        const bool same = bits_of(device[i]) == bits_of(host[i]) || (nan == NanMatch::any_nan && both_nan);
        if (!same && ++bad <= 5) {
            FAIL_CHECK(what << "[" << i << "]: device " << static_cast<float>(device[i]) << " (0x" << std::hex
                            << bits_of(device[i]) << "), host " << static_cast<float>(host[i]) << " (0x"
                            << bits_of(host[i]) << std::dec << ")");
        }
    }
    CHECK(bad == 0);
}

// fp32: 1e-5; bfloat16 and half: 1e-2 (DESIGN.md).
template <class T>
constexpr double tolerance() {
    return std::is_same_v<T, float> ? 1e-5 : 1e-2;
}

// |device - host| <= tol * (|host| + rms(host)) elementwise: a relative error
// with a floor at the reference's root mean square, for elements near zero
// where cancellation leaves a pure relative error meaningless. A NaN fails.
template <class T>
void check_close(const std::vector<T>& device, const std::vector<T>& host, double tol, const std::string& what) {
    REQUIRE(device.size() == host.size());
    double sum_sq = 0.0;
    for (const T& h : host) sum_sq += to_double(h) * to_double(h);
    const double rms = std::sqrt(sum_sq / double(host.empty() ? 1 : host.size()));
    std::size_t bad = 0;
    double worst = 0.0;
    for (std::size_t i = 0; i < host.size(); ++i) {
        const double d = to_double(device[i]), h = to_double(host[i]);
        if (d == h) continue;
        const double err = std::abs(d - h) / (std::abs(h) + rms);
        if (!(err <= tol)) {
            if (++bad <= 5) {
                FAIL_CHECK(what << "[" << i << "]: device " << d << ", host " << h << " (error " << err << ")");
            }
        } else if (err > worst) {
            worst = err;
        }
    }
    INFO(what << ": worst error " << worst << " (tolerance " << tol << ")");
    CHECK(bad == 0);
}

// |device - host| <= tol * scale[i] for every i (a NaN fails), reporting the
// first few misses and the worst ratio.
template <class T>
void check_close(const std::vector<T>& device, const std::vector<T>& host, const std::vector<double>& scale,
                 double tol, const std::string& what) {
    REQUIRE(device.size() == host.size());
    REQUIRE(scale.size() == host.size());
    std::size_t bad = 0;
    double worst = 0.0;
    for (std::size_t i = 0; i < host.size(); ++i) {
        const double d = to_double(device[i]);
        const double h = to_double(host[i]);
        const double err = std::abs(d - h);
        if (!(err <= tol * scale[i])) {
            if (++bad <= 5) FAIL_CHECK(what << "[" << i << "]: device " << d << ", host " << h << ", scale " << scale[i]);
        } else if (scale[i] > 0.0) {
            worst = std::max(worst, err / scale[i]);
        }
    }
    INFO(what << ": worst error / scale " << worst << " (tolerance " << tol << ")");
    CHECK(bad == 0);
}

}  // namespace snug::test
