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
// element type, device pointer and element count. An optimizer that keeps a
// shard of the parameters (ZeRO-1) holds elements [offset, offset + count)
// of the whole model's buffer of `total` elements.
struct StateBuffer {
    std::string name;
    DType dtype;
    void* data;
    std::int64_t count;
    bool on_host = false;  // in host memory (an offloaded optimizer's), not the device's
    std::int64_t offset = 0;
    std::int64_t total = -1;  // -1: count (the whole buffer)
    std::int64_t whole() const { return total < 0 ? count : total; }
};
// The name of the master weights' buffer among an optimizer's state_buffers().
inline constexpr const char* master_weights_buffer = "master_weights";

// The parameters [begin, end) whose optimizer state one rank keeps under
// ZeRO-1 (dist/: each rank updates its shard, the weights are then
// gathered); {0, -1} is every parameter.
struct ParameterShard {
    std::int64_t begin = 0;
    std::int64_t end = -1;  // -1: the last parameter
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
    // A shard's own working weights (see the constructor that takes it).
    struct ShardWorking {
        const Act* values;
    };

    // Master weights start from `initial` (host fp32, as the model was loaded
    // from); moments start at zero. Every byte is recorded in the tracker.
    // With a shard (ZeRO-1): the state of parameters [shard.begin, shard.end)
    // only; n, the groups and `initial` are still the whole model's.
    AdamW(const D& dev, MemoryTracker& tracker, std::int64_t n, std::vector<ParameterGroup> groups,
          AdamWConfig config, const std::vector<float>& initial, ParameterShard shard = {})
        : AdamW(dev, tracker, n, std::move(groups), config, shard) {
        if (has_master()) {
            if (static_cast<std::int64_t>(initial.size()) != n)
                throw ShapeError("AdamW: " + std::to_string(initial.size()) + " initial master weights for " +
                                 std::to_string(n) + " parameters");
            upload(dev, master_.data(), initial.data() + begin_, n_);
        }
    }

    // Master weights start from the working weights `working` (n, device
    // memory; widened to fp32, as llm.c does), so nothing of the model's size
    // is needed on the host.
    AdamW(const D& dev, MemoryTracker& tracker, std::int64_t n, std::vector<ParameterGroup> groups,
          AdamWConfig config, const Act* working, ParameterShard shard = {})
        : AdamW(dev, tracker, n, std::move(groups), config, shard) {
        if (has_master()) cast(dev, master_.data(), working + begin_, n_);
    }

    // The same from the shard's working weights alone (size() values, from
    // parameter shard.begin): what an offloaded shard holds on the host.
    AdamW(const D& dev, MemoryTracker& tracker, std::int64_t n, std::vector<ParameterGroup> groups,
          AdamWConfig config, ShardWorking working, ParameterShard shard)
        : AdamW(dev, tracker, n, std::move(groups), config, shard) {
        if (has_master()) cast(dev, master_.data(), working.values, n_);
    }

    // One update of `params` from `grads` (fp32), which are first multiplied
    // by grad_scale (loss-scale unscaling and clipping in one factor); both
    // point at parameter first() and hold size() values (the whole model's
    // unsharded, n from 0).
    void step(const D& dev, Act* params, const float* grads, float lr, float grad_scale = 1.0f) {
        begin_update();
        update_range(dev, params, grads, lr, grad_scale, begin_, begin_ + n_);
    }

    // The same update in pieces (what an offloaded optimizer does as the
    // gradients arrive, optim/offload.hpp): begin_update() once, then
    // update_range over pieces that cover [0, n) once each, in any order,
    // each cut where chunks() cuts. The result is step()'s, bit for bit: every
    // element's arithmetic and dice depend on its index only.
    void begin_update() { ++steps_; }

    // Updates parameters [begin, end): `params` and `grads` point at element
    // `begin` (end - begin each). Throws Error for a range outside the shard
    // ([0, n) unsharded) or one that cuts an 8-bit group inside a quantisation block.
    void update_range(const D& dev, Act* params, const float* grads, float lr, float grad_scale, std::int64_t begin,
                      std::int64_t end) {
        if (begin < begin_ || end > begin_ + n_ || begin > end)
            throw Error("AdamW::update_range: [" + std::to_string(begin) + ", " + std::to_string(end) +
                        ") is not within [" + std::to_string(begin_) + ", " + std::to_string(begin_ + n_) + ")");
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
    // of quantisation blocks, at least one) that tile the shard in order: each
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

    // Cut points 0 = c[0] <= c[1] <= ... <= c[count] = n that split the
    // parameters into `count` shards of about n / count each, every cut at a
    // group's start or a whole number of quantisation blocks into a group, so
    // a shard of any storage holds whole blocks: rank r keeps [c[r], c[r + 1]).
    static std::vector<std::int64_t> shard_cuts(std::int64_t n, const std::vector<ParameterGroup>& groups, int count) {
        if (count < 1) throw ConfigError("AdamW::shard_cuts: " + std::to_string(count) + " shards; at least 1");
        std::vector<std::int64_t> cuts{0};
        for (int r = 1; r < count; ++r) {
            const std::int64_t target = n / count * r + n % count * r / count;
            std::int64_t cut = n;
            for (const ParameterGroup& g : groups)
                if (target >= g.offset && target < g.offset + g.count) {
                    cut = g.offset + (target - g.offset) / ops::moment_block * ops::moment_block;
                    break;
                }
            cuts.push_back(std::max(cut, cuts.back()));
        }
        cuts.push_back(n);
        return cuts;
    }

    const AdamWConfig& config() const { return config_; }
    int steps() const { return steps_; }
    // Restores the step count (resuming from a checkpoint).
    void set_steps(int steps) { steps_ = steps; }
    // The parameters whose state this optimizer keeps: [first(), first() + size()).
    std::int64_t size() const { return n_; }
    std::int64_t first() const { return begin_; }
    // Whether it keeps a part of the parameters only (ZeRO-1).
    bool sharded() const { return n_ != total_; }
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
    // A shard's buffers are each a contiguous part of the whole model's
    // (StateBuffer::offset and total say which).
    std::vector<StateBuffer> state_buffers() {
        std::vector<StateBuffer> out;
        auto add = [&]<class T>(const char* name, Buffer<T, D>& b, Extent e) {
            out.push_back({name, dtype_of<T>, b.data(), n_of(b), false, e.at, e.total});
        };
        const Layout& l = layout_;
        if (has_master()) add(master_weights_buffer, master_, Extent{begin_, total_, n_});
        switch (config_.moments) {
            case MomentStorage::fp32: add("first_moment", m_, l.fp32), add("second_moment", v_, l.fp32); break;
            case MomentStorage::bf16: add("first_moment", m16_, l.bf16), add("second_moment", v16_, l.bf16); break;
            case MomentStorage::int8:
                add("first_moment_codes", m8_, l.codes), add("first_moment_absmax", m_absmax_, l.blocks);
                add("second_moment_codes", v8_, l.codes), add("second_moment_absmax", v_absmax_, l.blocks);
                add("first_moment", m_, l.fp32), add("second_moment", v_, l.fp32);
                break;
        }
        return out;
    }

    // The bytes of optimizer state (moments, and absmax for int8) and of
    // master weights that this configuration keeps for n parameters in
    // these groups: what the constructor will ask of the tracker.
    static std::pair<std::size_t, std::size_t> state_bytes(std::int64_t n, const std::vector<ParameterGroup>& groups,
                                                           const AdamWConfig& config, ParameterShard shard = {}) {
        const Layout l = layout(n, groups, config, shard);
        const auto u = [](std::int64_t x) { return static_cast<std::size_t>(x); };
        const std::size_t moments = 2 * (u(l.fp32.count) * sizeof(float) + u(l.bf16.count) * sizeof(bfloat16) +
                                         u(l.codes.count) + u(l.blocks.count) * sizeof(float));
        const std::size_t master = !std::is_same_v<Act, float> && config.master == MasterStorage::fp32
                                       ? u(l.end - l.begin) * sizeof(float)
                                       : 0;
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

    // A state buffer: the shard's element count, the whole model's elements
    // before the shard, and the whole model's count.
    struct Extent {
        std::int64_t at = 0, total = 0, count = 0;
    };
    // The shard, each state buffer's extent, and each group's place (groups
    // cut to the shard, their offsets still the model's).
    struct Layout {
        std::int64_t begin = 0, end = 0;
        Extent fp32, bf16, codes, blocks;
        std::vector<GroupState> groups;
    };

    // Throws ShapeError unless the groups tile [0, n) in order, and for a
    // shard outside [0, n) or one that cuts an 8-bit group inside a block.
    // With int8 storage the groups with weight decay (2-D weights: embeddings
    // and matmuls) keep 8-bit moments; the others (biases, norms: small) keep
    // fp32 moments, as bitsandbytes keeps small tensors in 32 bits.
    static Layout layout(std::int64_t n, const std::vector<ParameterGroup>& groups, const AdamWConfig& config,
                         ParameterShard shard) {
        Layout l;
        l.begin = shard.begin;
        l.end = shard.end < 0 ? n : shard.end;
        if (l.begin < 0 || l.begin > l.end || l.end > n)
            throw ShapeError("AdamW: the shard [" + std::to_string(shard.begin) + ", " + std::to_string(shard.end) +
                             ") is not within the " + std::to_string(n) + " parameters");
        std::int64_t covered = 0;
        for (const ParameterGroup& g : groups) {
            if (g.offset != covered || g.count < 0)
                throw ShapeError("AdamW: parameter groups must tile [0, " + std::to_string(n) +
                                 ") in order; a group starts at " + std::to_string(g.offset) + ", expected " +
                                 std::to_string(covered));
            covered += g.count;
            const bool quantized = config.moments == MomentStorage::int8 && g.decay;
            // The group's part in the shard: [a, b).
            const std::int64_t a = std::clamp(l.begin, g.offset, g.offset + g.count);
            const std::int64_t b = std::clamp(l.end, g.offset, g.offset + g.count);
            auto inside_block = [&](std::int64_t x) {
                return x != g.offset && x != g.offset + g.count && (x - g.offset) % ops::moment_block != 0;
            };
            if (quantized && (inside_block(a) || inside_block(b)))
                throw ShapeError("AdamW: the shard [" + std::to_string(l.begin) + ", " + std::to_string(l.end) +
                                 ") cuts an 8-bit group (from " + std::to_string(g.offset) + ") inside a block of " +
                                 std::to_string(ops::moment_block) + " (AdamW::shard_cuts gives cuts that do not)");
            Extent& e = quantized ? l.codes : config.moments == MomentStorage::bf16 ? l.bf16 : l.fp32;
            const GroupState s{{a, b - a, g.decay}, quantized, e.count, l.blocks.count};
            e.at += a - g.offset;
            e.count += b - a;
            e.total += g.count;
            if (quantized) {
                l.blocks.at += ops::moment_blocks(a - g.offset);
                l.blocks.count += ops::moment_blocks(b - a);
                l.blocks.total += ops::moment_blocks(g.count);
            }
            if (a < b) l.groups.push_back(s);
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
          AdamWConfig config, ParameterShard shard)
        : AdamW(dev, tracker, n, checked(config), layout(n, groups, config, shard)) {}

    AdamW(const D& dev, MemoryTracker& tracker, std::int64_t n, AdamWConfig config, Layout layout)
        : config_(config),
          groups_(std::move(layout.groups)),
          layout_(std::move(layout)),
          begin_(layout_.begin),
          n_(layout_.end - layout_.begin),
          total_(n),
          master_(tracker, MemoryCategory::master_weights, count_if(has_master(), n_), "AdamW master weights"),
          m_(tracker, MemoryCategory::optimizer_state, count(layout_.fp32.count), "AdamW first moment"),
          v_(tracker, MemoryCategory::optimizer_state, count(layout_.fp32.count), "AdamW second moment"),
          m16_(tracker, MemoryCategory::optimizer_state, count(layout_.bf16.count), "AdamW first moment (bf16)"),
          v16_(tracker, MemoryCategory::optimizer_state, count(layout_.bf16.count), "AdamW second moment (bf16)"),
          m8_(tracker, MemoryCategory::optimizer_state, count(layout_.codes.count), "AdamW first moment (8-bit codes)"),
          v8_(tracker, MemoryCategory::optimizer_state, count(layout_.codes.count), "AdamW second moment (8-bit codes)"),
          m_absmax_(tracker, MemoryCategory::optimizer_state, count(layout_.blocks.count), "AdamW first moment (absmax)"),
          v_absmax_(tracker, MemoryCategory::optimizer_state, count(layout_.blocks.count),
                    "AdamW second moment (absmax)") {
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
            run(master_.data() + (a - begin_), params);
        else if constexpr (std::is_same_v<Act, float> || std::is_same_v<Act, bfloat16>)
            run(params, static_cast<float*>(nullptr));
    }

    AdamWConfig config_;
    std::vector<GroupState> groups_;  // (moved out of the layout before it is kept)
    Layout layout_;                   // the shard and the buffers' extents
    std::int64_t begin_;              // the shard's first parameter (0 unsharded)
    std::int64_t n_;                  // the shard's parameters
    std::int64_t total_;              // the model's parameters
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
