// The host SwiGLU (Llama's MLP activation; layout and formulas in
// snug/ops/swiglu.hpp), forward and backward: out = silu(gate) * up over rows
// laid out [gate | up]. Computed in acc_t<T> with std::exp, rounded once on
// a 16-bit store.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "snug/core/device.hpp"
#include "snug/host/math.hpp"
#include "snug/ops/swiglu.hpp"

namespace snug::host {

namespace detail {

// Rows per parallel task: about 2^15 outputs (one exponential each).
inline std::int64_t swiglu_row_grain(int H) {
    return std::max<std::int64_t>(1, (std::int64_t{1} << 15) / std::max(H, 1));
}

}  // namespace detail

// out[n, h] = silu(inp[n, h]) * inp[n, H + h]. out must not overlap inp.
template <HostFloat T>
void swiglu_forward(const Device&, T* out,  // (N, H)
                    const T* inp,           // (N, 2H): [gate | up] per row
                    std::int64_t N, int H) {
    using A = acc_t<T>;
    ops::check_swiglu("swiglu_forward", N, H);
    parallel_ranges(N, detail::swiglu_row_grain(H), [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t n = begin; n < end; ++n) {
            const T* gate = inp + n * 2 * H;
            const T* up = gate + H;
            T* o = out + n * H;
            for (int h = 0; h < H; ++h) {
                const A g = to_acc(gate[h]);
                o[h] = from_acc<T>(ops::silu_value(g, std::exp(-g)) * to_acc(up[h]));
            }
        }
    });
}

// dinp[n, h] = dout[n, h] * inp[n, H + h] * silu'(inp[n, h])  (the gate half),
// dinp[n, H + h] = dout[n, h] * silu(inp[n, h])               (the up half),
// overwriting. dinp must not overlap inp or dout.
template <HostFloat T>
void swiglu_backward(const Device&, T* dinp,  // (N, 2H): [dgate | dup] per row
                     const T* inp,            // (N, 2H): [gate | up] per row
                     const T* dout,           // (N, H)
                     std::int64_t N, int H) {
    using A = acc_t<T>;
    ops::check_swiglu("swiglu_backward", N, H);
    parallel_ranges(N, detail::swiglu_row_grain(H), [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t n = begin; n < end; ++n) {
            const T* gate = inp + n * 2 * H;
            const T* up = gate + H;
            const T* dy = dout + n * H;
            T* dgate = dinp + n * 2 * H;
            T* dup = dgate + H;
            for (int h = 0; h < H; ++h) {
                const A g = to_acc(gate[h]);
                const A e = std::exp(-g);
                const A d = to_acc(dy[h]);
                dgate[h] = from_acc<T>(d * to_acc(up[h]) * ops::silu_derivative(g, e));
                dup[h] = from_acc<T>(d * ops::silu_value(g, e));
            }
        }
    });
}

}  // namespace snug::host
