// The host encoder: token embedding plus position embedding (GPT-2's wte and
// wpe), forward and a deterministic backward into fp32 gradients.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "snug/core/device.hpp"
#include "snug/core/error.hpp"
#include "snug/host/math.hpp"
#include "snug/ops/encoder.hpp"

namespace snug::host {

namespace detail {

inline void check_encoder(const char* op, const std::int32_t* tokens, int B, int T, int C) {
    ops::check_encoder(op, B, T, C);
    const std::int64_t n = std::int64_t{B} * T;
    for (std::int64_t i = 0; i < n; ++i) {
        if (tokens[i] < 0) {
            throw Error(std::string(op) + ": token id " + std::to_string(tokens[i]) + " at (b = " +
                        std::to_string(i / T) + ", t = " + std::to_string(i % T) + ") is negative");
        }
    }
}

}  // namespace detail

// out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :], summed in acc_t<T> and
// rounded once; wpe == nullptr (no learned positions, e.g. a model with
// rotary embeddings): out = wte's row, copied. Token ids must lie in [0, Vp); a negative one throws
// snug::Error (the upper bound is the caller's: the table size is not passed).
template <HostFloat T>
void encoder_forward(const Device&, T* out,                 // (B, T, C)
                     const std::int32_t* tokens,            // (B, T)
                     const T* wte,                          // (Vp, C)
                     const T* wpe,                          // (maxT, C) or nullptr
                     int B, int T_, int C) {
    detail::check_encoder("encoder_forward", tokens, B, T_, C);
    const std::int64_t rows = std::int64_t{B} * T_;
    parallel_ranges(rows, std::max<std::int64_t>(1, (std::int64_t{1} << 17) / std::max(C, 1)),
                    [&](std::int64_t begin, std::int64_t end) {
                        for (std::int64_t r = begin; r < end; ++r) {
                            T* o = out + r * C;
                            const T* te = wte + std::int64_t{tokens[r]} * C;
                            if (wpe == nullptr) {
                                std::copy(te, te + C, o);
                                continue;
                            }
                            const T* pe = wpe + (r % T_) * C;
                            for (int c = 0; c < C; ++c) o[c] = from_acc<T>(to_acc(te[c]) + to_acc(pe[c]));
                        }
                    });
}

// dwte[tokens[b, t], :] += dout[b, t, :] and dwpe[t, :] += dout[b, t, :]
// (dwpe == nullptr: no positions), in fp32. Deterministic: every gradient element receives its contributions in
// the order of (b, t), whatever the thread count (threads own channel slices).
template <HostFloat T>
void encoder_backward(const Device&, float* dwte,          // (Vp, C) +=
                      float* dwpe,                          // (maxT, C) += or nullptr
                      const T* dout,                        // (B, T, C)
                      const std::int32_t* tokens,           // (B, T)
                      int B, int T_, int C) {
    detail::check_encoder("encoder_backward", tokens, B, T_, C);
    const std::int64_t rows = std::int64_t{B} * T_;
    // A slice of channels per thread, when there are enough rows to pay for it.
    const std::int64_t grain = std::max<std::int64_t>(16, (std::int64_t{1} << 17) / std::max<std::int64_t>(rows, 1));
    parallel_ranges(C, grain, [&](std::int64_t c0, std::int64_t c1) {
        for (std::int64_t r = 0; r < rows; ++r) {
            const T* d = dout + r * C;
            float* gte = dwte + std::int64_t{tokens[r]} * C;
            for (std::int64_t c = c0; c < c1; ++c) gte[c] = static_cast<float>(gte[c] + to_acc(d[c]));
            if (dwpe == nullptr) continue;
            float* gpe = dwpe + (r % T_) * C;
            for (std::int64_t c = c0; c < c1; ++c) gpe[c] = static_cast<float>(gpe[c] + to_acc(d[c]));
        }
    });
}

}  // namespace snug::host
