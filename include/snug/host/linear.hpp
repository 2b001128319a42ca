// The fully connected layer on the host, y = x W^T + b with PyTorch nn.Linear's
// layout (W is (OC, C)): forward and backward through snug::host::gemm (fp32
// accumulation, 16-bit outputs rounded to nearest even once). T = double, which
// the GEMM does not take, runs a plain loop nest in double instead, so that
// finite-difference tests can go through this layer.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <string>

#include "snug/core/device.hpp"
#include "snug/core/error.hpp"
#include "snug/host/gemm.hpp"
#include "snug/host/math.hpp"
#include "snug/ops/linear.hpp"

namespace snug::host {

namespace detail {

// x widened to fp32 (double stays double); branch-free for the 16-bit types,
// so that loops over many values vectorize.
template <HostFloat T>
inline acc_t<T> widen_fast(T x) {
    if constexpr (std::same_as<T, double>) {
        return x;
    } else {
        return to_float(x);
    }
}

// dbias (OC) += column sums of dout (N, OC), summed in acc_t<T> per column
// block (a stack buffer: no allocation), then added to dbias once.
template <HostFloat T>
void bias_grad_accumulate(float* dbias, const T* dout, std::int64_t N, int OC) {
    using A = acc_t<T>;
    constexpr int block = 512;
    alignas(64) A sums[block];
    for (int o0 = 0; o0 < OC; o0 += block) {
        const int width = std::min(block, OC - o0);
        std::fill(sums, sums + width, A(0));
        for (std::int64_t n = 0; n < N; ++n) {
            const T* row = dout + n * OC + o0;
            for (int j = 0; j < width; ++j) sums[j] += widen_fast(row[j]);
        }
        for (int j = 0; j < width; ++j) dbias[o0 + j] += static_cast<float>(sums[j]);
    }
}

// The double path of linear_forward: each output a dot product of two
// contiguous rows.
inline void linear_forward_double(double* out, const double* inp, const double* weight, const double* bias,
                                  std::int64_t N, int C, int OC) {
    for (std::int64_t n = 0; n < N; ++n) {
        const double* x = inp + n * C;
        for (int o = 0; o < OC; ++o) {
            const double* w = weight + std::int64_t{o} * C;
            double sum = 0.0;
            for (int c = 0; c < C; ++c) sum += x[c] * w[c];
            out[n * OC + o] = bias != nullptr ? sum + bias[o] : sum;
        }
    }
}

// The double path of linear_backward's two products.
inline void linear_backward_double(double* dinp, float* dweight, const double* dout, const double* inp,
                                   const double* weight, std::int64_t N, int C, int OC) {
    if (dinp != nullptr) {
        for (std::int64_t n = 0; n < N; ++n) {
            double* dx = dinp + n * C;
            std::fill(dx, dx + C, 0.0);
            for (int o = 0; o < OC; ++o) {
                const double d = dout[n * OC + o];
                const double* w = weight + std::int64_t{o} * C;
                for (int c = 0; c < C; ++c) dx[c] += d * w[c];
            }
        }
    }
    for (int o = 0; o < OC; ++o) {
        for (int c = 0; c < C; ++c) {
            double sum = 0.0;
            for (std::int64_t n = 0; n < N; ++n) sum += dout[n * OC + o] * inp[n * C + c];
            dweight[std::int64_t{o} * C + c] += static_cast<float>(sum);
        }
    }
}

}  // namespace detail

// out = inp weight^T + bias. Computed in fp32 (double for double); a 16-bit
// out is rounded to nearest even once, after the bias is added (the bias is
// written into out first and the GEMM adds the product with beta = 1).
// Throws ShapeError for a negative size, snug::Error for a null pointer that
// would be read (bias may be null: no bias).
template <HostFloat T>
void linear_forward(const Device&, T* out,  // (N, OC)
                    const T* inp,           // (N, C)
                    const T* weight,        // (OC, C)
                    const T* bias,          // (OC) or nullptr
                    std::int64_t N, int C, int OC) {
    constexpr const char* op = "linear_forward";
    ops::check_linear_forward(op, out, inp, weight, N, C, OC);
    if (N == 0 || OC == 0) return;
    if constexpr (std::same_as<T, double>) {
        detail::linear_forward_double(out, inp, weight, bias, N, C, OC);
    } else {
        float beta = 0.0f;
        if (bias != nullptr) {
            for (std::int64_t n = 0; n < N; ++n) std::memcpy(out + n * OC, bias, sizeof(T) * std::size_t(OC));
            beta = 1.0f;
        }
        gemm(Op::N, Op::T, N, OC, C, 1.0f, inp, C, weight, C, beta, out, OC);
    }
}

// The gradients of linear_forward given dout = dL/dout:
//   dinp = dout weight           (N, C), overwritten; skipped when dinp is null
//   dweight += dout^T inp        (OC, C), fp32, accumulated
//   dbias += column sums of dout (OC), fp32, accumulated; skipped when null
// Throws ShapeError for a negative size, snug::Error for a null pointer that
// would be used.
template <HostFloat T>
void linear_backward(const Device&, T* dinp,  // (N, C) or nullptr
                     float* dweight,          // (OC, C)
                     float* dbias,            // (OC) or nullptr
                     const T* dout,           // (N, OC)
                     const T* inp,            // (N, C)
                     const T* weight,         // (OC, C)
                     std::int64_t N, int C, int OC) {
    constexpr const char* op = "linear_backward";
    ops::check_linear_backward(op, dinp, dweight, dout, inp, weight, N, C, OC);
    // Every empty case falls through: OC == 0 makes dinp zero, N == 0 leaves
    // the accumulated gradients as they are.
    if constexpr (std::same_as<T, double>) {
        detail::linear_backward_double(dinp, dweight, dout, inp, weight, N, C, OC);
    } else {
        if (dinp != nullptr) gemm(Op::N, Op::N, N, C, OC, 1.0f, dout, OC, weight, C, 0.0f, dinp, C);
        gemm(Op::T, Op::N, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    }
    if (dbias != nullptr) detail::bias_grad_accumulate(dbias, dout, N, OC);
}

}  // namespace snug::host
