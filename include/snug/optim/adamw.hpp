// AdamW<Act, D>: the optimizer state for one contiguous parameter buffer —
// master weights (when the working weights are 16-bit), first and second
// moments, each in the storage the optimizer-memory policy (AdamWConfig's
// moments and master) asks for — and one fused update per parameter group
// (decay or not).
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "snug/core/buffer.hpp"
#include "snug/core/error.hpp"
#include "snug/core/half.hpp"
#include "snug/core/memory_tracker.hpp"
#include "snug/ops/adamw.hpp"
#include "snug/ops/kernels.hpp"
#include "snug/optim/parameter_group.hpp"
#include "snug/optim/state_storage.hpp"

namespace snug {

// PyTorch AdamW's hyper-parameters (GPT-2 / llm.c defaults for betas), and
// the state's storage (the optimizer-memory policy, optim/state_storage.hpp). The learning
// rate is not among them: it changes every update (a schedule), so step()
// takes it.
struct AdamWConfig {
    float beta1 = 0.9f;
    float beta2 = 0.95f;
    float eps = 1e-8f;
    float weight_decay = 0.1f;
    MomentStorage moments = MomentStorage::fp32;
    MasterStorage master = MasterStorage::fp32;
    std::uint64_t rounding_seed = 0x5eed'a11d'c0de'0017;  // stochastic rounding's stream (lean storage only)
};

//   Act: the working weights' type; for 16-bit types AdamW keeps fp32 master
//        weights and rounds the working copy from them after every update,
//        unless config.master is none (bf16 only: the weights are updated
//        in place, stochastically rounded)
//   D:   device tag
template <class Act, DeviceTag D>
class AdamW {
public:
    // Master weights start from `initial` (host fp32, as the model was loaded
    // from); moments start at zero. Every byte is recorded in the tracker.
    AdamW(const D& dev, MemoryTracker& tracker, std::int64_t n, std::vector<ParameterGroup> groups,
          AdamWConfig config, const std::vector<float>& initial)
        : AdamW(dev, tracker, n, std::move(groups), config) {
        if (has_master()) {
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
        if (has_master()) cast(dev, master_.data(), working, n);
    }

    // One update of `params` (n) from `grads` (n, fp32), which are first
    // multiplied by grad_scale (loss-scale unscaling and clipping in one factor).
    void step(const D& dev, Act* params, const float* grads, float lr, float grad_scale = 1.0f) {
        ++steps_;
        if (config_.moments == MomentStorage::fp32)
            update(dev, params, grads, m_.data(), v_.data(), lr, grad_scale);
        else
            update(dev, params, grads, m16_.data(), v16_.data(), lr, grad_scale);
    }

    const AdamWConfig& config() const { return config_; }
    int steps() const { return steps_; }
    // Restores the step count (resuming from a checkpoint).
    void set_steps(int steps) { steps_ = steps; }
    std::int64_t size() const { return n_; }
    // Whether an fp32 master copy exists (16-bit weights with master fp32).
    bool has_master() const { return !std::is_same_v<Act, float> && config_.master == MasterStorage::fp32; }
    // fp32 master weights; nullptr without a copy (fp32 weights are the
    // master; master none).
    float* master() { return has_master() ? master_.data() : nullptr; }
    // fp32 moments; nullptr when they are kept in bf16 (see visit_moments).
    float* first_moment() { return config_.moments == MomentStorage::fp32 ? m_.data() : nullptr; }
    float* second_moment() { return config_.moments == MomentStorage::fp32 ? v_.data() : nullptr; }
    // Calls f(m, v) with the moments as stored: float* or bfloat16*, (n) each.
    template <class F>
    decltype(auto) visit_moments(F&& f) {
        if (config_.moments == MomentStorage::fp32) return f(m_.data(), v_.data());
        return f(m16_.data(), v16_.data());
    }

private:
    static std::size_t count_if(bool keep, std::int64_t n) { return keep ? static_cast<std::size_t>(n) : 0; }

    // The buffers, the groups checked, the moments zeroed; master weights unset.
    AdamW(const D& dev, MemoryTracker& tracker, std::int64_t n, std::vector<ParameterGroup> groups,
          AdamWConfig config)
        : config_(checked(config)),
          groups_(std::move(groups)),
          n_(n),
          master_(tracker, MemoryCategory::master_weights, count_if(has_master(), n), "AdamW master weights"),
          m_(tracker, MemoryCategory::optimizer_state, count_if(config.moments == MomentStorage::fp32, n),
             "AdamW first moment"),
          v_(tracker, MemoryCategory::optimizer_state, count_if(config.moments == MomentStorage::fp32, n),
             "AdamW second moment"),
          m16_(tracker, MemoryCategory::optimizer_state, count_if(config.moments == MomentStorage::bf16, n),
               "AdamW first moment (bf16)"),
          v16_(tracker, MemoryCategory::optimizer_state, count_if(config.moments == MomentStorage::bf16, n),
               "AdamW second moment (bf16)") {
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
        visit_moments([&](auto* m, auto* v) {
            fill_zero(dev, m, n);
            fill_zero(dev, v, n);
        });
    }

    // Throws ConfigError for a master-less run of weights that cannot have one.
    static AdamWConfig checked(const AdamWConfig& c) {
        if (c.master == MasterStorage::none) {
            if constexpr (std::is_same_v<Act, float>)
                throw ConfigError("AdamW: master none: fp32 weights are their own master (there is no copy to "
                                  "drop); use it with bf16 weights");
            else if constexpr (!std::is_same_v<Act, bfloat16>)
                throw ConfigError("AdamW: master none needs bf16 weights (stochastic rounding is built for "
                                  "bfloat16 only); keep fp32 master weights with fp16");
        }
        return c;
    }

    // One fused pass per parameter group, moments of type M.
    template <class M>
    void update(const D& dev, Act* params, const float* grads, M* m, M* v, float lr, float grad_scale) {
        const AdamWConfig& c = config_;
        for (const ParameterGroup& g : groups_) {
            const float wd = g.decay ? c.weight_decay : 0.0f;
            const std::int64_t o = g.offset;
            const ops::AdamWRounding rounding{c.rounding_seed, o};
            if (has_master()) {
                adamw_update(dev, master_.data() + o, params + o, grads + o, m + o, v + o, g.count, lr, c.beta1,
                             c.beta2, c.eps, wd, steps_, grad_scale, rounding);
            } else if constexpr (std::is_same_v<Act, float> || std::is_same_v<Act, bfloat16>) {
                adamw_update(dev, params + o, nullptr, grads + o, m + o, v + o, g.count, lr, c.beta1, c.beta2, c.eps,
                             wd, steps_, grad_scale, rounding);
            }
        }
    }

    AdamWConfig config_;
    std::vector<ParameterGroup> groups_;
    std::int64_t n_;
    int steps_ = 0;
    Buffer<float, D> master_;
    Buffer<float, D> m_;
    Buffer<float, D> v_;
    Buffer<bfloat16, D> m16_;
    Buffer<bfloat16, D> v16_;
};

}  // namespace snug
