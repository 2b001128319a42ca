// The fused AdamW update's contract, for every backend: its checks, its
// per-call constants, and the random stream that rounds the state it keeps
// in 16 bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "snug/core/error.hpp"
#include "snug/ops/sizes.hpp"

namespace snug::ops {

// Where an update's stochastic rounding takes its random bits (bf16 moments,
// bf16 weights without a master copy): element i of a call at optimizer step
// s reads the Philox block random_block(seed, s, first_index + i) (core/rng.hpp)
// — word 0 rounds the first moment, word 1 the second, word 2 the weight. So
// the bits depend on the parameter's index in the whole model and the step
// only: the same on every backend, thread count and resume.
struct AdamWRounding {
    std::uint64_t seed = 0;
    std::int64_t first_index = 0;  // the model-wide index of element 0 of this call
};

// The per-call constants of PyTorch's AdamW (torch.optim.AdamW, single-tensor
// path), formed in double as PyTorch forms them from Python floats; both
// backends' kernels read these.
struct AdamWConstants {
    float beta2, one_minus_beta1, one_minus_beta2, eps, grad_scale;
    float decay;      // 1 - lr * weight_decay
    float step_size;  // lr / (1 - beta1^step)
    float bc2_sqrt;   // sqrt(1 - beta2^step)
};

inline AdamWConstants adamw_constants(float lr, float beta1, float beta2, float eps, float weight_decay, int step,
                                      float grad_scale) {
    const double bias_correction1 = 1.0 - std::pow(double(beta1), step);
    const double bias_correction2 = 1.0 - std::pow(double(beta2), step);
    return AdamWConstants{
        beta2,
        static_cast<float>(1.0 - double(beta1)),
        static_cast<float>(1.0 - double(beta2)),
        eps,
        grad_scale,
        static_cast<float>(1.0 - double(lr) * double(weight_decay)),
        static_cast<float>(double(lr) / bias_correction1),
        static_cast<float>(std::sqrt(bias_correction2)),
    };
}

// Throws ShapeError for n < 0 and ConfigError for step < 1 (steps count from
// 1: the bias corrections divide by 1 - beta^step).
inline void check_adamw(std::int64_t n, int step) {
    check_non_negative("adamw_update", {{"n", n}});
    if (step < 1) throw ConfigError("adamw_update: step = " + std::to_string(step) + ", but steps count from 1");
}

}  // namespace snug::ops
