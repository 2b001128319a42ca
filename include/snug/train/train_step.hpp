// TrainStep: one optimizer update, composed from three static policies.
//
//   using Step = snug::TrainStep<snug::GPT<snug::half, snug::Cuda>,
//                                snug::precision::Fp16<snug::DynamicLossScaler>,
//                                snug::accumulate::Steps,
//                                snug::checkpoint::EveryNth<2>>;
//
// step() reads top to bottom as the flow of one update:
//   plan recomputation for (B, T)                        (CheckpointPolicy)
//   for each micro-batch: forward (loss × scale / (n · ranks)), backward, gradients add
//                         up in fp32, the loss adds up on the device (read once per update)
//   data parallel:        gradients and loss summed over the ranks (dist::Communicator):
//                         each rank now holds the mean gradient of the global batch;
//                         a communicator that overlaps (NCCL) starts each block's sums
//                         as soon as the last backward is past that block;
//                         ZeRO-1 (TrainConfig::shards): the gradients reduce-scattered,
//                         each rank checks, measures and updates its shard, the
//                         weights all-gathered
//   at the boundary: unscale + finite check in one pass  (PrecisionPolicy's loss scaler)
//                    global norm, clip factor
//                    overflow → skip: weights, moments and step count untouched
//                    else AdamW (state as TrainConfig::adamw stores it: fp32, bf16 or
//                    8-bit moments, fp32 master or none; on the device, or offloaded:
//                    gradients to the host, the update on the CPU, weights back)
//                    and the working copy cast
//                    the scaler's update
// Every buffer it owns comes from the MemoryTracker.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "snug/accumulate/policies.hpp"
#include "snug/checkpoint/policies.hpp"
#include "snug/core/buffer.hpp"
#include "snug/core/memory_tracker.hpp"
#include "snug/dist/communicator.hpp"
#include "snug/nn/activation_peak.hpp"
#include "snug/nn/context.hpp"
#include "snug/nn/layer_stack.hpp"
#include "snug/ops/kernels.hpp"
#include "snug/optim/grad_norm.hpp"
#include "snug/optim/optimizer.hpp"
#include "snug/precision/policies.hpp"

namespace snug {

// What TrainStep needs from a model (GPT models it; so can a user's:
// examples/custom_layer).
template <class M>
concept TrainableModel = requires(M& m, const M& cm, Context<typename M::device_type>& ctx, const std::int32_t* ids,
                                  double* loss_sum, std::span<const Recompute> modes) {
    typename M::value_type;
    typename M::device_type;
    // The mean loss; with loss_sum (device memory), the summed token losses
    // are added there instead and nothing is read back.
    { m.forward(ctx, ids, ids, 1, 1, 1.0f) } -> std::same_as<float>;
    { m.forward(ctx, ids, ids, 1, 1, 1.0f, loss_sum) } -> std::same_as<float>;
    m.backward(ctx, ids);
    m.zero_grad(ctx.device);
    { m.parameters() } -> std::same_as<typename M::value_type*>;
    { m.gradients() } -> std::same_as<float*>;
    { cm.num_parameters() } -> std::convertible_to<std::int64_t>;
    { cm.parameter_groups() } -> std::same_as<std::vector<ParameterGroup>>;
    { cm.num_blocks() } -> std::convertible_to<int>;
    m.set_recompute(modes);
    // The checkpoint policies' question is answered on the model's Meter twin.
    requires MeterableModel<M>;
};

// A model whose backward says when each block's gradients are final, and
// where each block's parameters lie (GPT and CausalLM do): data-parallel
// gradient sums then overlap the backward. Other models sum after it.
template <class M>
concept BlockwiseBackward = requires(M& m, const M& cm, Context<typename M::device_type>& ctx,
                                     const std::int32_t* ids, const AfterBlock& after, int l) {
    m.backward(ctx, ids, after);
    { cm.block_parameters(l) } -> std::same_as<std::vector<ParameterRange>>;
};

// One micro-batch: token ids and next-token targets, (B, T) each, in the
// model's device memory.
struct MicroBatch {
    const std::int32_t* tokens;
    const std::int32_t* targets;
};

// What one update did.
struct StepResult {
    float loss;          // mean training loss over the update's tokens (every rank's)
    float grad_norm;     // global L2 norm of the (unscaled) gradient, before clipping
    float loss_scale;    // the scale used for this update (1 without a scaler)
    bool skipped;        // the gradient was not finite: nothing was updated
    std::int64_t tokens; // tokens processed (by every rank together)
};

struct TrainConfig {
    AdamWConfig adamw{};
    float max_grad_norm = 1.0f;  // <= 0: no clipping
    // ZeRO-1: the optimizer's state (master weights, moments) sharded over
    // `shards` data-parallel ranks, this rank keeping shard `shard` (its
    // rank); 1: every rank keeps all of it. Needs data_parallel() with a
    // communicator of that many ranks.
    int shards = 1;
    int shard = 0;
};

// Whether a model's blocks can recompute selectively: it says so with a
// static constexpr supports_selective() (GPT does; a model of user layers
// returns SelectiveLayer<its block>). One that does not say, cannot.
template <class Model>
constexpr bool recomputes_selectively() {
    if constexpr (requires { Model::supports_selective(); })
        return Model::supports_selective();
    else
        return false;
}

//   Model:        a TrainableModel, e.g. snug::GPT<Precision::compute_type, D>
//   Precision:    precision::Fp32, precision::Bf16, precision::Fp16<Scaler>
//   Accumulation: accumulate::None, accumulate::Steps
//   Checkpoint:   checkpoint::None, Full, EveryNth<K>, Selective, Budget
template <TrainableModel Model, PrecisionPolicy Precision, AccumulationPolicy Accumulation, CheckpointPolicy Checkpoint>
class TrainStep : public Precision, public Accumulation, public Checkpoint {
    static_assert(std::is_same_v<typename Model::value_type, typename Precision::compute_type>,
                  "snug::TrainStep: the model's activation type must be the precision policy's compute type "
                  "(GPT<float, D> with precision::Fp32, GPT<bfloat16, D> with precision::Bf16, "
                  "GPT<half, D> with precision::Fp16<Scaler>)");
    static_assert(!std::is_same_v<Checkpoint, checkpoint::Selective> || recomputes_selectively<Model>(),
                  "snug::TrainStep: checkpoint::Selective needs a model whose blocks recompute selectively "
                  "(a block with set_selective(bool), see snug::SelectiveLayer, and a static constexpr "
                  "supports_selective() on the model that returns true); use checkpoint::Full or "
                  "checkpoint::Budget for this model");

public:
    using Act = typename Model::value_type;
    using D = typename Model::device_type;

    // The optimizer's master weights start from `initial_weights` (host fp32,
    // what the model was loaded with).
    TrainStep(Model& model, MemoryTracker& tracker, const D& dev, const std::vector<float>& initial_weights,
              TrainConfig config = {}, Precision precision = {}, Accumulation accumulation = {},
              Checkpoint checkpoint = {})
        : Precision(std::move(precision)),
          Accumulation(std::move(accumulation)),
          Checkpoint(std::move(checkpoint)),
          model_(model),
          config_(config),
          cuts_(shard_cuts(model, config)),
          optimizer_(dev, tracker, model.num_parameters(), model.parameter_groups(), config.adamw,
                     static_cast<const Act*>(model.parameters()), &initial_weights,
                     ParameterShard{cuts_[config.shard], cuts_[config.shard + 1]}),
          grad_norm_(tracker),
          found_inf_(tracker, MemoryCategory::workspace, 1, "loss scaler overflow flag"),
          loss_sum_(tracker, MemoryCategory::workspace, 1, "the update's summed loss") {}

    // The optimizer's master weights start from the model's working weights
    // (widened to fp32 on the device): nothing of the model's size on the
    // host, which is how the planner builds a step on snug::Meter.
    TrainStep(Model& model, MemoryTracker& tracker, const D& dev, TrainConfig config = {}, Precision precision = {},
              Accumulation accumulation = {}, Checkpoint checkpoint = {})
        : Precision(std::move(precision)),
          Accumulation(std::move(accumulation)),
          Checkpoint(std::move(checkpoint)),
          model_(model),
          config_(config),
          cuts_(shard_cuts(model, config)),
          optimizer_(dev, tracker, model.num_parameters(), model.parameter_groups(), config.adamw,
                     static_cast<const Act*>(model.parameters()), nullptr,
                     ParameterShard{cuts_[config.shard], cuts_[config.shard + 1]}),
          grad_norm_(tracker),
          found_inf_(tracker, MemoryCategory::workspace, 1, "loss scaler overflow flag"),
          loss_sum_(tracker, MemoryCategory::workspace, 1, "the update's summed loss") {}

    StepResult step(Context<D>& ctx, std::span<const MicroBatch> micro_batches, int B, int T, float lr) {
        const int n = this->steps();
        if (static_cast<int>(micro_batches.size()) != n)
            throw Error("TrainStep: " + std::to_string(micro_batches.size()) + " micro-batches for an update of " +
                        std::to_string(n) + " (the accumulation policy's steps)");
        plan_recompute(B, T);
        const D& dev = ctx.device;
        const float scale = loss_scale();
        const int ranks = this->ranks();
        // Over ranks too: the sum over the ranks below is then the mean
        // gradient of the global batch of ranks · n · B sequences.
        const float dloss = scale / (static_cast<float>(B) * static_cast<float>(T) * static_cast<float>(n) *
                                     static_cast<float>(ranks));

        model_.zero_grad(dev);
        // The loss adds up on the device and is read once, below.
        fill_zero(dev, loss_sum_.data(), 1);
        const bool overlap = overlaps_backward();
        for (int i = 0; i < n; ++i) {
            const MicroBatch& mb = micro_batches[static_cast<std::size_t>(i)];
            (void)model_.forward(ctx, mb.tokens, mb.targets, B, T, dloss, loss_sum_.data());
            if constexpr (BlockwiseBackward<Model>) {
                // In the last backward each block's gradients are final once
                // it is past that block: their sums start there.
                if (overlap && i == n - 1) {
                    model_.backward(ctx, mb.tokens, [&](int l) {
                        start_gradient_sums(dev, blocks_.ranges[static_cast<std::size_t>(l)]);
                    });
                    continue;
                }
            }
            model_.backward(ctx, mb.tokens);
        }
        return update(ctx, lr, scale, std::int64_t{n} * B * T * ranks, overlap);
    }

    // The loss scale the next update will use (1 without a scaler).
    float loss_scale() const {
        if constexpr (Precision::has_loss_scaler)
            return this->scaler.scale();
        else
            return 1.0f;
    }
    std::int64_t skipped_steps() const { return skipped_; }
    // Continues the skipped-update count of a saved training state (train/state_file.hpp).
    void restore_skipped_steps(std::int64_t n) {
        if (n < 0) throw ConfigError("TrainStep: skipped steps = " + std::to_string(n) + " must be >= 0");
        skipped_ = n;
    }
    // Data parallel from the next step on: every rank of `comm` runs this
    // step on its own micro-batches (B, T each); gradients and loss are
    // summed over the ranks, so each rank updates the same weights with the
    // mean gradient of all ranks' tokens. `comm` must outlive the step.
    // With TrainConfig::shards > 1 (ZeRO-1) the communicator must have that
    // many ranks, this one being TrainConfig::shard.
    void data_parallel(dist::Communicator<D>& comm) {
        if (config_.shards > 1 && (comm.size() != config_.shards || comm.rank() != config_.shard))
            throw ConfigError("TrainStep: the optimizer is sharded for rank " + std::to_string(config_.shard) +
                              " of " + std::to_string(config_.shards) + " (ZeRO-1), but the communicator is rank " +
                              std::to_string(comm.rank()) + " of " + std::to_string(comm.size()));
        blocks_ = block_ranges(model_);
        comm_ = comm.size() > 1 ? &comm : nullptr;
    }
    // Whether the optimizer's state is sharded across ranks (ZeRO-1).
    bool sharded() const { return config_.shards > 1; }
    // Rank r keeps the optimizer state of parameters [cuts[r], cuts[r + 1]).
    std::span<const std::int64_t> shard_cuts() const { return cuts_; }
    // The ranks the step averages over (1 without data_parallel).
    int ranks() const { return comm_ ? comm_->size() : 1; }
    // Whether the gradient sums run during the last backward, block by block
    // (a BlockwiseBackward model and a communicator that overlaps_backward).
    bool overlaps_backward() const { return BlockwiseBackward<Model> && comm_ && comm_->overlaps_backward(); }

    Optimizer<Act, D>& optimizer() { return optimizer_; }
    const TrainConfig& config() const { return config_; }
    Model& model() { return model_; }
    // The recompute plan in force (after the first step at a shape).
    std::span<const Recompute> recompute_plan() const { return plan_; }

private:
    // Checked here, before any buffer exists.
    static std::vector<std::int64_t> shard_cuts(const Model& model, const TrainConfig& c) {
        if (c.shards < 1 || c.shard < 0 || c.shard >= c.shards)
            throw ConfigError("TrainStep: shard " + std::to_string(c.shard) + " of " + std::to_string(c.shards) +
                              " (ZeRO-1): need 0 <= shard < shards");
        return AdamW<Act, D>::shard_cuts(model.num_parameters(), model.parameter_groups(), c.shards);
    }

    // Each block's parameter ranges, and the ranges in no block (embeddings,
    // final norm: their gradients are final only at the end of the backward).
    struct BlockRanges {
        std::vector<std::vector<ParameterRange>> ranges;  // (blocks)
        std::vector<ParameterRange> rest;
    };
    // Checked here: blocks' ranges inside the buffer and not shared.
    static BlockRanges block_ranges(const Model& model) {
        const std::int64_t P = model.num_parameters();
        if constexpr (!BlockwiseBackward<Model>) {
            return {{}, {{0, P}}};
        } else {
            BlockRanges out;
            std::vector<std::pair<ParameterRange, int>> all;
            for (int l = 0; l < model.num_blocks(); ++l) {
                out.ranges.push_back(model.block_parameters(l));
                for (const ParameterRange& r : out.ranges.back()) {
                    if (r.offset < 0 || r.count < 0 || r.offset + r.count > P)
                        throw Error("TrainStep: block " + std::to_string(l) + "'s parameters [" +
                                    std::to_string(r.offset) + ", " + std::to_string(r.offset + r.count) +
                                    ") lie outside the model's " + std::to_string(P));
                    all.push_back({r, l});
                }
            }
            // Stable: blocks that claim the same parameter are named in order.
            std::stable_sort(all.begin(), all.end(),
                             [](const auto& x, const auto& y) { return x.first.offset < y.first.offset; });
            std::int64_t at = 0;
            for (std::size_t i = 0; i < all.size(); ++i) {
                const ParameterRange r = all[i].first;
                if (r.offset < at)
                    throw Error("TrainStep: blocks " + std::to_string(all[i - 1].second) + " and " +
                                std::to_string(all[i].second) + " both claim parameter " + std::to_string(r.offset));
                if (r.offset > at) out.rest.push_back({at, r.offset - at});
                at = r.offset + r.count;
            }
            if (at < P) out.rest.push_back({at, P - at});
            return out;
        }
    }

    // Starts summing these ranges of the gradient over the ranks (this
    // rank's part of each under ZeRO-1).
    void start_gradient_sums(const D& dev, std::span<const ParameterRange> ranges) {
        comm_->start_sums(dev, model_.gradients(), ranges,
                          sharded() ? std::span<const std::int64_t>(cuts_) : std::span<const std::int64_t>(),
                          sharded() ? "gradient reduce-scatter" : "gradient all-reduce");
    }

    // The boundary, after the last backward. This rank's part [a, b) of the
    // gradient — all of it, [0, P), unless the optimizer's state is sharded
    // (ZeRO-1) — is summed over the ranks, unscaled and checked, its squared
    // norm taken (and added over the ranks' shards), and updated; a sharded
    // update then gathers every rank's part of the weights. (On snug::Meter,
    // which only counts bytes, there are no other ranks: no collectives.)
    StepResult update(Context<D>& ctx, float lr, float scale, std::int64_t tokens, bool overlapped) {
        const D& dev = ctx.device;
        if (sharded() && comm_ == nullptr && !std::is_same_v<D, Meter>)
            throw ConfigError("TrainStep: the optimizer is sharded over " + std::to_string(config_.shards) +
                              " ranks (ZeRO-1): call data_parallel() with their communicator first");
        const std::int64_t a = cuts_[config_.shard], b = cuts_[config_.shard + 1];
        // Whether this rank holds only a part: its checks and norm are then partial too.
        const bool partial = sharded() && comm_ != nullptr;
        float* grads = model_.gradients();
        if (comm_) {
            // What the backward did not start: the rest, or all of it.
            const ParameterRange whole{0, model_.num_parameters()};
            start_gradient_sums(dev, overlapped ? std::span<const ParameterRange>(blocks_.rest)
                                                : std::span<const ParameterRange>(&whole, 1));
            comm_->finish_sums(dev, sharded() ? "gradient reduce-scatter" : "gradient all-reduce");
            comm_->all_reduce_sum(dev, loss_sum_.data(), 1, "loss all-reduce");
        }
        bool found_inf = false;
        if constexpr (Precision::has_loss_scaler) {
            fill_zero(dev, found_inf_.data(), 1);
            unscale_and_check(dev, grads + a, b - a, 1.0f / scale, found_inf_.data());
            float flag = 0.0f;
            download(dev, &flag, found_inf_.data(), 1);
            found_inf = flag != 0.0f;
            if (partial) found_inf = comm_->ranks().any(found_inf, "overflow check");
        }
        double squares = grad_norm_.sum_of_squares(dev, grads + a, b - a);
        if (partial) squares = comm_->ranks().sum(squares, "squared gradient norm");
        const auto norm = static_cast<float>(std::sqrt(squares));
        // Without a scaler a non-finite gradient still must not reach the weights.
        found_inf = found_inf || !std::isfinite(norm);
        if (!found_inf) {
            optimizer_.step(dev, model_.parameters() + a, grads + a, lr, clip_factor(norm, config_.max_grad_norm));
            if (partial) comm_->all_gather(dev, model_.parameters(), cuts_, "weight all-gather");
        }
        if constexpr (Precision::has_loss_scaler) this->scaler.update(found_inf);
        if (found_inf) ++skipped_;
        double loss_sum = 0.0;
        download(dev, &loss_sum, loss_sum_.data(), 1);
        return {static_cast<float>(loss_sum / static_cast<double>(tokens)), norm, scale, found_inf, tokens};
    }

    void plan_recompute(int B, int T) {
        if (B == planned_B_ && T == planned_T_) return;
        CheckpointQuery query{model_.num_blocks(), [&](std::span<const Recompute> modes) {
                                  return predict_activation_peak(model_, B, T, modes);
                              }};
        query.selective_available = recomputes_selectively<Model>();
        plan_ = static_cast<const Checkpoint&>(*this).plan(query);
        model_.set_recompute(plan_);
        planned_B_ = B;
        planned_T_ = T;
    }

    Model& model_;
    TrainConfig config_;
    std::vector<std::int64_t> cuts_;  // (shards + 1) ZeRO-1's shard boundaries ({0, P} unsharded)
    Optimizer<Act, D> optimizer_;
    GradNorm<D> grad_norm_;
    Buffer<float, D> found_inf_;
    Buffer<double, D> loss_sum_;  // (1) this update's token losses, summed on the device
    BlockRanges blocks_;
    dist::Communicator<D>* comm_ = nullptr;  // data parallel over its ranks (null: one process)
    std::vector<Recompute> plan_;
    int planned_B_ = 0, planned_T_ = 0;
    std::int64_t skipped_ = 0;
};

}  // namespace snug
