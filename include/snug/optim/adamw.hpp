// AdamW<Act, D>: the optimizer state for one contiguous parameter buffer — fp32
// master weights (when the working weights are 16-bit), first and second
// moments — and one fused update per parameter group (decay or not).
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "snug/core/buffer.hpp"
#include "snug/core/error.hpp"
#include "snug/core/memory_tracker.hpp"
#include "snug/ops/kernels.hpp"
#include "snug/optim/parameter_group.hpp"

namespace snug {

// PyTorch AdamW's hyper-parameters (GPT-2 / llm.c defaults for betas). The
// learning rate is not among them: it changes every update (a schedule), so
// step() takes it.
struct AdamWConfig {
    float beta1 = 0.9f;
    float beta2 = 0.95f;
    float eps = 1e-8f;
    float weight_decay = 0.1f;
};

//   Act: the working weights' type; for 16-bit types AdamW keeps fp32 master
//        weights and rounds the working copy from them after every update
//   D:   device tag
template <class Act, DeviceTag D>
class AdamW {
public:
    // Master weights start from `initial` (host fp32, as the model was loaded
    // from); moments start at zero. Every byte is recorded in the tracker.
    AdamW(const D& dev, MemoryTracker& tracker, std::int64_t n, std::vector<ParameterGroup> groups,
          AdamWConfig config, const std::vector<float>& initial)
        : AdamW(dev, tracker, n, std::move(groups), config) {
        if constexpr (has_master) {
            if (static_cast<std::int64_t>(initial.size()) != n)
                throw ShapeError("AdamW: " + std::to_string(initial.size()) + " initial master weights for " +
                                 std::to_string(n) + " parameters");
            upload(dev, master_.data(), initial.data(), n);
        }
    }

    // Master weights start from the working weights `working` (n, device
    // memory; widened to fp32, as llm.c does), so nothing of the model's size
    // is needed on the host.
    AdamW(const D& dev, MemoryTracker& tracker, std::int64_t n, std::vector<ParameterGroup> groups,
          AdamWConfig config, const Act* working)
        : AdamW(dev, tracker, n, std::move(groups), config) {
        if constexpr (has_master) cast(dev, master_.data(), working, n);
    }

    // One update of `params` (n) from `grads` (n, fp32), which are first
    // multiplied by grad_scale (loss-scale unscaling and clipping in one factor).
    void step(const D& dev, Act* params, const float* grads, float lr, float grad_scale = 1.0f) {
        ++steps_;
        for (const ParameterGroup& g : groups_) {
            const float wd = g.decay ? config_.weight_decay : 0.0f;
            if constexpr (has_master) {
                adamw_update(dev, master_.data() + g.offset, params + g.offset, grads + g.offset, m_.data() + g.offset,
                             v_.data() + g.offset, g.count, lr, config_.beta1, config_.beta2, config_.eps, wd, steps_,
                             grad_scale);
            } else {
                adamw_update(dev, params + g.offset, nullptr, grads + g.offset, m_.data() + g.offset,
                             v_.data() + g.offset, g.count, lr, config_.beta1, config_.beta2, config_.eps, wd, steps_,
                             grad_scale);
            }
        }
    }

    const AdamWConfig& config() const { return config_; }
    int steps() const { return steps_; }
    // Restores the step count (resuming from a checkpoint).
    void set_steps(int steps) { steps_ = steps; }
    std::int64_t size() const { return n_; }
    // fp32 master weights; nullptr when Act is float (the parameters are the master).
    float* master() { return has_master ? master_.data() : nullptr; }
    float* first_moment() { return m_.data(); }
    float* second_moment() { return v_.data(); }

private:
    static constexpr bool has_master = !std::is_same_v<Act, float>;

    // The buffers, the groups checked, the moments zeroed; master weights unset.
    AdamW(const D& dev, MemoryTracker& tracker, std::int64_t n, std::vector<ParameterGroup> groups,
          AdamWConfig config)
        : config_(config),
          groups_(std::move(groups)),
          n_(n),
          master_(tracker, MemoryCategory::master_weights, has_master ? static_cast<std::size_t>(n) : 0,
                  "AdamW master weights"),
          m_(tracker, MemoryCategory::optimizer_state, static_cast<std::size_t>(n), "AdamW first moment"),
          v_(tracker, MemoryCategory::optimizer_state, static_cast<std::size_t>(n), "AdamW second moment") {
        std::int64_t covered = 0;
        for (const ParameterGroup& g : groups_) {
            if (g.offset != covered || g.count < 0)
                throw ShapeError("AdamW: parameter groups must tile [0, " + std::to_string(n) +
                                 ") in order; a group starts at " + std::to_string(g.offset) + ", expected " +
                                 std::to_string(covered));
            covered += g.count;
        }
        if (covered != n)
            throw ShapeError("AdamW: parameter groups cover " + std::to_string(covered) + " of " +
                             std::to_string(n) + " parameters");
        fill_zero(dev, m_.data(), n);
        fill_zero(dev, v_.data(), n);
    }

    AdamWConfig config_;
    std::vector<ParameterGroup> groups_;
    std::int64_t n_;
    int steps_ = 0;
    Buffer<float, D> master_;
    Buffer<float, D> m_;
    Buffer<float, D> v_;
};

}  // namespace snug
