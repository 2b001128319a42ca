// PrecisionPolicy: the number formats of a training step. A policy names the
// compute type (activations and working weights); the optimizer keeps fp32
// master weights whenever that type is 16-bit; fp16 carries a loss scaler.
// LayerNorm statistics, softmax and the loss, optimizer state and gradient
// accumulation stay fp32 under every policy.
//   Fp32                fp32 everywhere
//   Bf16                bf16 compute, fp32 master weights; bf16's range needs no loss scaling
//   Fp16<Scaler>        fp16 compute, fp32 master weights, Scaler = DynamicLossScaler or StaticLossScaler
#pragma once

#include <concepts>

#include "snug/core/half.hpp"
#include "snug/precision/loss_scaler.hpp"

namespace snug {

template <class P>
concept PrecisionPolicy = requires {
    typename P::compute_type;
    { P::name } -> std::convertible_to<const char*>;
    { P::has_loss_scaler } -> std::convertible_to<bool>;
};

namespace precision {

// Fp32 and Bf16 take no loss scaler: fp32 and bf16 gradients have fp32's
// range and do not underflow, so scaling them only adds work.
struct Fp32 {
    using compute_type = float;
    static constexpr const char* name = "fp32";
    static constexpr bool has_loss_scaler = false;
};

struct Bf16 {
    using compute_type = bfloat16;
    static constexpr const char* name = "bf16";
    static constexpr bool has_loss_scaler = false;
};

//   Scaler: the loss scaler (snug::DynamicLossScaler, snug::StaticLossScaler)
template <class Scaler>
struct Fp16 {
    static_assert(LossScaler<Scaler>,
                  "snug::precision::Fp16<Scaler>: Scaler must be a loss scaler (snug::DynamicLossScaler or "
                  "snug::StaticLossScaler): fp16 gradients underflow without loss scaling");
    using compute_type = half;
    using scaler_type = Scaler;
    static constexpr const char* name = "fp16";
    static constexpr bool has_loss_scaler = true;

    Scaler scaler{};
};

}  // namespace precision
}  // namespace snug
