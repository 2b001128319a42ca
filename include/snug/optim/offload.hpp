// OffloadedAdamW<Act, D>: AdamW with its state — master weights and moments,
// in any storage — in host memory and its update on the CPU, as ZeRO-Offload
// places it. The device keeps the working weights and the fp32 gradients
// only. One update, over the device's offload link (D::offload_link: a second
// stream on CUDA, cuda/offload_link.hpp):
//   the gradients go to the host a chunk at a time (chunks cut where AdamW
//   allows, AdamW::chunks), into one of two pinned slots;
//   the host backend's AdamW (vectorised, multi-threaded) updates a chunk
//   while the next one arrives, writing the new working weights into a
//   pinned host copy;
//   each updated chunk goes back at once; the compute stream waits for the
//   last before the next forward reads the weights.
// The arithmetic is AdamW's on the host backend, which gives the CUDA
// kernel's bits (tests/cuda/optim_test.cu), and AdamW's pieces give step()'s
// bits: an offloaded run equals one on the device, bit for bit, and a state
// file saved either way resumes the other way.
// On the host backend the device's memory is host memory: the state moves
// from the device's ledger to the host's and the update runs in place.
// Under ZeRO-1 a rank offloads its shard only: state, host copy of the
// weights and the traffic are the shard's (DeepSpeed's ZeRO-Offload
// likewise shards before it offloads).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "snug/core/buffer.hpp"
#include "snug/core/device.hpp"
#include "snug/core/memory_tracker.hpp"
#include "snug/host/offload_link.hpp"
#include "snug/meter/device.hpp"
#include "snug/ops/kernels.hpp"
#include "snug/optim/adamw.hpp"
#include "snug/optim/parameter_group.hpp"
#if defined(SNUG_CUDA_BACKEND)
#include "snug/cuda/offload_link.hpp"
#endif

namespace snug {

//   Act: the working weights' type (as AdamW's)
//   D:   the device tag whose memory holds the working weights and gradients
template <class Act, DeviceTag D>
class OffloadedAdamW {
    using Link = typename D::offload_link;
    using H = typename Link::host_device;        // where the state lives and the update runs
    using Pinned = typename Link::pinned_device;  // the staging buffers

public:
    // The state starts as AdamW's does: master weights from `initial` (host
    // fp32) when given, else from the device's working weights `params` (n).
    // Host bytes (state and staging) are recorded in `host_tracker`. With a
    // shard (ZeRO-1), as AdamW: the state of those parameters only.
    OffloadedAdamW(const D& dev, MemoryTracker& host_tracker, std::int64_t n, std::vector<ParameterGroup> groups,
                   const AdamWConfig& config, const Act* params, const std::vector<float>* initial,
                   ParameterShard shard = {})
        : weights_(host_tracker, MemoryCategory::parameters, Link::shares_memory ? 0 : count(shard_size(n, shard)),
                   "offload: host copy of the working weights"),
          state_(make_state(dev, host_tracker, n, std::move(groups), config, params, initial, shard)),
          chunks_(state_.chunks(config.offload_chunk)),
          grads_(host_tracker, MemoryCategory::gradients, Link::shares_memory ? 0 : Link::slots * count(longest()),
                 "offload: gradient chunks in flight") {}

    // One update of the device's `params` from its `grads` (fp32), multiplied
    // by grad_scale first, as AdamW::step: both point at parameter first()
    // and hold size() values.
    void step(const D& dev, Act* params, const float* grads, float lr, float grad_scale = 1.0f) {
        state_.begin_update();
        const std::int64_t first = state_.first();
        if constexpr (Link::shares_memory) {
            state_.update_range(H{}, params, grads, lr, grad_scale, first, first + state_.size());
        } else {
            if (chunks_.empty()) return;
            link_.begin(dev);
            const std::int64_t slot_size = longest();
            auto slot = [&](std::size_t k) { return grads_.data() + static_cast<std::int64_t>(k % Link::slots) * slot_size; };
            // Chunks count parameters from 0; the buffers from first.
            auto fetch = [&](std::size_t k) {
                const auto [a, b] = chunks_[k];
                link_.download(static_cast<int>(k % Link::slots), slot(k), grads + (a - first), b - a);
            };
            fetch(0);
            for (std::size_t k = 0; k < chunks_.size(); ++k) {
                if (k + 1 < chunks_.size()) fetch(k + 1);  // arrives while this chunk is computed on
                link_.wait(static_cast<int>(k % Link::slots));
                const auto [a, b] = chunks_[k];
                state_.update_range(H{}, weights_.data() + (a - first), slot(k), lr, grad_scale, a, b);
                link_.upload(params + (a - first), weights_.data() + (a - first), b - a);
            }
            link_.end(dev);
        }
    }

    // The device's working weights `params` (n, the whole model's) changed
    // outside step() (a state file was loaded): the host copy the update
    // starts from follows them.
    void weights_loaded(const D& dev, const Act* params) {
        if constexpr (!Link::shares_memory) download(dev, weights_.data(), params + state_.first(), state_.size());
    }

    const AdamWConfig& config() const { return state_.config(); }
    int steps() const { return state_.steps(); }
    void set_steps(int steps) { state_.set_steps(steps); }
    std::int64_t size() const { return state_.size(); }
    std::int64_t first() const { return state_.first(); }
    bool has_master() const { return state_.has_master(); }
    // Host pointers (or nullptr, as AdamW's).
    float* master() { return state_.master(); }
    float* first_moment() { return state_.first_moment(); }
    float* second_moment() { return state_.second_moment(); }
    // AdamW's buffers, in host memory.
    std::vector<StateBuffer> state_buffers() {
        std::vector<StateBuffer> out = state_.state_buffers();
        for (StateBuffer& b : out) b.on_host = true;
        return out;
    }
    // The pieces one update moves and computes on, in order.
    const std::vector<std::pair<std::int64_t, std::int64_t>>& chunks() const { return chunks_; }

private:
    static std::size_t count(std::int64_t n) { return static_cast<std::size_t>(n); }
    // The shard's parameters, clipped to [0, n) (AdamW then checks the shard itself).
    static std::int64_t shard_size(std::int64_t n, ParameterShard shard) {
        const std::int64_t end = shard.end < 0 ? n : std::min(shard.end, n);
        return std::max<std::int64_t>(0, end - std::max<std::int64_t>(0, shard.begin));
    }

    std::int64_t longest() const {
        std::int64_t m = 0;
        for (const auto& [a, b] : chunks_) m = std::max(m, b - a);
        return m;
    }

    AdamW<Act, H> make_state(const D& dev, MemoryTracker& host_tracker, std::int64_t n, std::vector<ParameterGroup> groups,
                             const AdamWConfig& config, const Act* params, const std::vector<float>* initial,
                             ParameterShard shard) {
        if (config.offload_chunk < 1)
            throw ConfigError("AdamW offload: offload_chunk = " + std::to_string(config.offload_chunk) +
                              " parameters per transfer must be at least 1");
        // The host copy of the shard's weights starts as the device's (the
        // update writes it in place when there is no master).
        if constexpr (!Link::shares_memory)
            download(dev, weights_.data(), params + std::max<std::int64_t>(0, shard.begin),
                     static_cast<std::int64_t>(weights_.size()));
        if (initial != nullptr)
            return AdamW<Act, H>(H{}, host_tracker, n, std::move(groups), config, *initial, shard);
        if constexpr (Link::shares_memory) {
            return AdamW<Act, H>(H{}, host_tracker, n, std::move(groups), config, params, shard);
        } else {
            using Working = typename AdamW<Act, H>::ShardWorking;
            return AdamW<Act, H>(H{}, host_tracker, n, std::move(groups), config, Working{weights_.data()}, shard);
        }
    }

    Buffer<Act, Pinned> weights_;  // (size()) the shard's working weights on the host: what the update writes and uploads
    AdamW<Act, H> state_;
    std::vector<std::pair<std::int64_t, std::int64_t>> chunks_;
    Buffer<float, Pinned> grads_;  // (slots, longest chunk) gradient chunks as they arrive
    [[no_unique_address]] Link link_;
};

}  // namespace snug
