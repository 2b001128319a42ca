// The CUDA elementwise kernels (residual add, add in place, scale, every cast),
// GELU forward and backward, and the transfers, against the host kernels on
// fresh random inputs, outputs poisoned first. Sizes cover one element, less
// than one vector, a vector tail, and a large grid-strided n; pointers offset
// by one element take the unvectorised path. Calls are unqualified with the
// device tag first, as layers make them, so argument-dependent lookup is
// tested too. Runs only where a GPU exists.
//
// Tolerances: the add, scale and cast kernels compute one fp32 operation per
// element, as the host does, so they must give the same bits. GELU's
// exponential differs (CUDA's expf against the host's polynomial), and CUDA
// takes 1 / (1 + e) from a fast reciprocal (gelu.cuh), each a few fp32 ulp:
// fp32 results within 1e-5 of the host relative to |host| (forward) or
// |host| + 0.1 |dout| (backward: gelu' crosses zero, where only an absolute
// bound makes sense), 16-bit results within 1e-2 on the same scale (one
// 16-bit ulp).
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "snug/cuda/elementwise.cuh"
#include "snug/cuda/gelu.cuh"
#include "snug/cuda/transfer.cuh"
#include "snug/host/elementwise.hpp"
#include "snug/host/gelu.hpp"
#include "snug/host/transfer.hpp"
#include "snug/snug.hpp"
#include "support/cuda_support.hpp"

using snug::Cuda;
using snug::MemoryCategory;
using snug::MemoryTracker;
using namespace snug::test;

namespace {

// Element counts: one, less than a 128-bit vector of any type, a vector tail,
// and one large enough for the grid-stride loop (more than 4096 blocks * 256
// threads * 8 elements).
const std::int64_t sizes[] = {1, 3, 8, 4099, 9'000'003};

// Random bit patterns: every exponent, both signs, subnormals, infinities, NaNs.
template <class T>
std::vector<T> random_bits_vector(snug::Generator& rng, std::size_t n) {
    std::vector<T> out(n);
    for (T& x : out) {
        if constexpr (std::is_same_v<T, float>)
            x = std::bit_cast<float>(rng.next_u32());
        else
            x = T::from_bits(static_cast<std::uint16_t>(rng.next_u32()));
    }
    return out;
}

// Device scratch of n elements plus one, filled with 0xFF bytes (NaN in every
// float type); `offset` elements in, so that offset 1 misaligns the vectors.
template <class T>
struct DeviceArray {
    snug::Buffer<T, Cuda> buffer;
    std::size_t offset;
    T* data() { return buffer.data() + offset; }
};

template <class T>
DeviceArray<T> poisoned(MemoryTracker& tracker, std::size_t n, std::size_t offset) {
    DeviceArray<T> a{snug::Buffer<T, Cuda>(tracker, MemoryCategory::temporaries, n + 1, "scratch"), offset};
    snug::cuda::check(cudaMemset(a.buffer.data(), 0xFF, a.buffer.bytes()));
    return a;
}

template <class T>
DeviceArray<T> on_device(MemoryTracker& tracker, const std::vector<T>& host, std::size_t offset) {
    DeviceArray<T> a = poisoned<T>(tracker, host.size(), offset);
    snug::cuda::copy_to_device(a.data(), std::span<const T>(host));
    return a;
}

template <class T>
std::vector<T> to_host(DeviceArray<T>& a, std::size_t n) {
    std::vector<T> out(n);
    snug::cuda::copy_to_host(out.data(), a.data(), n);
    return out;
}

template <class T>
bool is_nan_value(T x) {
    return std::isnan(static_cast<float>(x));
}

template <class Dst, class Src>
void check_cast(snug::Generator& rng, const Cuda& dev, std::int64_t n, std::size_t offset) {
    INFO("cast " << (std::is_same_v<Src, float> ? "float" : std::is_same_v<Src, snug::half> ? "half" : "bfloat16")
                 << " -> "
                 << (std::is_same_v<Dst, float> ? "float" : std::is_same_v<Dst, snug::half> ? "half" : "bfloat16")
                 << ", n = " << n << ", offset " << offset);
    MemoryTracker tracker;
    const auto count = static_cast<std::size_t>(n);
    const auto in = random_bits_vector<Src>(rng, count);
    auto in_d = on_device(tracker, in, offset);
    auto out_d = poisoned<Dst>(tracker, count, offset);
    cast(dev, out_d.data(), in_d.data(), n);
    std::vector<Dst> out(count);
    snug::host::cast(snug::Host{}, out.data(), in.data(), n);
    check_same_bits(to_host(out_d, count), out, "out", NanMatch::any_nan);
}

}  // namespace

TEMPLATE_TEST_CASE("cuda residual_forward, add_inplace and scale_inplace give the host's bits", "[cuda][elementwise]",
                   float, snug::half, snug::bfloat16) {
    using T = TestType;
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    const snug::Host host;
    const Cuda dev{};
    for (const std::int64_t n : sizes) {
        for (const std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
            INFO("n = " << n << ", offset " << offset);
            const auto count = static_cast<std::size_t>(n);
            MemoryTracker tracker;
            const auto a = uniform_values<T>(rng, count, -4.0f, 4.0f);
            const auto b = uniform_values<T>(rng, count, -4.0f, 4.0f);
            auto a_d = on_device(tracker, a, offset);
            auto b_d = on_device(tracker, b, offset);
            auto out_d = poisoned<T>(tracker, count, offset);

            std::vector<T> out(count), acc = a, scaled = b;
            residual_forward(dev, out_d.data(), a_d.data(), b_d.data(), n);
            residual_forward(host, out.data(), a.data(), b.data(), n);
            check_same_bits(to_host(out_d, count), out, "residual_forward", NanMatch::any_nan);

            add_inplace(dev, a_d.data(), b_d.data(), n);
            add_inplace(host, acc.data(), b.data(), n);
            check_same_bits(to_host(a_d, count), acc, "add_inplace", NanMatch::any_nan);

            scale_inplace(dev, b_d.data(), n, -0.3f);
            scale_inplace(host, scaled.data(), n, -0.3f);
            check_same_bits(to_host(b_d, count), scaled, "scale_inplace", NanMatch::any_nan);

            // out may be one of the inputs.
            residual_forward(dev, a_d.data(), a_d.data(), b_d.data(), n);
            residual_forward(host, acc.data(), acc.data(), scaled.data(), n);
            check_same_bits(to_host(a_d, count), acc, "residual_forward in place", NanMatch::any_nan);
        }
    }
}

TEST_CASE("cuda cast gives the host's bits for every pair of types", "[cuda][elementwise]") {
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    const Cuda dev{};
    using snug::bfloat16;
    using snug::half;
    for (const std::int64_t n : {std::int64_t{1}, std::int64_t{7}, std::int64_t{4099}, std::int64_t{3'000'001}}) {
        for (const std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
            check_cast<float, float>(rng, dev, n, offset);
            check_cast<float, half>(rng, dev, n, offset);
            check_cast<float, bfloat16>(rng, dev, n, offset);
            check_cast<half, float>(rng, dev, n, offset);
            check_cast<half, half>(rng, dev, n, offset);
            check_cast<half, bfloat16>(rng, dev, n, offset);
            check_cast<bfloat16, float>(rng, dev, n, offset);
            check_cast<bfloat16, half>(rng, dev, n, offset);
            check_cast<bfloat16, bfloat16>(rng, dev, n, offset);
        }
    }
}

TEMPLATE_TEST_CASE("cuda gelu forward and backward match the host", "[cuda][gelu]", float, snug::half,
                   snug::bfloat16) {
    using T = TestType;
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    const snug::Host host;
    const Cuda dev{};
    for (const std::int64_t n : sizes) {
        for (const std::size_t offset : {std::size_t{0}, std::size_t{1}}) {
            INFO("n = " << n << ", offset " << offset);
            const auto count = static_cast<std::size_t>(n);
            MemoryTracker tracker;
            auto x = uniform_values<T>(rng, count, -8.0f, 8.0f);
            // The clamped tails, zero, a NaN, and x where 1 + e passes 2^126 (a
            // fast reciprocal's 0 there would make gelu 0, not about 1e-37 x).
            const float specials[] = {-100.0f, -20.0f, 0.0f, 20.0f, 100.0f, NAN, -10.01f, -10.03f, -10.05f};
            for (std::size_t i = 0; i < std::size(specials) && i < count; ++i) x[count - 1 - i] = T(specials[i]);
            const auto dout = uniform_values<T>(rng, count, -1.0f, 1.0f);
            auto x_d = on_device(tracker, x, offset);
            auto dout_d = on_device(tracker, dout, offset);
            auto out_d = poisoned<T>(tracker, count, offset);
            auto dinp_d = poisoned<T>(tracker, count, offset);

            std::vector<T> out(count), dinp(count);
            gelu_forward(dev, out_d.data(), x_d.data(), n);
            gelu_backward(dev, dinp_d.data(), x_d.data(), dout_d.data(), n);
            gelu_forward(host, out.data(), x.data(), n);
            gelu_backward(host, dinp.data(), x.data(), dout.data(), n);

            const auto out_dev = to_host(out_d, count), dinp_dev = to_host(dinp_d, count);
            std::vector<double> out_scale(count), dinp_scale(count);
            std::vector<T> out_cmp = out, dinp_cmp = dinp, out_dev_cmp = out_dev, dinp_dev_cmp = dinp_dev;
            std::size_t nan_mismatch = 0;
            for (std::size_t i = 0; i < count; ++i) {
                // A NaN input must give NaN on both sides; compare the rest.
                if (is_nan_value(x[i])) {
                    nan_mismatch += is_nan_value(out_dev[i]) && is_nan_value(dinp_dev[i]) ? 0 : 1;
                    out_cmp[i] = dinp_cmp[i] = out_dev_cmp[i] = dinp_dev_cmp[i] = T(0.0f);
                }
                out_scale[i] = std::abs(static_cast<double>(static_cast<float>(out_cmp[i])));
                dinp_scale[i] = std::abs(static_cast<double>(static_cast<float>(dinp_cmp[i]))) +
                                0.1 * std::abs(static_cast<double>(static_cast<float>(dout[i])));
            }
            CHECK(nan_mismatch == 0);
            check_close(out_dev_cmp, out_cmp, out_scale, tolerance<T>(), "gelu_forward");
            check_close(dinp_dev_cmp, dinp_cmp, dinp_scale, tolerance<T>(), "gelu_backward");

            // In place: dinp = inp (on a copy of the inputs), dinp = dout, and out = inp.
            auto x_copy_d = on_device(tracker, x, offset);
            gelu_backward(dev, x_copy_d.data(), x_copy_d.data(), dout_d.data(), n);
            check_same_bits(to_host(x_copy_d, count), dinp_dev, "gelu_backward in place of inp", NanMatch::any_nan);
            gelu_backward(dev, dout_d.data(), x_d.data(), dout_d.data(), n);
            gelu_forward(dev, x_d.data(), x_d.data(), n);
            check_same_bits(to_host(dout_d, count), dinp_dev, "gelu_backward in place", NanMatch::any_nan);
            check_same_bits(to_host(x_d, count), out_dev, "gelu_forward in place", NanMatch::any_nan);
        }
    }
}

TEST_CASE("cuda elementwise kernels refuse negative sizes and skip empty ones", "[cuda][elementwise]") {
    const Cuda dev{};
    float* none = nullptr;
    CHECK_THROWS_AS(residual_forward(dev, none, none, none, -1), snug::ShapeError);
    CHECK_THROWS_AS(gelu_forward(dev, none, none, -5), snug::ShapeError);
    CHECK_THROWS_AS(cast(dev, static_cast<snug::half*>(nullptr), none, -2), snug::ShapeError);
    // n = 0 touches nothing, so null pointers are fine.
    residual_forward(dev, none, none, none, 0);
    add_inplace(dev, none, none, 0);
    scale_inplace(dev, none, 0, 2.0f);
    gelu_backward(dev, none, none, none, 0);
    cast(dev, static_cast<snug::bfloat16*>(nullptr), none, 0);
    upload(dev, none, none, 0);
    download(dev, none, none, 0);
    copy(dev, none, none, 0);
    fill_zero(dev, none, 0);
    dev.synchronize();
    CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("cuda transfers: upload, download, copy and fill_zero on a stream", "[cuda][transfer]") {
    cudaStream_t stream = nullptr;
    snug::cuda::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const Cuda dev{.stream = stream};
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    MemoryTracker tracker;
    const std::int64_t n = 100'003;
    const auto count = static_cast<std::size_t>(n);
    const auto values = random_bits_vector<snug::bfloat16>(rng, count);
    snug::Buffer<snug::bfloat16, Cuda> a(tracker, MemoryCategory::temporaries, count, "a");
    snug::Buffer<snug::bfloat16, Cuda> b(tracker, MemoryCategory::temporaries, count, "b");
    // cudaMemset runs on the legacy stream, which a non-blocking stream does
    // not wait for: finish it before copying into b on `stream`.
    snug::cuda::check(cudaMemset(b.data(), 0xFF, b.bytes()));
    snug::cuda::check(cudaDeviceSynchronize());

    upload(dev, a.data(), values.data(), n);
    copy(dev, b.data(), a.data(), n);
    std::vector<snug::bfloat16> back(count, snug::bfloat16::from_bits(0x1234));
    download(dev, back.data(), b.data(), n);  // complete on return
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < count; ++i) wrong += back[i].bits == values[i].bits ? 0 : 1;
    CHECK(wrong == 0);

    // Zero a middle range; the rest stays.
    fill_zero(dev, b.data() + 10, n - 20);
    download(dev, back.data(), b.data(), n);
    wrong = 0;
    for (std::size_t i = 0; i < count; ++i) {
        const bool zeroed = i >= 10 && i < count - 10;
        wrong += back[i].bits == (zeroed ? 0 : values[i].bits) ? 0 : 1;
    }
    CHECK(wrong == 0);

    // The host backend's twins, called the same way, agree.
    std::vector<snug::bfloat16> host_copy(count);
    upload(snug::Host{}, host_copy.data(), values.data(), n);
    fill_zero(snug::Host{}, host_copy.data() + 10, n - 20);
    wrong = 0;
    for (std::size_t i = 0; i < count; ++i) wrong += back[i].bits == host_copy[i].bits ? 0 : 1;
    CHECK(wrong == 0);
    snug::cuda::check(cudaStreamDestroy(stream));
}
