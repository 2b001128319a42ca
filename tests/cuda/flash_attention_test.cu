// CUDA flash attention (snug/cuda/flash_attention.cuh) against a float64
// reference of the same algorithm written here (ops/flash_attention.hpp:
// 64-key tiles, rescaling at each tile, p and ds rounded to the activation
// type before the second products) and against the host kernel
// (snug/host/flash_attention.hpp, the same contract in fp32), on fresh random
// inputs with every output and the backward's scratch poisoned first, for
// float, bfloat16 and half. Both backwards start from the device's out and
// lse.
//
// Tolerances, relative to |reference| + rms(reference):
//   - lse and D (fp32 for every type), and fp32's out: 1e-5.
//   - fp32's dqkv: 3e-5. The backward's p = e^(s - lse) turns the scores'
//     absolute fp32 rounding (about 1e-6 for hs = 128 or 160) into a relative
//     error of every p; over 40 emulated runs of these shapes the worst was
//     8.4e-6.
//   - 16-bit out and dqkv: 4 units of roundoff (2 ulps: 2^-6 for bfloat16,
//     2^-9 for half). Each is rounded to 16 bits once (half a ulp, u), and a
//     p or ds whose fp32 value and float64 one straddle a rounding boundary
//     rounds one ulp (up to 2u) apart: in a sum of one term (dk and dv of the
//     last key) that is 3u. Over 40 runs the worst was 3.0u (half's dqkv).
//     The same tolerances hold against the host kernel.
//   - The rounding points themselves: a 16-bit out or dqkv element equals the
//     float64 value rounded to 16 bits unless the two straddle a rounding
//     boundary, so at least 95% of them must (elements of |value| below
//     1e-3 rms aside: a gradient that is 0 exactly in float64 is fp32 noise
//     on the device). The worst seen was 98.7%; with p and ds left unrounded
//     in the SIMT kernels, about 60%.
//
// The tensor-core shapes (hs = 16, 32, 48, 64, 128) run there for bfloat16 and
// half and in the SIMT kernels for float; the SIMT shapes (hs = 8, 24, 40,
// 160) run SIMT for every type. T = 1, 17, 64, 65 and 130 cover one row,
// partial tiles, a whole tile and three tiles. Grouped-query attention (KV
// key/value heads below NH: G = 2, 3 and 4 query heads a key/value head) runs
// both paths too. The backward must give the same bits on every run, and a
// bad shape throws ShapeError before launching (a tensor the tensor-core path
// cannot copy in 16-byte pieces, snug::Error).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "snug/cuda/flash_attention.cuh"
#include "snug/host/flash_attention.hpp"
#include "snug/ops/flash_attention.hpp"
#include "snug/snug.hpp"
#include "support/cuda_support.hpp"

using Catch::Matchers::Contains;
using snug::Cuda;
using snug::MemoryTracker;
using namespace snug::test;

namespace {

// KV key/value heads (0: NH, multi-head attention).
struct FlashSize {
    int B, T, C, NH, KV = 0;
    int kv() const { return KV == 0 ? NH : KV; }
    std::int64_t ld() const { return snug::ops::qkv_width(C, NH, kv()); }  // a row of qkv
};

std::size_t idx(std::int64_t i) { return static_cast<std::size_t>(i); }

// The contract's round(): to T and back (nothing for fp32).
template <class T>
double round_as(double x) {
    if constexpr (std::is_same_v<T, float>) {
        return x;
    } else {
        return static_cast<double>(static_cast<float>(T(static_cast<float>(x))));
    }
}

template <class T>
std::vector<double> as_doubles(const std::vector<T>& v) {
    std::vector<double> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<double>(static_cast<float>(v[i]));
    return out;
}

// ops/flash_attention.hpp in float64, written as plainly as possible: per
// row, the key tiles of flash_tile_k up to the diagonal, m, l, acc and the
// rounding of p exactly as the contract says. Query head h reads key/value
// head h / G.
template <class T>
struct Reference {
    const std::vector<T>& qkv;
    FlashSize z;
    int hs = z.C / z.NH;
    int G = z.NH / z.kv();
    double scale = 1.0 / std::sqrt(static_cast<double>(hs));

    // Where element d of part 0 (q, of query head h), 1 (k, of key/value
    // head h) or 2 (v, of key/value head h) of row t lies in qkv and dqkv.
    std::int64_t offset(int b, int t, int part, int h, int d) const {
        const std::int64_t head = part == 0 ? h : z.NH + std::int64_t{part - 1} * z.kv() + h;
        return (std::int64_t{b} * z.T + t) * z.ld() + head * hs + d;
    }
    double at(int b, int t, int part, int h, int d) const {
        return static_cast<double>(static_cast<float>(qkv[idx(offset(b, t, part, h, d))]));
    }
    double score(int b, int h, int t, int j) const {
        double dot = 0.0;
        for (int d = 0; d < hs; ++d) dot += at(b, t, 0, h, d) * at(b, j, 1, h / G, d);
        return scale * dot;
    }

    // out (B, T, C), lse (B, NH, T).
    void forward(std::vector<double>& out, std::vector<double>& lse) const {
        out.assign(idx(std::int64_t{z.B} * z.T * z.C), 0.0);
        lse.assign(idx(std::int64_t{z.B} * z.NH * z.T), 0.0);
        const int tile = snug::ops::flash_tile_k;
        for (int b = 0; b < z.B; ++b) {
            for (int h = 0; h < z.NH; ++h) {
                for (int t = 0; t < z.T; ++t) {
                    double m = -std::numeric_limits<double>::infinity(), l = 0.0;
                    std::vector<double> acc(idx(hs), 0.0);
                    for (int k0 = 0; k0 <= t; k0 += tile) {
                        const int k1 = std::min(k0 + tile, t + 1);
                        std::vector<double> s;
                        double next = m;
                        for (int j = k0; j < k1; ++j) {
                            s.push_back(score(b, h, t, j));
                            next = std::max(next, s.back());
                        }
                        const double alpha = std::exp(m - next);
                        l *= alpha;
                        for (double& a : acc) a *= alpha;
                        for (int j = k0; j < k1; ++j) {
                            const double p = std::exp(s[idx(j - k0)] - next);
                            l += p;
                            const double pr = round_as<T>(p);
                            for (int d = 0; d < hs; ++d) acc[idx(d)] += pr * at(b, j, 2, h / G, d);
                        }
                        m = next;
                    }
                    for (int d = 0; d < hs; ++d)
                        out[idx((std::int64_t{b} * z.T + t) * z.C + std::int64_t{h} * hs + d)] = acc[idx(d)] / l;
                    lse[idx((std::int64_t{b} * z.NH + h) * z.T + t)] = m + std::log(l);
                }
            }
        }
    }

    // dqkv (B, T, C + 2 KV hs) and D (B, NH, T) from dout and the forward's
    // out and lse (the device's, as its backward gets them).
    void backward(std::vector<double>& dqkv, std::vector<double>& D, const std::vector<T>& dout,
                  const std::vector<T>& out, const std::vector<float>& lse) const {
        dqkv.assign(idx(std::int64_t{z.B} * z.T * z.ld()), 0.0);
        D.assign(idx(std::int64_t{z.B} * z.NH * z.T), 0.0);
        const auto row = [&](int b, int t, int h) { return (std::int64_t{b} * z.T + t) * z.C + std::int64_t{h} * hs; };
        const auto grad = [&](int b, int t, int part, int h, int d) -> double& {
            return dqkv[idx(offset(b, t, part, h, d))];
        };
        for (int b = 0; b < z.B; ++b) {
            for (int h = 0; h < z.NH; ++h) {
                for (int t = 0; t < z.T; ++t) {
                    double sum = 0.0;
                    for (int d = 0; d < hs; ++d)
                        sum += to_double(dout[idx(row(b, t, h) + d)]) * to_double(out[idx(row(b, t, h) + d)]);
                    D[idx((std::int64_t{b} * z.NH + h) * z.T + t)] = sum;
                }
                for (int t = 0; t < z.T; ++t) {
                    const std::int64_t r = (std::int64_t{b} * z.NH + h) * z.T + t;
                    for (int j = 0; j <= t; ++j) {
                        const double p = std::exp(score(b, h, t, j) - static_cast<double>(lse[idx(r)]));
                        double dp = 0.0;
                        for (int d = 0; d < hs; ++d)
                            dp += to_double(dout[idx(row(b, t, h) + d)]) * at(b, j, 2, h / G, d);
                        const double ds = round_as<T>(p * (dp - D[idx(r)]));
                        const double pr = round_as<T>(p);
                        for (int d = 0; d < hs; ++d) {
                            grad(b, t, 0, h, d) += ds * at(b, j, 1, h / G, d);
                            grad(b, j, 1, h / G, d) += ds * at(b, t, 0, h, d);
                            grad(b, j, 2, h / G, d) += pr * to_double(dout[idx(row(b, t, h) + d)]);
                        }
                    }
                }
            }
        }
        for (int b = 0; b < z.B; ++b)
            for (int t = 0; t < z.T; ++t)
                for (int d = 0; d < hs; ++d) {
                    for (int h = 0; h < z.NH; ++h) grad(b, t, 0, h, d) *= scale;
                    for (int g = 0; g < z.kv(); ++g) grad(b, t, 1, g, d) *= scale;
                }
    }
};

// Four units of roundoff of the 16-bit types (2 ulps); fp32's `fp32`.
template <class T>
constexpr double rounded_tolerance(double fp32) {
    if constexpr (std::is_same_v<T, float>) {
        return fp32;
    } else if constexpr (std::is_same_v<T, snug::bfloat16>) {
        return 4.0 / 256.0;
    } else {
        return 4.0 / 2048.0;
    }
}

// dqkv's: a p or ds that rounds one way on the device and the other on the
// host moves the sums it enters by up to the same again (seen in CI at bf16,
// hs 128: 0.0159 against 4/256), so twice the 16-bit bound; fp32's unchanged.
template <class T>
constexpr double backward_tolerance() {
    return std::is_same_v<T, float> ? 3e-5 : 2.0 * rounded_tolerance<T>(3e-5);
}

// For 16-bit T: the fraction of device values equal to the float64 value
// rounded to T, among those of |value| >= 1e-3 rms, is at least 95%.
template <class T>
void check_mostly_rounded(const std::vector<T>& device, const std::vector<double>& ref, const std::string& what) {
    if constexpr (!std::is_same_v<T, float>) {
        REQUIRE(device.size() == ref.size());
        double sum_sq = 0.0;
        for (const double r : ref) sum_sq += r * r;
        const double floor = 1e-3 * std::sqrt(sum_sq / static_cast<double>(std::max<std::size_t>(ref.size(), 1)));
        std::size_t counted = 0, same = 0;
        for (std::size_t i = 0; i < ref.size(); ++i) {
            if (std::abs(ref[i]) < floor) continue;
            ++counted;
            same += bits_of(device[i]) == bits_of(T(static_cast<float>(ref[i]))) ? 1 : 0;
        }
        const double fraction = counted == 0 ? 1.0 : static_cast<double>(same) / static_cast<double>(counted);
        INFO(what << ": " << same << " of " << counted << " equal the float64 value rounded (" << fraction << ")");
        CHECK(fraction >= 0.95);
    } else {
        (void)device;
        (void)ref;
        (void)what;
    }
}

template <class T>
void check_flash(snug::Generator& rng, const FlashSize& z, bool tensor_cores) {
    INFO("B = " << z.B << ", T = " << z.T << ", C = " << z.C << ", NH = " << z.NH << ", KV = " << z.kv()
                << ", hs = " << z.C / z.NH);
    REQUIRE(snug::cuda::flash_attention_uses_tensor_cores<T>(z.C / z.NH) == tensor_cores);
    MemoryTracker tracker;
    const Cuda dev{};
    const auto bt = static_cast<std::size_t>(z.B) * static_cast<std::size_t>(z.T);
    const auto C = static_cast<std::size_t>(z.C);
    const auto ld = static_cast<std::size_t>(z.ld());
    const auto stats = static_cast<std::size_t>(snug::ops::flash_stat_elems(z.B, z.T, z.NH));
    // Scores of a few units: softmax rows neither flat nor one-hot.
    const auto qkv = random_values<T>(rng, bt * ld, -1.5f, 1.5f);
    const auto dout = random_values<T>(rng, bt * C, -1.0f, 1.0f);
    const Reference<T> ref{qkv, z};

    auto qkv_d = to_device(tracker, qkv);
    auto out_d = poisoned<T>(tracker, bt * C);
    auto lse_d = poisoned<float>(tracker, stats);
    snug::cuda::flash_attention_forward(dev, out_d.data(), lse_d.data(), qkv_d.data(), z.B, z.T, z.C, z.NH, z.kv());
    const auto out = to_host(out_d);
    const auto lse = to_host(lse_d);
    std::vector<double> ref_out, ref_lse;
    ref.forward(ref_out, ref_lse);
    check_close(as_doubles(out), ref_out, rounded_tolerance<T>(1e-5), "out");
    check_close(as_doubles(lse), ref_lse, 1e-5, "lse");
    check_mostly_rounded(out, ref_out, "out");
    const snug::Host host;
    std::vector<T> host_out(bt * C);
    std::vector<float> host_lse(stats);
    snug::host::flash_attention_forward(host, host_out.data(), host_lse.data(), qkv.data(), z.B, z.T, z.C, z.NH,
                                        z.kv());
    check_close(out, host_out, rounded_tolerance<T>(1e-5), "out against the host");
    check_close(lse, host_lse, 1e-5, "lse against the host");

    // The backward from the device's out and lse, on both sides; twice on the
    // device, which must give the same bits.
    auto dout_d = to_device(tracker, dout);
    std::vector<T> first_dqkv;
    std::vector<float> first_scratch;
    for (int run = 0; run < 2; ++run) {
        auto dqkv_d = poisoned<T>(tracker, bt * ld);
        auto scratch_d = poisoned<float>(tracker, stats);
        snug::cuda::flash_attention_backward(dev, dqkv_d.data(), scratch_d.data(), dout_d.data(), qkv_d.data(),
                                             out_d.data(), lse_d.data(), z.B, z.T, z.C, z.NH, z.kv());
        if (run == 0) {
            first_dqkv = to_host(dqkv_d);
            first_scratch = to_host(scratch_d);
        } else {
            check_same_bits(to_host(dqkv_d), first_dqkv, "dqkv, second run");
            check_same_bits(to_host(scratch_d), first_scratch, "scratch, second run");
        }
    }
    std::vector<double> ref_dqkv, ref_D;
    ref.backward(ref_dqkv, ref_D, dout, out, lse);
    check_close(as_doubles(first_scratch), ref_D, 1e-5, "D (scratch)");
    check_close(as_doubles(first_dqkv), ref_dqkv, backward_tolerance<T>(), "dqkv");
    check_mostly_rounded(first_dqkv, ref_dqkv, "dqkv");
    std::vector<T> host_dqkv(bt * ld);
    std::vector<float> host_D(stats);
    snug::host::flash_attention_backward(host, host_dqkv.data(), host_D.data(), dout.data(), qkv.data(), out.data(),
                                         lse.data(), z.B, z.T, z.C, z.NH, z.kv());
    check_close(first_scratch, host_D, 1e-5, "D against the host");
    check_close(first_dqkv, host_dqkv, backward_tolerance<T>(), "dqkv against the host");
}

}  // namespace

TEMPLATE_TEST_CASE("cuda flash attention at tensor-core head sizes matches its float64 reference",
                   "[cuda][flash_attention]", float, snug::bfloat16, snug::half) {
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    const bool mma = !std::is_same_v<TestType, float>;
    const FlashSize sizes[] = {
        {2, 1, 32, 2},     // T = 1, hs = 16
        {1, 17, 32, 2},    // hs = 16, one partial tile
        {2, 64, 96, 2},    // hs = 48 (the 64 kernel skipping its last channel step), one whole tile
        {1, 65, 64, 1},    // hs = 64, a second tile of one row
        {1, 130, 128, 1},  // hs = 128, three tiles, the last partial
        {2, 130, 128, 4},  // hs = 32, two sequences of four heads
    };
    for (const auto& z : sizes) check_flash<TestType>(rng, z, mma);
}

TEMPLATE_TEST_CASE("cuda flash attention at SIMT head sizes matches its float64 reference", "[cuda][flash_attention]",
                   float, snug::bfloat16, snug::half) {
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    const FlashSize sizes[] = {
        {1, 1, 8, 1},     // T = 1, hs = 8
        {2, 17, 48, 2},   // hs = 24
        {1, 65, 24, 3},   // hs = 8, three heads, two tiles
        {1, 130, 40, 1},  // hs = 40: a second, partial 32-channel pass; three tiles
        {1, 70, 160, 1},  // hs = 160 > 128: five passes
    };
    for (const auto& z : sizes) check_flash<TestType>(rng, z, false);
}

TEMPLATE_TEST_CASE("cuda flash attention with grouped-query heads matches its float64 reference",
                   "[cuda][flash_attention]", float, snug::bfloat16, snug::half) {
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    const bool mma = !std::is_same_v<TestType, float>;
    struct Case {
        FlashSize z;
        bool tensor_cores;  // for bfloat16 and half
    };
    const Case cases[] = {
        {{1, 70, 64, 4, 2}, true},    // hs = 16 (the 64 kernel skipping channel steps), G = 2, two tiles
        {{2, 70, 128, 4, 1}, true},   // hs = 32, G = 4: one key/value head a sequence
        {{1, 130, 256, 4, 2}, true},  // hs = 64 (the exact kernel), G = 2, three tiles
        {{1, 70, 48, 6, 2}, false},   // hs = 8, G = 3
        {{2, 17, 96, 4, 1}, false},   // hs = 24, G = 4, one partial tile
    };
    for (const auto& c : cases) check_flash<TestType>(rng, c.z, mma && c.tensor_cores);
}

TEMPLATE_TEST_CASE("cuda flash attention's tensor-core kernels match their reference in the shape each card takes",
                   "[cuda][flash_attention]", snug::bfloat16, snug::half) {
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    // T = 130: a second block of 128 query rows, walking two whole key tiles
    // before its diagonal; a key block walking a query tile after its
    // diagonal. One head of each size: the tolerances above were set on as
    // many elements (with more, a p or ds that rounds one way on the device
    // and the other on the host puts an element past them now and then, as
    // it did before the FlashAttention-2 reshape).
    const FlashSize sizes[] = {
        {1, 130, 64, 1},      // hs = 64
        {1, 130, 96, 1},      // hs = 96, the 128 kernel skipping its last channel steps
        {1, 130, 128, 1},     // hs = 128
        {1, 130, 256, 2, 1},  // hs = 128, two query heads of one key/value head: dK and dV walk both
    };
    // The launchers pick each backward kernel's shape by the card's shared
    // memory: on a GPU its own; emulated, an H200's (227 KiB per block: 8
    // warps, two stages) and an RTX 3090's (sm_86, 99 KiB: hs 128 takes 4
    // warps and one stage).
#if defined(SNUG_CUDA_EMULATED)
    using snug::cuda::emulated::set_device_limits;
    struct Restore {
        ~Restore() { set_device_limits({}); }
    } restore;
    for (const std::size_t optin : {std::size_t{227} << 10, std::size_t{99} << 10}) {
        set_device_limits({132, optin});
        INFO("emulated opt-in shared memory " << optin << " bytes");
        for (const auto& z : sizes) check_flash<TestType>(rng, z, true);
    }
#else
    for (const auto& z : sizes) check_flash<TestType>(rng, z, true);
#endif
}

TEST_CASE("cuda flash attention rejects bad sizes and misaligned tensors before launching",
          "[cuda][flash_attention]") {
    const Cuda dev{};
    float* f = nullptr;
    snug::bfloat16* h = nullptr;
    CHECK_THROWS_AS(snug::cuda::flash_attention_forward(dev, f, f, f, 2, 8, 50, 3), snug::ShapeError);
    CHECK_THROWS_WITH(snug::cuda::flash_attention_forward(dev, h, f, h, 2, 8, 50, 3),
                      Contains("flash_attention_forward") && Contains("C = 50") && Contains("NH = 3"));
    CHECK_THROWS_AS(snug::cuda::flash_attention_backward(dev, f, f, f, f, f, f, 2, 8, 48, 0), snug::ShapeError);
    CHECK_THROWS_WITH(snug::cuda::flash_attention_backward(dev, h, f, h, h, h, f, -1, 8, 48, 4), Contains("B = -1"));
    CHECK_THROWS_WITH(snug::cuda::flash_attention_forward(dev, f, f, f, 1 << 16, 1 << 16, 64, 1),
                      Contains("2^31 - 1"));
    // Grouped-query attention: NH must be a multiple of KV (KV > 0).
    CHECK_THROWS_AS(snug::cuda::flash_attention_forward(dev, f, f, f, 1, 8, 48, 4, 3), snug::ShapeError);
    CHECK_THROWS_WITH(snug::cuda::flash_attention_forward(dev, h, f, h, 1, 8, 64, 4, 3),
                      Contains("flash_attention_forward") && Contains("key/value heads"));
    CHECK_THROWS_AS(snug::cuda::flash_attention_backward(dev, h, f, h, h, h, f, 1, 8, 64, 4, 0), snug::ShapeError);
    CHECK_THROWS_WITH(snug::cuda::flash_attention_backward(dev, f, f, f, f, f, f, 1, 8, 48, 6, 4),
                      Contains("flash_attention_backward") && Contains("key/value heads"));
    // The kernels index a row of qkv with int: C + 2 KV hs = 3 * 2^30 channels is too wide.
    CHECK_THROWS_WITH(snug::cuda::flash_attention_forward(dev, f, f, f, 1, 1, 1 << 30, 1),
                      Contains("C + 2 KV hs") && Contains("2^31 - 1"));
    // The tensor-core path copies 16-byte pieces: a tensor one element off is refused, by name.
    MemoryTracker tracker;
    auto buf = poisoned<snug::bfloat16>(tracker, 3 * 64 + 8);
    auto stats = poisoned<float>(tracker, 4);  // B NH T
    snug::bfloat16* off = buf.data() + 1;
    CHECK_THROWS_WITH(snug::cuda::flash_attention_forward(dev, buf.data(), stats.data(), off, 1, 2, 32, 2),
                      Contains("flash_attention_forward: qkv") && Contains("not aligned to 16 bytes"));
    CHECK_THROWS_WITH(snug::cuda::flash_attention_forward(dev, off, stats.data(), buf.data(), 1, 2, 32, 2),
                      Contains("flash_attention_forward: out") && Contains("not aligned to 16 bytes"));
    CHECK_THROWS_WITH(snug::cuda::flash_attention_backward(dev, off, stats.data(), buf.data(), buf.data(),
                                                           buf.data(), stats.data(), 1, 2, 32, 2),
                      Contains("flash_attention_backward: dqkv") && Contains("not aligned to 16 bytes"));
    CHECK_THROWS_WITH(snug::cuda::flash_attention_backward(dev, buf.data(), stats.data(), off, buf.data(),
                                                           buf.data(), stats.data(), 1, 2, 32, 2),
                      Contains("flash_attention_backward: dout") && Contains("not aligned to 16 bytes"));
    // T = 0 or B = 0: nothing to launch.
    snug::cuda::flash_attention_forward(dev, f, f, f, 2, 0, 48, 4);
    snug::cuda::flash_attention_backward(dev, h, f, h, h, h, f, 0, 8, 48, 4);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
}
