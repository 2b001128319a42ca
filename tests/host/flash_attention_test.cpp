// The host flash attention (snug/host/flash_attention.hpp) against references
// written here: a textbook double softmax (out, lse) and central finite
// differences of it (the backward, in double); the same tiled algorithm with
// the contract's rounding points, as straightforward double loops (16-bit);
// and the materialised host attention (float and 16-bit). Also: the same bits
// from run to run and for any thread count, empty shapes, bad shapes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "snug/core/error.hpp"
#include "snug/core/half.hpp"
#include "snug/host/attention.hpp"
#include "snug/host/flash_attention.hpp"
#include "support/host_support.hpp"

namespace {

using snug::bfloat16;
using snug::half;
using snug::host::Device;
using snug::test::to_double;

constexpr int tile_q = snug::ops::flash_tile_q;
constexpr int tile_k = snug::ops::flash_tile_k;

// KV key/value heads (0: NH, multi-head attention); query head h reads key
// and value head h / (NH / KV).
struct Shape {
    int B, T, C, NH;
    int KV = 0;
    int kv() const { return KV > 0 ? KV : NH; }
    int hs() const { return C / NH; }
    std::size_t width() const { return std::size_t(C) + 2 * std::size_t(kv()) * hs(); }  // of a row of qkv
    std::size_t qkv() const { return std::size_t(B) * T * width(); }
    std::size_t out() const { return std::size_t(B) * T * C; }
    std::size_t stats() const { return std::size_t(B) * NH * T; }
    std::size_t q_at(int b, int t, int part, int h) const {  // first element of q, k or v that query head h reads
        const std::size_t row = (std::size_t(b) * T + t) * width();
        if (part == 0) return row + std::size_t(h) * hs();
        const std::size_t g = std::size_t(h / (NH / kv()));
        return row + C + std::size_t(part - 1) * kv() * hs() + g * hs();
    }
    std::size_t o_at(int b, int t, int h) const { return (std::size_t(b) * T + t) * C + std::size_t(h) * hs(); }
    std::size_t s_at(int b, int h, int t) const { return (std::size_t(b) * NH + h) * T + t; }
    std::string str() const { return fmt::format("B={} T={} C={} NH={} KV={} (hs={})", B, T, C, NH, kv(), hs()); }
};

template <class T>
using stat_t = snug::ops::flash_stat_t<T>;

template <class T>
T nan_value() {
    if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
        return T::from_bits(0x7FFF);
    } else {
        return std::numeric_limits<T>::quiet_NaN();
    }
}

template <class T>
std::vector<double> widen(const std::vector<T>& v) {
    std::vector<double> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) out[i] = to_double(v[i]);
    return out;
}

double dot(const double* a, const double* b, int n) {
    double sum = 0.0;
    for (int i = 0; i < n; ++i) sum += a[i] * b[i];
    return sum;
}

// ---- the textbook definition, in double ----

// out[b, t, h] = sum_j softmax_j(q_t . k_j / sqrt(hs), j <= t) v_j and
// lse[b, h, t] = log sum_j e^(q_t . k_j / sqrt(hs)).
void softmax_reference(std::vector<double>& out, std::vector<double>& lse, const std::vector<double>& qkv,
                       const Shape& s) {
    const int hs = s.hs();
    const double scale = 1.0 / std::sqrt(double(hs));
    out.assign(s.out(), 0.0);
    lse.assign(s.stats(), 0.0);
    std::vector<double> score(std::size_t(s.T));
    for (int b = 0; b < s.B; ++b) {
        for (int h = 0; h < s.NH; ++h) {
            for (int t = 0; t < s.T; ++t) {
                double max = -std::numeric_limits<double>::infinity();
                for (int j = 0; j <= t; ++j) {
                    score[j] = scale * dot(&qkv[s.q_at(b, t, 0, h)], &qkv[s.q_at(b, j, 1, h)], hs);
                    max = std::max(max, score[j]);
                }
                double z = 0.0;
                for (int j = 0; j <= t; ++j) z += std::exp(score[j] - max);
                double* o = &out[s.o_at(b, t, h)];
                for (int j = 0; j <= t; ++j) {
                    const double p = std::exp(score[j] - max) / z;
                    const double* v = &qkv[s.q_at(b, j, 2, h)];
                    for (int i = 0; i < hs; ++i) o[i] += p * v[i];
                }
                lse[s.s_at(b, h, t)] = max + std::log(z);
            }
        }
    }
}

// ---- the contract's algorithm, in double, with its rounding points ----

// x rounded to the activation type T (through float), as a double.
template <class T>
double round_to(double x) {
    if constexpr (std::is_same_v<T, double>) {
        return x;
    } else {
        return to_double(T(static_cast<float>(x)));
    }
}

// Forward, one query row at a time, walking the key tiles of the contract
// (starting at multiples of tile_k): the running max m, the sum l and the
// accumulator in double; each e^(s - m') rounded to T before it multiplies v.
// out is left unrounded.
template <class T>
void tiled_forward_reference(std::vector<double>& out, std::vector<double>& lse, const std::vector<double>& qkv,
                             const Shape& s) {
    const int hs = s.hs();
    const double scale = 1.0 / std::sqrt(double(hs));
    out.assign(s.out(), 0.0);
    lse.assign(s.stats(), 0.0);
    std::vector<double> acc(static_cast<std::size_t>(hs)), score(static_cast<std::size_t>(tile_k));
    for (int b = 0; b < s.B; ++b) {
        for (int h = 0; h < s.NH; ++h) {
            for (int t = 0; t < s.T; ++t) {
                double m = -std::numeric_limits<double>::infinity(), l = 0.0;
                std::fill(acc.begin(), acc.end(), 0.0);
                for (int k0 = 0; k0 <= t; k0 += tile_k) {
                    const int k1 = std::min(k0 + tile_k, t + 1);
                    double m_new = m;
                    for (int j = k0; j < k1; ++j) {
                        score[j - k0] = scale * dot(&qkv[s.q_at(b, t, 0, h)], &qkv[s.q_at(b, j, 1, h)], hs);
                        m_new = std::max(m_new, score[j - k0]);
                    }
                    const double rescale = std::exp(m - m_new);
                    double sum = 0.0;
                    for (double& a : acc) a *= rescale;
                    for (int j = k0; j < k1; ++j) {
                        const double p = std::exp(score[j - k0] - m_new);
                        sum += p;
                        const double pr = round_to<T>(p);
                        const double* v = &qkv[s.q_at(b, j, 2, h)];
                        for (int i = 0; i < hs; ++i) acc[i] += pr * v[i];
                    }
                    l = l * rescale + sum;
                    m = m_new;
                }
                for (int i = 0; i < hs; ++i) out[s.o_at(b, t, h) + i] = acc[i] / l;
                lse[s.s_at(b, h, t)] = m + std::log(l);
            }
        }
    }
}

// Backward from the given out and lse: D_t = dout_t . out_t,
// p = e^(s - lse), ds = p (dout_t . v_j - D_t), and the sums of round(p) and
// round(ds) products, all in double; dqkv is left unrounded.
template <class T>
void tiled_backward_reference(std::vector<double>& dqkv, const std::vector<double>& dout,
                              const std::vector<double>& qkv, const std::vector<double>& out,
                              const std::vector<double>& lse, const Shape& s) {
    const int hs = s.hs();
    const double scale = 1.0 / std::sqrt(double(hs));
    dqkv.assign(s.qkv(), 0.0);
    for (int b = 0; b < s.B; ++b) {
        for (int h = 0; h < s.NH; ++h) {
            for (int t = 0; t < s.T; ++t) {
                const double* q = &qkv[s.q_at(b, t, 0, h)];
                const double* dO = &dout[s.o_at(b, t, h)];
                const double D = dot(dO, &out[s.o_at(b, t, h)], hs);
                for (int j = 0; j <= t; ++j) {
                    const double* k = &qkv[s.q_at(b, j, 1, h)];
                    const double* v = &qkv[s.q_at(b, j, 2, h)];
                    const double p = std::exp(scale * dot(q, k, hs) - lse[s.s_at(b, h, t)]);
                    const double ds = round_to<T>(p * (dot(dO, v, hs) - D));
                    const double pr = round_to<T>(p);
                    double* dq = &dqkv[s.q_at(b, t, 0, h)];
                    double* dk = &dqkv[s.q_at(b, j, 1, h)];
                    double* dv = &dqkv[s.q_at(b, j, 2, h)];
                    for (int i = 0; i < hs; ++i) {
                        dq[i] += scale * ds * k[i];
                        dk[i] += scale * ds * q[i];
                        dv[i] += pr * dO[i];
                    }
                }
            }
        }
    }
}

// ---- comparisons ----

double rms(const std::vector<double>& v) {
    double sum = 0.0;
    for (double x : v) sum += x * x;
    return v.empty() ? 0.0 : std::sqrt(sum / double(v.size()));
}

// max over i of |got[i] - want[i]| / (|want[i]| + rms(want)); NaN counts as infinitely wrong.
template <class G>
double rel_to_rms(const std::vector<G>& got, const std::vector<double>& want) {
    const double floor = rms(want);
    double worst = 0.0;
    for (std::size_t i = 0; i < want.size(); ++i) {
        const double e = std::abs(to_double(got[i]) - want[i]) / (std::abs(want[i]) + floor);
        worst = std::isnan(e) ? std::numeric_limits<double>::infinity() : std::max(worst, e);
    }
    return worst;
}

// The spacing of T's values between 1 and 2: 2^-7 for bfloat16, 2^-10 for half.
template <class T>
constexpr double spacing_at_one() {
    return std::is_same_v<T, half> ? 0x1p-10 : 0x1p-7;
}

// Elements where the 16-bit got is not the value of T nearest to want.
template <class T>
std::size_t not_nearest(const std::vector<T>& got, const std::vector<double>& want) {
    std::size_t n = 0;
    for (std::size_t i = 0; i < want.size(); ++i) n += got[i].bits != T(static_cast<float>(want[i])).bits;
    return n;
}

// Every element of a small input, a spread-out subset of about `want` of a
// large one (a stride that is odd and not a multiple of 3, so that the subset
// visits q, k and v, every head, early and late rows).
std::vector<std::size_t> probe_indices(std::size_t n, std::size_t want) {
    std::vector<std::size_t> idx;
    std::size_t stride = n <= want ? 1 : n / want;
    while (stride > 1 && (stride % 2 == 0 || stride % 3 == 0)) ++stride;
    for (std::size_t i = 0; i < n; i += stride) idx.push_back(i);
    if (idx.back() != n - 1) idx.push_back(n - 1);
    return idx;
}

template <class T>
struct FlashRun {
    std::vector<T> out, dqkv;
    std::vector<stat_t<T>> lse, D;
};

// The kernel's forward, then its backward from its own out and lse, every
// output poisoned first.
template <class T>
FlashRun<T> run_flash(const std::vector<T>& qkv, const std::vector<T>& dout, const Shape& s) {
    FlashRun<T> r;
    r.out.assign(s.out(), nan_value<T>());
    r.dqkv.assign(s.qkv(), nan_value<T>());
    r.lse.assign(s.stats(), nan_value<stat_t<T>>());
    r.D.assign(s.stats(), nan_value<stat_t<T>>());
    snug::host::flash_attention_forward(Device{}, r.out.data(), r.lse.data(), qkv.data(), s.B, s.T, s.C, s.NH,
                                        s.kv());
    snug::host::flash_attention_backward(Device{}, r.dqkv.data(), r.D.data(), dout.data(), qkv.data(), r.out.data(),
                                         r.lse.data(), s.B, s.T, s.C, s.NH, s.kv());
    return r;
}

}  // namespace

TEST_CASE("flash attention in double: out and lse match the textbook softmax, dqkv central differences",
          "[flash_attention]") {
    // Across tile boundaries in both directions: 70 and 130 query rows and keys
    // against tiles of 64 (a full tile, then a partial one or two).
    static_assert(tile_q == 64 && tile_k == 64, "the shapes below are chosen for tiles of 64");
    struct Case {
        Shape shape;
        std::size_t probes;  // qkv elements checked by central differences
    };
    const std::vector<Case> cases = {
        {{2, 70, 6, 2}, 1u << 30},  // hs = 3, every element
        {{1, 130, 6, 2}, 1u << 30},  // hs = 3, every element
        {{2, 70, 16, 2}, 900},      // hs = 8
        {{1, 1, 10, 2}, 1u << 30},  // T = 1, hs = 5
        {{2, 70, 12, 4, 2}, 1u << 30},  // grouped queries: 2 per key/value head, hs = 3, every element
        {{1, 130, 12, 4, 1}, 1200},     // one key/value head for 4 query heads
    };
    std::uint32_t seed = 1500;
    for (const Case& c : cases) {
        const Shape& s = c.shape;
        INFO(s.str() << " seed " << seed);
        // Scores of a few units: the softmax far from uniform, and rows whose
        // maximum moves from tile to tile.
        const std::vector<double> qkv = snug::test::random_values<double>(s.qkv(), seed++, -1.5, 1.5);
        const std::vector<double> w = snug::test::random_values<double>(s.out(), seed++);

        std::vector<double> ref_out, ref_lse;
        softmax_reference(ref_out, ref_lse, qkv, s);
        const FlashRun<double> got = run_flash(qkv, w, s);
        CHECK(rel_to_rms(got.out, ref_out) < 1e-13);
        CHECK(rel_to_rms(got.lse, ref_lse) < 1e-13);

        // d/dqkv of loss = sum(w * out) by central differences of the reference.
        std::vector<double> x = qkv;
        const std::vector<std::size_t> idx = probe_indices(x.size(), c.probes);
        std::vector<double> fd(idx.size());
        std::vector<double> o, l;
        const double h = 1e-5;
        for (std::size_t n = 0; n < idx.size(); ++n) {
            const double keep = x[idx[n]];
            x[idx[n]] = keep + h;
            softmax_reference(o, l, x, s);
            const double plus = dot(o.data(), w.data(), int(o.size()));
            x[idx[n]] = keep - h;
            softmax_reference(o, l, x, s);
            const double minus = dot(o.data(), w.data(), int(o.size()));
            x[idx[n]] = keep;
            fd[n] = (plus - minus) / (2 * h);
        }
        double err = 0.0, scale = 0.0;
        for (std::size_t n = 0; n < idx.size(); ++n) {
            err = std::max(err, std::abs(got.dqkv[idx[n]] - fd[n]));
            scale = std::max(scale, std::abs(fd[n]));
        }
        // h^2-truncation and cancellation of central differences: ~1e-10 here.
        CHECK(scale > 0.1);
        CHECK(err < 1e-8 * (1.0 + scale));
        // Every element was written (the poison is gone).
        CHECK(std::none_of(got.dqkv.begin(), got.dqkv.end(), [](double v) { return std::isnan(v); }));
    }
}

TEMPLATE_TEST_CASE("flash attention agrees with the materialised host attention", "[flash_attention]", float,
                   bfloat16, half) {
    using T = TestType;
    // fp32: both compute in fp32 with sums of a few hundred terms of size ~1,
    // in different orders and through differently rounded exponentials
    // (flash: the running max and a division by l at the end; materialised:
    // the global max and normalised p): a few hundred ulps of 2^-24 at most,
    // 1e-5.
    // 16-bit: the two are different approximations of the exact result, and
    // the tolerance is the sum of their errors against it (measured against
    // the double kernel at these shapes and at T = 1024, hs = 64). Each output
    // is rounded to T (up to 2^-8 of |ref| for bfloat16, 2^-11 for half);
    // flash also rounds every p and dS to T before its product, as a tensor
    // core kernel does, the materialised kernel the normalised probabilities
    // its backward reads. Out: each kernel within ~0.5% (bfloat16) and 0.09%
    // (half) of the exact, so 1e-2 and 2e-3. dqkv: dS = P (dP - D) cancels, so
    // that the rounding of P and dS is amplified in dq and dk: each kernel
    // within 2e-2 (bfloat16; flash 3.2e-2 at T = 1024) and 3e-3 (half), so
    // 4e-2 and 5e-3.
    const bool bf16 = std::is_same_v<T, snug::bfloat16>;
    const double out_tol = std::is_same_v<T, float> ? 1e-5 : bf16 ? 1e-2 : 2e-3;
    const double dqkv_tol = std::is_same_v<T, float> ? 1e-5 : bf16 ? 4e-2 : 5e-3;
    const std::vector<Shape> shapes = {
        {3, 1, 24, 3},     // T = 1, hs = 8
        {2, 63, 128, 2},   // one partial tile, hs = 64
        {1, 64, 128, 1},   // one full tile
        {2, 65, 24, 3},    // one full tile and one row, hs = 8
        {2, 200, 256, 2},  // four tiles, the last partial, hs = 128
        {1, 130, 256, 1},  // hs = 256
        {2, 77, 15, 3},    // hs = 5 (odd)
    };
    std::uint32_t seed = 2500;
    for (const Shape& s : shapes) {
        INFO(s.str() << " seed " << seed);
        const std::vector<T> qkv = snug::test::random_values<T>(s.qkv(), seed++, -2.0, 2.0);
        const std::vector<T> dout = snug::test::random_values<T>(s.out(), seed++);

        std::vector<T> ref_out(s.out(), nan_value<T>()), att(std::size_t(s.B) * s.NH * s.T * s.T);
        std::vector<T> ref_dqkv(s.qkv(), nan_value<T>()), scratch(att.size());
        snug::host::attention_forward(Device{}, ref_out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
        snug::host::attention_backward(Device{}, ref_dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(),
                                       s.B, s.T, s.C, s.NH);

        const FlashRun<T> got = run_flash(qkv, dout, s);
        const double out_err = rel_to_rms(got.out, widen(ref_out));
        const double dqkv_err = rel_to_rms(got.dqkv, widen(ref_dqkv));
        INFO("out error " << out_err << ", dqkv error " << dqkv_err);
        CHECK(rms(widen(ref_dqkv)) > 1e-3);
        CHECK(out_err < out_tol);
        CHECK(dqkv_err < dqkv_tol);
    }
}

TEMPLATE_TEST_CASE("16-bit flash attention is the contract's algorithm with its rounding points",
                   "[flash_attention]", bfloat16, half) {
    using T = TestType;
    const std::vector<Shape> shapes = {
        {2, 70, 16, 2},    // hs = 8, two tiles
        {1, 150, 128, 2},  // hs = 64, three tiles
        {2, 9, 12, 3},     // hs = 4, one partial tile
        {2, 70, 32, 4, 2},    // grouped queries, hs = 8
        {1, 150, 128, 2, 1},  // one key/value head, hs = 64
    };
    std::uint32_t seed = 3500;
    for (const Shape& s : shapes) {
        INFO(s.str() << " seed " << seed);
        const std::vector<T> qkv = snug::test::random_values<T>(s.qkv(), seed++, -2.0, 2.0);
        const std::vector<T> dout = snug::test::random_values<T>(s.out(), seed++);

        std::vector<double> ref_out, ref_lse;
        tiled_forward_reference<T>(ref_out, ref_lse, widen(qkv), s);
        std::vector<T> out(s.out(), nan_value<T>());
        std::vector<float> lse(s.stats(), nan_value<float>());
        snug::host::flash_attention_forward(Device{}, out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH,
                                            s.kv());

        // The backward of both from the reference's out and lse, as stored.
        std::vector<T> out_in(s.out());
        std::vector<float> lse_in(s.stats());
        for (std::size_t i = 0; i < out_in.size(); ++i) out_in[i] = T(static_cast<float>(ref_out[i]));
        for (std::size_t i = 0; i < lse_in.size(); ++i) lse_in[i] = static_cast<float>(ref_lse[i]);
        std::vector<double> ref_dqkv;
        tiled_backward_reference<T>(ref_dqkv, widen(dout), widen(qkv), widen(out_in), widen(lse_in), s);
        std::vector<T> dqkv(s.qkv(), nan_value<T>());
        std::vector<float> D(s.stats(), nan_value<float>());
        snug::host::flash_attention_backward(Device{}, dqkv.data(), D.data(), dout.data(), qkv.data(), out_in.data(),
                                             lse_in.data(), s.B, s.T, s.C, s.NH, s.kv());

        // The kernel's fp32 differs from the reference's double by ~1e-6
        // relative (sums in another order, the fast exponential), far below
        // half a 16-bit spacing, so nearly every output is the value of T
        // nearest to the reference's (the few others: a p or dS whose fp32
        // value lay within ~1e-6 of a rounding boundary and went the other
        // way, or an output that did). Allowed: 1% of elements not nearest,
        // and an error of half a spacing (the final rounding) plus half a
        // spacing of rms(ref) (those flips). A p or dS rounded at another
        // point, or not at all, moves most outputs by a fraction of a spacing
        // and many off their nearest value.
        const double eps = spacing_at_one<T>();
        const double out_err = rel_to_rms(out, ref_out), dqkv_err = rel_to_rms(dqkv, ref_dqkv);
        const std::size_t out_off = not_nearest(out, ref_out), dqkv_off = not_nearest(dqkv, ref_dqkv);
        INFO("out: error " << out_err << ", " << out_off << " of " << out.size() << " not nearest");
        INFO("dqkv: error " << dqkv_err << ", " << dqkv_off << " of " << dqkv.size() << " not nearest");
        CHECK(out_err <= eps);
        CHECK(dqkv_err <= eps);
        CHECK(double(out_off) <= 0.01 * double(out.size()));
        CHECK(double(dqkv_off) <= 0.01 * double(dqkv.size()));
        CHECK(rel_to_rms(lse, ref_lse) < 1e-6);
        double lse_scale = 0.0;
        for (double v : ref_lse) lse_scale = std::max(lse_scale, std::abs(v));
        CHECK(lse_scale > 0.5);
    }
}

TEMPLATE_TEST_CASE("flash attention gives the same bits on every run and for any thread count", "[flash_attention]",
                   float, bfloat16) {
    using T = TestType;
    // hs = 64, 4 tiles: 24 tasks a forward pass; then grouped queries (4 backward tasks).
    for (const Shape s : {Shape{2, 200, 192, 3}, Shape{2, 200, 256, 4, 2}}) {
        const std::uint32_t seed = 4500;
        INFO(s.str() << " seed " << seed);
        const std::vector<T> qkv = snug::test::random_values<T>(s.qkv(), seed, -2.0, 2.0);
        const std::vector<T> dout = snug::test::random_values<T>(s.out(), seed + 1);
        const snug::host::detail::FlashShape sh = snug::host::detail::flash_shape(s.B, s.T, s.C, s.NH, s.kv());

        auto run = [&](unsigned threads) {
            FlashRun<T> r;
            r.out.assign(s.out(), nan_value<T>());
            r.dqkv.assign(s.qkv(), nan_value<T>());
            r.lse.assign(s.stats(), nan_value<float>());
            r.D.assign(s.stats(), nan_value<float>());
            snug::host::detail::flash_attention_forward_run(r.out.data(), r.lse.data(), qkv.data(), sh, threads);
            snug::host::detail::flash_attention_backward_run(r.dqkv.data(), r.D.data(), dout.data(), qkv.data(),
                                                             r.out.data(), r.lse.data(), sh, threads);
            return r;
        };
        auto same_bits = [](const auto& a, const auto& b) {
            if (a.size() != b.size()) return false;
            for (std::size_t i = 0; i < a.size(); ++i) {
                if (snug::test::bits_of(a[i]) != snug::test::bits_of(b[i])) return false;
            }
            return true;
        };
        const FlashRun<T> one = run(1);
        // On a machine with fewer cores, parallel_for runs as many as it has.
        const FlashRun<T> many = run(std::max(4U, snug::host::max_threads()));
        const FlashRun<T> again = run_flash(qkv, dout, s);
        CHECK(std::none_of(one.dqkv.begin(), one.dqkv.end(), [](T v) { return std::isnan(to_double(v)); }));
        CHECK(std::none_of(one.out.begin(), one.out.end(), [](T v) { return std::isnan(to_double(v)); }));
        for (const FlashRun<T>* r : {&many, &again}) {
            CHECK(same_bits(r->out, one.out));
            CHECK(same_bits(r->lse, one.lse));
            CHECK(same_bits(r->D, one.D));
            CHECK(same_bits(r->dqkv, one.dqkv));
        }
    }
}

TEMPLATE_TEST_CASE("grouped-query flash attention is multi-head attention on repeated keys and values",
                   "[flash_attention]", double, float) {
    // The reference: each key/value head copied to the NH / KV query heads
    // that read it (transformers' repeat_kv), multi-head flash attention on
    // that, and the copies' gradients summed (in double). Forward and dq run
    // the same operations in the same order, so they are the same bits; dk
    // and dv sum the group's heads in another order: 1e-12 in double, 1e-5
    // in fp32 (sums of a few hundred terms of size ~1).
    using T = TestType;
    const double tol = std::is_same_v<T, double> ? 1e-12 : 1e-5;
    for (const Shape g : {Shape{2, 70, 32, 4, 2}, Shape{1, 130, 48, 6, 2}, Shape{2, 65, 24, 3, 1}}) {
        const Shape m{g.B, g.T, g.C, g.NH};  // the expanded, multi-head shape
        const std::uint32_t seed = 4700 + static_cast<std::uint32_t>(g.T);
        INFO(g.str() << " seed " << seed);
        const std::vector<T> qkv = snug::test::random_values<T>(g.qkv(), seed, -2.0, 2.0);
        const std::vector<T> dout = snug::test::random_values<T>(g.out(), seed + 1);
        std::vector<T> expanded(m.qkv(), nan_value<T>());
        for (int b = 0; b < g.B; ++b)
            for (int t = 0; t < g.T; ++t)
                for (int h = 0; h < g.NH; ++h)
                    for (int part = 0; part < 3; ++part)
                        for (int i = 0; i < g.hs(); ++i)
                            expanded[m.q_at(b, t, part, h) + i] = qkv[g.q_at(b, t, part, h) + i];

        const FlashRun<T> got = run_flash(qkv, dout, g);
        const FlashRun<T> want = run_flash(expanded, dout, m);
        CHECK(got.out == want.out);
        CHECK(got.lse == want.lse);
        std::vector<double> want_dqkv(g.qkv(), 0.0);
        for (int b = 0; b < g.B; ++b)
            for (int t = 0; t < g.T; ++t)
                for (int h = 0; h < g.NH; ++h)
                    for (int i = 0; i < g.hs(); ++i) {
                        want_dqkv[g.q_at(b, t, 0, h) + i] = to_double(want.dqkv[m.q_at(b, t, 0, h) + i]);
                        want_dqkv[g.q_at(b, t, 1, h) + i] += to_double(want.dqkv[m.q_at(b, t, 1, h) + i]);
                        want_dqkv[g.q_at(b, t, 2, h) + i] += to_double(want.dqkv[m.q_at(b, t, 2, h) + i]);
                    }
        bool dq_same = true;
        for (int b = 0; b < g.B; ++b)
            for (int t = 0; t < g.T; ++t)
                for (int h = 0; h < g.NH; ++h)
                    for (int i = 0; i < g.hs(); ++i)
                        dq_same = dq_same && got.dqkv[g.q_at(b, t, 0, h) + i] == want.dqkv[m.q_at(b, t, 0, h) + i];
        CHECK(dq_same);
        CHECK(rms(want_dqkv) > 1e-2);
        CHECK(rel_to_rms(got.dqkv, want_dqkv) < tol);
    }
}

TEST_CASE("flash attention does nothing for empty shapes and rejects shapes that make no sense",
          "[flash_attention]") {
    using snug::ShapeError;
    using snug::host::flash_attention_backward;
    using snug::host::flash_attention_forward;
    std::vector<float> buf(4096, 3.0f);
    float* p = buf.data();
    flash_attention_forward(Device{}, p, p, p, 0, 70, 8, 2);
    flash_attention_forward(Device{}, p, p, p, 2, 0, 8, 2);
    flash_attention_backward(Device{}, p, p, p, p, p, p, 0, 70, 8, 2);
    flash_attention_backward(Device{}, p, p, p, p, p, p, 2, 0, 8, 2);
    CHECK(std::all_of(buf.begin(), buf.end(), [](float x) { return x == 3.0f; }));

    CHECK_THROWS_AS(flash_attention_forward(Device{}, p, p, p, 1, 4, 8, 0), ShapeError);
    CHECK_THROWS_AS(flash_attention_forward(Device{}, p, p, p, 1, 4, 0, 2), ShapeError);
    CHECK_THROWS_AS(flash_attention_forward(Device{}, p, p, p, -1, 4, 8, 2), ShapeError);
    CHECK_THROWS_AS(flash_attention_forward(Device{}, p, p, p, 1, -4, 8, 2), ShapeError);
    CHECK_THROWS_WITH(flash_attention_forward(Device{}, p, p, p, 1, 4, 10, 4),
                      Catch::Matchers::Contains("flash_attention_forward") && Catch::Matchers::Contains("C = 10") &&
                          Catch::Matchers::Contains("NH = 4"));
    CHECK_THROWS_WITH(flash_attention_backward(Device{}, p, p, p, p, p, p, 1, 4, 12, 5),
                      Catch::Matchers::Contains("flash_attention_backward") && Catch::Matchers::Contains("C = 12") &&
                          Catch::Matchers::Contains("NH = 5"));
    CHECK_THROWS_WITH(flash_attention_forward(Device{}, p, p, p, 1, 4, 12, 6, 4),
                      Catch::Matchers::Contains("NH = 6") && Catch::Matchers::Contains("KV = 4 key/value heads"));
    CHECK_THROWS_WITH(flash_attention_backward(Device{}, p, p, p, p, p, p, 1, 4, 12, 6, 0),
                      Catch::Matchers::Contains("flash_attention_backward") && Catch::Matchers::Contains("KV = 0"));
    // A rejected call wrote nothing.
    CHECK(std::all_of(buf.begin(), buf.end(), [](float x) { return x == 3.0f; }));
}
