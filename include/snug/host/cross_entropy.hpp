// Fused softmax + cross-entropy on the host: per-row losses -log softmax(logits)[target]
// and, in place of the logits, their gradient (softmax - onehot(target)) * dloss.
// Probabilities are never stored separately.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "snug/core/device.hpp"
#include "snug/core/error.hpp"
#include "snug/host/math.hpp"
#include "snug/ops/cross_entropy.hpp"

namespace snug::host {

namespace detail {

// Independent partial results per row: a single running max or sum is one
// long dependency chain (and fp32 sums may not be reassociated), lanes give the
// CPU independent work. The order of the additions depends only on V.
inline constexpr int cross_entropy_lanes = 16;

// max over j < n of x[j] (-inf when n == 0).
template <HostFloat T>
acc_t<T> row_max(const T* x, int n) {
    using A = acc_t<T>;
    constexpr int L = cross_entropy_lanes;
    A lane[L];
    for (A& m : lane) m = -std::numeric_limits<A>::infinity();
    int j = 0;
    for (; j + L <= n; j += L) {
        for (int l = 0; l < L; ++l) {
            const A v = to_acc(x[j + l]);
            lane[l] = lane[l] < v ? v : lane[l];
        }
    }
    A max = -std::numeric_limits<A>::infinity();
    for (; j < n; ++j) max = max < to_acc(x[j]) ? to_acc(x[j]) : max;
    for (const A m : lane) max = max < m ? m : max;
    return max;
}

// One row: returns -log softmax(x)[target] over the first V entries, computed
// as (max - x[target]) + log(sum exp(x - max)), so that no exp overflows. When
// dloss != 0, x (Vp) is overwritten with (softmax - onehot(target)) * dloss and
// x[V..Vp) with 0. A NaN among the logits makes the loss (and the gradient) NaN.
// fp32 and double rows keep each exp(x - max) in x between the two passes; a
// 16-bit row cannot hold them and computes them again (the same values, so
// a 16-bit row is the float row rounded once).
template <HostFloat T>
float cross_entropy_row(T* x, std::int32_t target, int V, int Vp, float dloss) {  // x: (Vp)
    using A = acc_t<T>;
    const A max = row_max(x, V);
    const A x_target = to_acc(x[target]);
    const bool train = dloss != 0.0f;
    auto exp_term = [&](int j) { return std::exp(to_acc(x[j]) - max); };
    A sum = 0;
    if constexpr (!is_16bit_v<T>) {
        if (train) {
            sum = lane_sum<A, cross_entropy_lanes>(V, [&](int j) {
                const A e = exp_term(j);
                x[j] = e;
                return e;
            });
        } else {
            sum = lane_sum<A, cross_entropy_lanes>(V, exp_term);
        }
    } else {
        sum = lane_sum<A, cross_entropy_lanes>(V, exp_term);
    }
    const A loss = (max - x_target) + std::log(sum);
    if (train) {
        const A scale = static_cast<A>(dloss) / sum;
        if constexpr (is_16bit_v<T>) {
            for (int j = 0; j < V; ++j) store(x + j, exp_term(j) * scale);
        } else {
            for (int j = 0; j < V; ++j) x[j] *= scale;
        }
        // The target's entry from its own probability (the value just stored
        // may be rounded to 16 bits).
        store(x + target, (std::exp(x_target - max) / sum - A(1)) * static_cast<A>(dloss));
        for (int j = V; j < Vp; ++j) x[j] = T(0.0f);
    }
    return static_cast<float>(loss);
}

}  // namespace detail

// Throws snug::Error naming the first target id outside [0, V) and its row
// (targets (N) in host memory).
inline void check_targets(const char* op, const std::int32_t* targets, std::int64_t N, int V) {
    for (std::int64_t i = 0; i < N; ++i) {
        if (targets[i] < 0 || targets[i] >= V) {
            throw Error(std::string(op) + ": target id " + std::to_string(targets[i]) + " in row " +
                        std::to_string(i) + " is outside [0, V = " + std::to_string(V) + ")");
        }
    }
}

// losses[i] = -log softmax(logits[i, 0..V))[targets[i]], in fp32 (double math
// for double). When dloss != 0 the logits are replaced by the gradient of
// dloss * sum_i losses[i]: (softmax - onehot(target)) * dloss, rounded once to
// T, with the padded columns V..Vp set to 0; when dloss == 0 (evaluation) the
// logits are left untouched. Rows run in parallel on the host threads.
// Throws ShapeError for a negative size, V > Vp, or V == 0 with rows to score;
// snug::Error for a null pointer, or for a target outside [0, V) (naming the
// id and the row), in which case nothing is written.
template <HostFloat T>
void softmax_cross_entropy(const Device&, float* losses,  // (N)
                           T* logits,                     // (N, Vp): in logits, out dlogits
                           const std::int32_t* targets,   // (N)
                           std::int64_t N, int V, int Vp, float dloss) {
    constexpr const char* op = "softmax_cross_entropy";
    ops::check_cross_entropy(op, N, V, Vp);
    if (N == 0) return;
    if (losses == nullptr || logits == nullptr || targets == nullptr) {
        throw Error(std::string(op) + ": " + (losses == nullptr ? "losses" : logits == nullptr ? "logits" : "targets") +
                    " is null (N = " + std::to_string(N) + ")");
    }
    check_targets(op, targets, N, V);  // every target before anything is written
    // About 16k exponentials per range: tens of microseconds.
    const std::int64_t grain = std::max<std::int64_t>(1, 16384 / V);
    parallel_ranges(N, grain, [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t i = begin; i < end; ++i) {
            losses[i] = detail::cross_entropy_row(logits + i * Vp, targets[i], V, Vp, dloss);
        }
    });
}

}  // namespace snug::host
