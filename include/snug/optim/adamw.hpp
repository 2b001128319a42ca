// AdamW<Act, D>: the optimizer state for one contiguous parameter buffer —
// master weights (when the working weights are 16-bit), first and second
// moments, each in the storage the optimizer-memory policy (AdamWConfig's
// moments and master) asks for — and one fused update per parameter group
// (decay or not).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "snug/core/buffer.hpp"
#include "snug/core/dtype.hpp"
#include "snug/core/error.hpp"
#include "snug/core/half.hpp"
#include "snug/core/memory_tracker.hpp"
#include "snug/ops/adamw.hpp"
#include "snug/ops/kernels.hpp"
#include "snug/ops/moment_quantization.hpp"
#include "snug/optim/parameter_group.hpp"
#include "snug/optim/state_storage.hpp"

namespace snug {

// One buffer of an optimizer's state as stored, for a state file: its name,
// element type, device pointer and element count.
struct StateBuffer {
    std::string name;
    DType dtype;
    void* data;
    std::int64_t count;
    bool on_host = false;  // in host memory (an offloaded optimizer's), not the device's
};

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
    // Where the state lives and the update runs: false, the device; true, the
    // host (optim/offload.hpp), the gradients and weights moved a chunk of at
    // most offload_chunk parameters at a time.
    bool offload = false;
    std::int64_t offload_chunk = std::int64_t{1} << 22;
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
        begin_update();
        update_range(dev, params, grads, lr, grad_scale, 0, n_);
    }

    // The same update in pieces (what an offloaded optimizer does as the
    // gradients arrive, optim/offload.hpp): begin_update() once, then
    // update_range over pieces that cover [0, n) once each, in any order,
    // each cut where chunks() cuts. The result is step()'s, bit for bit: every
    // element's arithmetic and dice depend on its index only.
    void begin_update() { ++steps_; }

    // Updates parameters [begin, end): `params` and `grads` point at element
    // `begin` (end - begin each). Throws Error for a range outside [0, n) or
    // one that cuts an 8-bit group inside a quantisation block.
    void update_range(const D& dev, Act* params, const float* grads, float lr, float grad_scale, std::int64_t begin,
                      std::int64_t end) {
        if (begin < 0 || end > n_ || begin > end)
            throw Error("AdamW::update_range: [" + std::to_string(begin) + ", " + std::to_string(end) +
                        ") is not within [0, " + std::to_string(n_) + ")");
        for (const GroupState& s : groups_) {
            const std::int64_t a = std::max(begin, s.group.offset);
            const std::int64_t b = std::min(end, s.group.offset + s.group.count);
            if (a >= b) continue;
            if (s.quantized && ((a - s.group.offset) % ops::moment_block != 0 ||
                                (b != s.group.offset + s.group.count && (b - s.group.offset) % ops::moment_block != 0)))
                throw Error("AdamW::update_range: [" + std::to_string(begin) + ", " + std::to_string(end) +
                            ") cuts an 8-bit group (from " + std::to_string(s.group.offset) +
                            ") inside a block of " + std::to_string(ops::moment_block));
            update(dev, s, params + (a - begin), grads + (a - begin), lr, grad_scale, a, b);
        }
    }

    // Pieces of at most `max_count` parameters (rounded down to a whole number
    // of quantisation blocks, at least one) that tile [0, n) in order: each
    // group cut from its own start, so update_range accepts every piece.
    std::vector<std::pair<std::int64_t, std::int64_t>> chunks(std::int64_t max_count) const {
        const std::int64_t step = std::max<std::int64_t>(ops::moment_block, max_count / ops::moment_block * ops::moment_block);
        std::vector<std::pair<std::int64_t, std::int64_t>> out;
        for (const GroupState& s : groups_) {
            const std::int64_t end = s.group.offset + s.group.count;
            for (std::int64_t a = s.group.offset; a < end; a += step) out.emplace_back(a, std::min(end, a + step));
        }
        return out;
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
    // fp32 moments of every parameter (n); nullptr unless moments are fp32
    // (the other storages: state_buffers).
    float* first_moment() { return config_.moments == MomentStorage::fp32 ? m_.data() : nullptr; }
    float* second_moment() { return config_.moments == MomentStorage::fp32 ? v_.data() : nullptr; }

    // Every buffer of the state, in a fixed order, as stored: what a
    // training-state file saves and loads (train/state_file.hpp). Names:
    //   master_weights                 f32 (n), when has_master()
    //   first_moment, second_moment    f32 or bf16 (n): moments fp32 or bf16
    //   moments int8: first_moment_codes, first_moment_absmax, second_moment_codes,
    //   second_moment_absmax (u8 (Q), f32 (blocks), ... over the quantised
    //   groups), then first_moment, second_moment (f32, the other groups'
    //   n - Q parameters); groups in order, each from its own offset.
    std::vector<StateBuffer> state_buffers() {
        std::vector<StateBuffer> out;
        auto add = [&]<class T>(const char* name, Buffer<T, D>& b) {
            out.push_back({name, dtype_of<T>, b.data(), n_of(b)});
        };
        if (has_master()) add("master_weights", master_);
        switch (config_.moments) {
            case MomentStorage::fp32: add("first_moment", m_), add("second_moment", v_); break;
            case MomentStorage::bf16: add("first_moment", m16_), add("second_moment", v16_); break;
            case MomentStorage::int8:
                add("first_moment_codes", m8_), add("first_moment_absmax", m_absmax_);
                add("second_moment_codes", v8_), add("second_moment_absmax", v_absmax_);
                add("first_moment", m_), add("second_moment", v_);
                break;
        }
        return out;
    }

    // The bytes of optimizer state (moments, and absmax for int8) and of
    // master weights that this configuration keeps for n parameters in
    // these groups: what the constructor will ask of the tracker.
    static std::pair<std::size_t, std::size_t> state_bytes(std::int64_t n, const std::vector<ParameterGroup>& groups,
                                                           const AdamWConfig& config) {
        const Layout l = layout(n, groups, config);
        const auto u = [](std::int64_t x) { return static_cast<std::size_t>(x); };
        const std::size_t moments = 2 * (u(l.fp32) * sizeof(float) + u(l.bf16) * sizeof(bfloat16) + u(l.codes) +
                                         u(l.blocks) * sizeof(float));
        const std::size_t master =
            !std::is_same_v<Act, float> && config.master == MasterStorage::fp32 ? u(n) * sizeof(float) : 0;
        return {moments, master};
    }

private:
    // A parameter group and where its moments sit in the state buffers.
    struct GroupState {
        ParameterGroup group;
        bool quantized;            // 8-bit moments (int8 storage, a group with decay)
        std::int64_t state;        // its first moment element: in m_/v_, m16_/v16_ or m8_/v8_
        std::int64_t first_block;  // its first absmax (quantized groups)
    };

    // The element counts of each state buffer, and each group's place.
    struct Layout {
        std::int64_t fp32 = 0, bf16 = 0, codes = 0, blocks = 0;
        std::vector<GroupState> groups;
    };

    // Throws ShapeError unless the groups tile [0, n) in order. With int8
    // storage the groups with weight decay (2-D weights: embeddings and
    // matmuls) keep 8-bit moments; the others (biases, norms: small) keep
    // fp32 moments, as bitsandbytes keeps small tensors in 32 bits.
    static Layout layout(std::int64_t n, const std::vector<ParameterGroup>& groups, const AdamWConfig& config) {
        Layout l;
        std::int64_t covered = 0;
        for (const ParameterGroup& g : groups) {
            if (g.offset != covered || g.count < 0)
                throw ShapeError("AdamW: parameter groups must tile [0, " + std::to_string(n) +
                                 ") in order; a group starts at " + std::to_string(g.offset) + ", expected " +
                                 std::to_string(covered));
            covered += g.count;
            const bool quantized = config.moments == MomentStorage::int8 && g.decay;
            GroupState s{g, quantized, 0, 0};
            if (quantized) {
                s.state = l.codes;
                s.first_block = l.blocks;
                l.codes += g.count;
                l.blocks += ops::moment_blocks(g.count);
            } else if (config.moments == MomentStorage::bf16) {
                s.state = l.bf16;
                l.bf16 += g.count;
            } else {
                s.state = l.fp32;
                l.fp32 += g.count;
            }
            l.groups.push_back(s);
        }
        if (covered != n)
            throw ShapeError("AdamW: parameter groups cover " + std::to_string(covered) + " of " +
                             std::to_string(n) + " parameters");
        return l;
    }

    static std::size_t count_if(bool keep, std::int64_t n) { return keep ? static_cast<std::size_t>(n) : 0; }
    static std::size_t count(std::int64_t n) { return static_cast<std::size_t>(n); }

    // The buffers, the groups checked, the moments zeroed; master weights unset.
    AdamW(const D& dev, MemoryTracker& tracker, std::int64_t n, std::vector<ParameterGroup> groups,
          AdamWConfig config)
        : AdamW(dev, tracker, n, checked(config), layout(n, groups, config)) {}

    AdamW(const D& dev, MemoryTracker& tracker, std::int64_t n, AdamWConfig config, Layout layout)
        : config_(config),
          groups_(std::move(layout.groups)),
          n_(n),
          master_(tracker, MemoryCategory::master_weights, count_if(has_master(), n), "AdamW master weights"),
          m_(tracker, MemoryCategory::optimizer_state, count(layout.fp32), "AdamW first moment"),
          v_(tracker, MemoryCategory::optimizer_state, count(layout.fp32), "AdamW second moment"),
          m16_(tracker, MemoryCategory::optimizer_state, count(layout.bf16), "AdamW first moment (bf16)"),
          v16_(tracker, MemoryCategory::optimizer_state, count(layout.bf16), "AdamW second moment (bf16)"),
          m8_(tracker, MemoryCategory::optimizer_state, count(layout.codes), "AdamW first moment (8-bit codes)"),
          v8_(tracker, MemoryCategory::optimizer_state, count(layout.codes), "AdamW second moment (8-bit codes)"),
          m_absmax_(tracker, MemoryCategory::optimizer_state, count(layout.blocks), "AdamW first moment (absmax)"),
          v_absmax_(tracker, MemoryCategory::optimizer_state, count(layout.blocks), "AdamW second moment (absmax)") {
        // All-zero bytes are zero moments in every storage (code 0 with an
        // absmax of 0 reads back 0); the unused buffers are empty.
        fill_zero(dev, m_.data(), n_of(m_));
        fill_zero(dev, v_.data(), n_of(v_));
        fill_zero(dev, m16_.data(), n_of(m16_));
        fill_zero(dev, v16_.data(), n_of(v16_));
        fill_zero(dev, m8_.data(), n_of(m8_));
        fill_zero(dev, v8_.data(), n_of(v8_));
        fill_zero(dev, m_absmax_.data(), n_of(m_absmax_));
        fill_zero(dev, v_absmax_.data(), n_of(v_absmax_));
    }

    template <class T>
    static std::int64_t n_of(const Buffer<T, D>& b) {
        return static_cast<std::int64_t>(b.size());
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

    // One fused pass over parameters [a, b) of group s (`params` and `grads`
    // point at element a): the weights it updates in place (the master, or
    // the weights themselves), the working copy to refresh (or none), and the
    // moments as stored.
    void update(const D& dev, const GroupState& s, Act* params, const float* grads, float lr, float grad_scale,
                std::int64_t a, std::int64_t b) {
        const AdamWConfig& c = config_;
        const float wd = s.group.decay ? c.weight_decay : 0.0f;
        const std::int64_t count = b - a;
        const std::int64_t at = s.state + (a - s.group.offset);  // the first moment element
        const ops::AdamWRounding rounding{c.rounding_seed, a};
        auto run = [&](auto* weights, auto* working) {
            if (s.quantized) {
                const std::int64_t block = s.first_block + (a - s.group.offset) / ops::moment_block;
                const ops::BlockwiseMoments q{m8_.data() + at, m_absmax_.data() + block, v8_.data() + at,
                                              v_absmax_.data() + block};
                adamw_update_8bit(dev, weights, working, grads, q, count, lr, c.beta1, c.beta2, c.eps, wd, steps_,
                                  grad_scale, rounding);
            } else if (c.moments == MomentStorage::bf16) {
                adamw_update(dev, weights, working, grads, m16_.data() + at, v16_.data() + at, count, lr, c.beta1,
                             c.beta2, c.eps, wd, steps_, grad_scale, rounding);
            } else {
                adamw_update(dev, weights, working, grads, m_.data() + at, v_.data() + at, count, lr, c.beta1,
                             c.beta2, c.eps, wd, steps_, grad_scale, rounding);
            }
        };
        if (has_master())
            run(master_.data() + a, params);
        else if constexpr (std::is_same_v<Act, float> || std::is_same_v<Act, bfloat16>)
            run(params, static_cast<float*>(nullptr));
    }

    AdamWConfig config_;
    std::vector<GroupState> groups_;
    std::int64_t n_;
    int steps_ = 0;
    Buffer<float, D> master_;
    Buffer<float, D> m_;  // fp32 moments: every parameter's, or (int8) the unquantised groups'
    Buffer<float, D> v_;
    Buffer<bfloat16, D> m16_;
    Buffer<bfloat16, D> v16_;
    Buffer<std::uint8_t, D> m8_;  // int8: the quantised groups' codes and absmax per block
    Buffer<std::uint8_t, D> v8_;
    Buffer<float, D> m_absmax_;
    Buffer<float, D> v_absmax_;
};

}  // namespace snug
