// Optimizer<Act, D>: the optimizer a TrainStep updates its weights with —
// AdamW with its state on the device (optim/adamw.hpp), or offloaded to the
// host (optim/offload.hpp), as AdamWConfig::offload places it. The placement
// is chosen at run time, like the state's storage: it changes where bytes
// live and which processor computes, not the arithmetic (both give the same
// bits), so it is not a type of its own. Host bytes are recorded in the
// optimizer's own ledger (host_memory()), apart from the device's.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "snug/core/memory_tracker.hpp"
#include "snug/optim/adamw.hpp"
#include "snug/optim/offload.hpp"
#include "snug/optim/parameter_group.hpp"

namespace snug {

template <class Act, DeviceTag D>
class Optimizer {
public:
    // Device bytes go to `tracker`, host bytes to host_memory(). The state
    // starts as AdamW's: master weights from `initial` (host fp32) when given,
    // else from the working weights `params` (n, device memory). With a shard
    // (ZeRO-1), the state of those parameters only (on the device, or
    // offloaded: then the host holds the shard's).
    Optimizer(const D& dev, MemoryTracker& tracker, std::int64_t n, std::vector<ParameterGroup> groups,
              const AdamWConfig& config, const Act* params, const std::vector<float>* initial,
              ParameterShard shard = {}) {
        if (config.offload)
            host_.emplace(dev, host_tracker_, n, std::move(groups), config, params, initial, shard);
        else if (initial != nullptr)
            device_.emplace(dev, tracker, n, std::move(groups), config, *initial, shard);
        else
            device_.emplace(dev, tracker, n, std::move(groups), config, params, shard);
    }
    Optimizer(const Optimizer&) = delete;
    Optimizer& operator=(const Optimizer&) = delete;

    // One update (AdamW::step).
    void step(const D& dev, Act* params, const float* grads, float lr, float grad_scale = 1.0f) {
        if (host_)
            host_->step(dev, params, grads, lr, grad_scale);
        else
            device_->step(dev, params, grads, lr, grad_scale);
    }

    // Whether the state lives in host memory.
    bool offloaded() const { return host_.has_value(); }
    // The host bytes of an offloaded optimizer (state and staging), by category.
    const MemoryTracker& host_memory() const { return host_tracker_; }

    const AdamWConfig& config() const { return host_ ? host_->config() : device_->config(); }
    int steps() const { return host_ ? host_->steps() : device_->steps(); }
    void set_steps(int steps) { host_ ? host_->set_steps(steps) : device_->set_steps(steps); }
    std::int64_t size() const { return host_ ? host_->size() : device_->size(); }
    bool has_master() const { return host_ ? host_->has_master() : device_->has_master(); }
    // As AdamW's, in host memory when offloaded (see state_buffers' on_host).
    float* master() { return host_ ? host_->master() : device_->master(); }
    float* first_moment() { return host_ ? host_->first_moment() : device_->first_moment(); }
    float* second_moment() { return host_ ? host_->second_moment() : device_->second_moment(); }
    std::vector<StateBuffer> state_buffers() { return host_ ? host_->state_buffers() : device_->state_buffers(); }

    // The device's working weights were overwritten (a state file loaded):
    // an offloaded optimizer's host copy follows them.
    void weights_loaded(const D& dev, const Act* params) {
        if (host_) host_->weights_loaded(dev, params);
    }

private:
    MemoryTracker host_tracker_;  // before host_: it outlives the buffers it records
    std::optional<AdamW<Act, D>> device_;
    std::optional<OffloadedAdamW<Act, D>> host_;
};

}  // namespace snug
