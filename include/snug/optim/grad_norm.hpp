// Global gradient norm and the clipping factor that PyTorch's
// clip_grad_norm_ applies, folded into AdamW's grad_scale instead of a
// separate pass over the gradients.
#pragma once

#include <cmath>
#include <cstdint>

#include "snug/core/buffer.hpp"
#include "snug/core/memory_tracker.hpp"
#include "snug/ops/kernels.hpp"

namespace snug {

// max_norm / (norm + 1e-6), capped at 1, as torch.nn.utils.clip_grad_norm_;
// max_norm <= 0 disables clipping. A non-finite norm gives 1: the caller
// (the loss scaler) decides what to do with a non-finite step.
inline float clip_factor(float norm, float max_norm) {
    if (max_norm <= 0.0f || !std::isfinite(norm)) return 1.0f;
    const float f = max_norm / (norm + 1e-6f);
    return f < 1.0f ? f : 1.0f;
}

// Computes ||g||₂ over a device buffer; owns the one-float device scalar the
// reduction writes to.
template <DeviceTag D>
class GradNorm {
public:
    explicit GradNorm(MemoryTracker& tracker)
        : scalar_(tracker, MemoryCategory::workspace, 1, "gradient norm scalar") {}

    // `scale` multiplies the gradients first (e.g. 1 / loss scale).
    float operator()(const D& dev, const float* grads, std::int64_t n, float scale = 1.0f) {
        return std::sqrt(sum_of_squares(dev, grads, n)) * scale;
    }
    // Σ g² over grads (n): a shard's part of the squared norm (ZeRO-1).
    float sum_of_squares(const D& dev, const float* grads, std::int64_t n) {
        if (n == 0) return 0.0f;  // an empty shard
        sum_squares(dev, scalar_.data(), grads, n);
        float sum = 0.0f;
        download(dev, &sum, scalar_.data(), 1);
        return sum;
    }

private:
    Buffer<float, D> scalar_;
};

}  // namespace snug
