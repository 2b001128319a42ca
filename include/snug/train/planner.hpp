// The memory planner: what a GPT training run will hold, per MemoryCategory,
// before anything is allocated — measured, not estimated: predict_memory()
// builds the run as examples/train_gpt builds it (its workspace, GPT,
// token buffers, TrainStep and arenas) on snug::Meter, the metering device,
// and runs one update, an evaluation and a sampling pass of the real code.
// The tracker of that run is the prediction, to the byte, and a Meter ledger
// adds what the device itself would reserve (arena chunks, allocation
// granularity, the CUDA context). There is no memory formula here: a new
// layer or technique is planned the moment it runs.
//
// On top of it, the searches: the largest micro-batch for a budget, the
// configuration `--plan` recommends (following the order of operations) and
// the largest model of a family that fits.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "snug/checkpoint/policies.hpp"
#include "snug/core/bytes.hpp"
#include "snug/core/error.hpp"
#include "snug/core/half.hpp"
#include "snug/core/memory_tracker.hpp"
#include "snug/nn/gpt_config.hpp"
#include "snug/meter/device.hpp"
#include "snug/nn/activation_peak.hpp"
#include "snug/nn/causal_lm.hpp"
#include "snug/nn/gpt.hpp"
#include "snug/nn/model_of.hpp"
#include "snug/nn/layer_stack.hpp"
#include "snug/precision/kind.hpp"
#include "snug/precision/policies.hpp"
#include "snug/train/memory_plan.hpp"
#include "snug/train/train_step.hpp"

namespace snug {

// The activation peak of one forward + backward at (B, T) under `modes` of
// the model `c` builds (GPT, a CausalLM: model_of), in the precision named at
// run time, measured on snug::Meter (nn/activation_peak.hpp).
template <class Config>
std::size_t activation_peak(const Config& c, PrecisionKind precision, int B, int T, std::span<const Recompute> modes) {
    return visit_precision(precision, [&]<class P>() {
        return metered_activation_peak<model_of<Config, typename P::compute_type, Meter>>(c, B, T, modes);
    });
}

// Whether the blocks of the model `c` builds recompute selectively
// (Recompute::selective; GPT's do).
template <class Config>
constexpr bool config_recomputes_selectively() {
    return recomputes_selectively<model_of<Config, float, Meter>>();
}

// What training `Model` (any device; a MeterableModel such as GPT or a
// user's model) built from `config` under `Precision` holds, per category and
// in total, with what the device reserves: the run RunShape describes,
// measured on the model's Meter twin. Shapes the model refuses throw its own
// errors.
template <MeterableModel Model, PrecisionPolicy Precision, class Config>
MemoryPlan predict_training_memory(const Config& config, const RunShape& in) {
    using MeterModel = typename Model::template on_device<Meter>;
    if (in.micro_batch < 1 || in.seq < 1 || in.accumulation < 1 || in.sampling_window < 0)
        throw ConfigError("memory plan: micro-batch " + std::to_string(in.micro_batch) + ", seq " +
                          std::to_string(in.seq) + ", accumulation " + std::to_string(in.accumulation) +
                          " must be at least 1 and the sampling window " + std::to_string(in.sampling_window) +
                          " at least 0");
    const DeviceReservation device = in.device.value_or(DeviceReservation{});
    meter::Ledger ledger(device.granularity);
    MemoryTracker tracker;
    const Meter dev{in.fused};
    Buffer<std::byte, Meter> backend(tracker, MemoryCategory::workspace, in.backend_workspace, "cuBLASLt workspace");
    ActivationArena<Meter> activations(tracker);
    ActivationArena<Meter> scratch(tracker, ActivationArena<Meter>::default_chunk_bytes, MemoryCategory::temporaries);
    Context<Meter> ctx{dev, activations, scratch};

    MeterModel model(config, tracker);
    const std::size_t BT = static_cast<std::size_t>(in.micro_batch) * static_cast<std::size_t>(in.seq);
    const std::size_t ids = static_cast<std::size_t>(in.accumulation) * BT;
    Buffer<std::int32_t, Meter> tokens(tracker, MemoryCategory::workspace, ids, "token ids");
    Buffer<std::int32_t, Meter> targets(tracker, MemoryCategory::workspace, ids, "target ids");
    TrainConfig train_config;
    train_config.adamw.moments = in.moments;
    train_config.adamw.master = in.master;
    train_config.adamw.offload = in.offload;
    // ZeRO-1: the rank whose shard of the optimizer's state is the largest
    // (the shards differ by less than a quantisation block).
    if (in.zero_ranks < 1) throw ConfigError("memory plan: " + std::to_string(in.zero_ranks) + " ZeRO-1 ranks");
    train_config.shards = in.zero_ranks;
    const std::vector<std::int64_t> cuts = AdamW<typename MeterModel::value_type, Meter>::shard_cuts(
        model.num_parameters(), model.parameter_groups(), in.zero_ranks);
    for (int r = 0; r < in.zero_ranks; ++r)
        if (cuts[r + 1] - cuts[r] > cuts[train_config.shard + 1] - cuts[train_config.shard]) train_config.shard = r;
    TrainStep<MeterModel, Precision, accumulate::Steps, checkpoint::Given> step(
        model, tracker, dev, train_config, Precision{}, accumulate::Steps(in.accumulation),
        checkpoint::Given{in.modes(model.num_blocks())});
    std::vector<MicroBatch> batches;
    for (std::size_t m = 0; m < static_cast<std::size_t>(in.accumulation); ++m)
        batches.push_back({tokens.data() + m * BT, targets.data() + m * BT});

    // Each phase that raises the peak names the moment.
    std::string moment = "before training: when \"" + tracker.peak_allocation() + "\" is allocated";
    auto phase = [&](const char* name, auto&& run) {
        const std::size_t before = tracker.peak_total();
        run();
        if (tracker.peak_total() > before)
            moment = std::string(name) + ": when \"" + tracker.peak_allocation() + "\" is allocated";
    };
    phase("training", [&] { (void)step.step(ctx, batches, in.micro_batch, in.seq, 0.0f); });
    // Evaluation and sampling, for a model that has them (GPT does).
    if constexpr (requires { model.evaluate(ctx, tokens.data(), targets.data(), 1, 1); })
        phase("evaluation", [&] { (void)model.evaluate(ctx, tokens.data(), targets.data(), in.micro_batch, in.seq); });
    if constexpr (!requires { model.forward_last(ctx, tokens.data(), 1, 1); }) {
        if (in.sampling_window > 0)
            throw ConfigError("memory plan: a sampling window for a model without forward_last() (no sampling pass)");
    } else if (in.sampling_window > 0) {
        phase("sampling", [&] {
            Buffer<std::int32_t, Meter> window(tracker, MemoryCategory::workspace,
                                               static_cast<std::size_t>(in.sampling_window), "sampling window");
            model.forward_last(ctx, window.data(), 1, in.sampling_window);
            model.release(ctx);
        });
    }

    MemoryPlan plan;
    for (MemoryCategory c : all_memory_categories) plan.peak[static_cast<std::size_t>(c)] = tracker.peak(c);
    plan.total = tracker.peak_total();
    plan.at_total_peak = tracker.peak_breakdown();
    plan.peak_moment = moment;
    plan.context = device.context;
    plan.reserved = ledger.peak_bytes() + plan.context;
    plan.required = in.device ? plan.reserved : plan.total;
    plan.host = step.optimizer().host_memory().peak_total();
    return plan;
}

// The peak of every category and of the total over training (an update of n
// micro-batches: forward, backward, unscale, gradient norm, AdamW),
// evaluation at (B, T), and sampling when the input has a window, measured by
// running them on snug::Meter; exact to the byte against the host tracker
// (tests/host/planner_test.cpp). `reserved` adds what the tracker does not
// see: arena chunks, the device's allocation granularity, its context.
template <class Config>
MemoryPlan predict_memory(const PlanInput<Config>& in) {
    in.validate();
    return visit_precision(in.precision, [&]<class P>() {
        return predict_training_memory<model_of<Config, typename P::compute_type, Meter>, P>(in.model, in);
    });
}

// How much the total peak grows per extra sequence in the micro-batch (at the
// input's T, modes and accumulation): the activations and temporaries of one
// sequence at the peak moment, and its n token and target ids. Everything
// else is fixed, so total(B) = total(1) + (B - 1) · this.
template <class Config>
std::size_t bytes_per_sequence(const PlanInput<Config>& in) {
    PlanInput<Config> one = in, two = in;
    one.micro_batch = 1;
    two.micro_batch = 2;
    return predict_memory(two).total - predict_memory(one).total;
}

// The largest B in [1, 2^24] for which fits(B) holds, for a fits that holds
// up to some B and not past it (memory grows with the micro-batch); 0 when
// fits(1) does not hold. Doubling, then bisection: O(log B) calls.
template <class Fits>
int largest_fitting(Fits&& fits) {
    if (!fits(1)) return 0;
    constexpr int cap = 1 << 24;
    int lo = 1;  // fits
    int hi = 2;  // to be tested
    while (hi <= cap && fits(hi)) {
        lo = hi;
        hi *= 2;
    }
    if (hi > cap) return lo;
    while (hi - lo > 1) {  // lo fits, hi does not
        const int mid = lo + (hi - lo) / 2;
        (fits(mid) ? lo : hi) = mid;
    }
    return lo;
}

// The largest micro-batch B whose predicted total fits `budget` (the input's
// T, modes and accumulation kept); 0 when even B = 1 does not fit.
template <class Config>
int largest_micro_batch(const PlanInput<Config>& in, std::size_t budget) {
    PlanInput<Config> probe = in;
    return largest_fitting([&](int B) {
        probe.micro_batch = B;
        return predict_memory(probe).required <= budget;
    });
}

// The same for any MeterableModel (a CausalLM of a user's blocks, say) built
// from `config` and trained under Precision at `shape`'s T, modes and
// accumulation: predict_training_memory measures each B on the Meter twin.
template <MeterableModel Model, PrecisionPolicy Precision, class Config>
int largest_micro_batch(const Config& config, RunShape shape, std::size_t budget) {
    return largest_fitting([&](int B) {
        shape.micro_batch = B;
        return predict_training_memory<Model, Precision>(config, shape).required <= budget;
    });
}

// The planner of a run `in` as a function of the run's shape (what the
// generic searches call): in's model and precision, shape's B, T, n, modes.
template <class Config>
auto plan_predictor(const PlanInput<Config>& in) {
    return [in](const RunShape& shape) {
        PlanInput<Config> probe = in;
        static_cast<RunShape&>(probe) = shape;
        return predict_memory(probe);
    };
}

// The number of blocks of a MeterableModel built from `config`, counted on
// its Meter twin (nothing of its size allocated).
template <MeterableModel Model, class Config>
int metered_blocks(const Config& config) {
    MemoryTracker tracker;
    const typename Model::template on_device<Meter> shape_only(config, tracker);
    return shape_only.num_blocks();
}

// ---- checkpoint policies -------------------------------------------------------------

// The modes `policy` picks for the model `c` builds at (B, T), asked exactly
// as TrainStep asks it (the same CheckpointQuery), so checkpoint::Budget gives
// the plan training will use.
template <CheckpointPolicy Policy, class Config>
std::vector<Recompute> plan_recompute(const Policy& policy, const Config& c, PrecisionKind precision, int B, int T) {
    CheckpointQuery query{c.n_layer, [&](std::span<const Recompute> modes) {
                              return activation_peak(c, precision, B, T, modes);
                          }};
    query.selective_available = config_recomputes_selectively<Config>();
    return policy.plan(query);
}

// A policy as train_gpt's --checkpoint writes it: none, full, selective,
// every:K, budget.
template <CheckpointPolicy Policy>
std::string checkpoint_label(const Policy&) {
    if constexpr (requires { Policy::k; })
        return "every:" + std::to_string(Policy::k);
    else
        return Policy::name;
}

namespace detail {
// EveryNth<K>'s plan for a K known at run time, K in [1, max_every].
inline constexpr int max_every = 16;
template <int... K>
std::vector<Recompute> every_nth_plan(int k, const CheckpointQuery& q, std::integer_sequence<int, K...>) {
    std::vector<Recompute> modes;
    (void)((k == K + 1 ? (modes = checkpoint::EveryNth<K + 1>{}.plan(q), true) : false) || ...);
    return modes;
}
}  // namespace detail

// The modes of a policy named as train_gpt's --checkpoint names it — none,
// full, selective, every:K (K from 1 to 16) — for `blocks` blocks, from the
// policy's own plan(). "auto" (checkpoint::Budget) depends on the shape and a
// byte budget: use plan_recompute(checkpoint::Budget(bytes), ...). Anything
// else throws ConfigError naming it.
inline std::vector<Recompute> recompute_plan_for(std::string_view checkpoint, int blocks) {
    const CheckpointQuery q{blocks, [](std::span<const Recompute>) { return std::size_t{0}; }};
    if (checkpoint == "none") return checkpoint::None{}.plan(q);
    if (checkpoint == "full") return checkpoint::Full{}.plan(q);
    if (checkpoint == "selective") return checkpoint::Selective{}.plan(q);
    if (checkpoint.substr(0, 6) == "every:") {
        const std::string digits(checkpoint.substr(6));
        int k = 0;
        bool ok = !digits.empty() && digits.size() <= 2;
        for (char ch : digits) {
            ok = ok && ch >= '0' && ch <= '9';
            k = k * 10 + (ch - '0');
        }
        if (ok && k >= 1 && k <= detail::max_every)
            return detail::every_nth_plan(k, q, std::make_integer_sequence<int, detail::max_every>{});
    }
    throw ConfigError("checkpoint '" + std::string(checkpoint) + "': expected none, full, selective or every:K with K "
                      "from 1 to " + std::to_string(detail::max_every) +
                      " (auto depends on a byte budget: plan it with checkpoint::Budget)");
}

// A policy the --plan search may choose, with its modes for one model.
struct CheckpointCandidate {
    std::string name;  // as checkpoint_label writes it
    std::vector<Recompute> recompute;
};

// The candidates of the --plan search, cheapest first. "Cheapest" is the
// compute recomputation adds (train/metrics.hpp's hardware FLOPs): none adds
// nothing; selective re-runs attention's QKᵀ and AV (4·C·T per token and
// block) plus element-wise work, no weight GEMM; every:4, every:3, every:2
// re-run a whole block forward (2·(12 C² + 13 C) + 4 C T) for a quarter, a
// third, half the blocks; full for all of them, a third more work per step.
// Selective before every:4 holds while 4·C·T·L < (L/4)·(24 C² + 4 C T), that is
// T < 2 C (GPT-2 small: 1024 < 1536), which is where these models train; at
// longer contexts the attention part grows and selective costs more.
// The candidates for a query (one per policy, asked as TrainStep asks);
// selective only where the query says the model can.
inline std::vector<CheckpointCandidate> checkpoint_candidates(const CheckpointQuery& query) {
    std::vector<CheckpointCandidate> out;
    auto add = [&](const auto& policy) { out.push_back({checkpoint_label(policy), policy.plan(query)}); };
    add(checkpoint::None{});
    if (query.selective_available) add(checkpoint::Selective{});
    add(checkpoint::EveryNth<4>{});
    add(checkpoint::EveryNth<3>{});
    add(checkpoint::EveryNth<2>{});
    add(checkpoint::Full{});
    return out;
}

// For the model `c` builds, in the precision named at run time.
template <class Config>
std::vector<CheckpointCandidate> checkpoint_candidates(const Config& c, PrecisionKind precision, int B, int T) {
    CheckpointQuery query{c.n_layer, [&](std::span<const Recompute> modes) {
                              return activation_peak(c, precision, B, T, modes);
                          }};
    query.selective_available = config_recomputes_selectively<Config>();
    return checkpoint_candidates(query);
}

// The same for any MeterableModel built from `config` (its blocks counted and
// its activation peaks measured on its Meter twin).
template <MeterableModel Model, class Config>
std::vector<CheckpointCandidate> checkpoint_candidates(const Config& config, int B, int T) {
    using MeterModel = typename Model::template on_device<Meter>;
    CheckpointQuery query{metered_blocks<Model>(config), [&](std::span<const Recompute> modes) {
                              return metered_activation_peak<MeterModel>(config, B, T, modes);
                          }};
    query.selective_available = recomputes_selectively<Model>();
    return checkpoint_candidates(query);
}

// --checkpoint auto: the plan for base's (B, T) whose whole run fits
// `budget` (activations, temporaries and everything else), taken in
// checkpoint::Budget's order of growing recompute (nothing; then selective
// for one block more at a time, where the model's blocks can; then full for
// one block more at a time): the first that fits. Each plan is judged by its
// predicted total, not by its activations alone: a plan that keeps fewer
// activations may need more temporaries (selective recomputation rebuilds
// into scratch), so a budget on activations would miss plans that fit.
// base's recompute is ignored. This one serves any model: its block count,
// whether its blocks recompute selectively, and predict(RunShape) ->
// MemoryPlan, that model's planner. Nothing fits: OutOfMemory, naming the
// budget and the smallest total any of these plans reaches.
template <class Predict>
std::vector<Recompute> auto_recompute(const RunShape& base, int blocks, bool selective_available,
                                      std::size_t budget, Predict&& predict) {
    // Budget's candidates in its order: with a budget of 0 it asks about each, then gives up.
    std::vector<std::vector<Recompute>> tried;
    CheckpointQuery recorder{blocks, [&](std::span<const Recompute> modes) {
                                 tried.emplace_back(modes.begin(), modes.end());
                                 return std::size_t{1};
                             }};
    recorder.selective_available = selective_available;
    try {
        (void)checkpoint::Budget(0).plan(recorder);
    } catch (const OutOfMemory&) {
        // expected: no plan keeps 0 bytes
    }
    RunShape probe = base;
    std::size_t smallest = static_cast<std::size_t>(-1);
    for (const std::vector<Recompute>& modes : tried) {
        probe.recompute = modes;
        const std::size_t total = predict(probe).required;
        if (total <= budget) return modes;
        smallest = std::min(smallest, total);
    }
    throw OutOfMemory("checkpoint auto: no recompute plan fits the budget of " + format_bytes(budget) + " (" +
                      std::to_string(budget) + " bytes) at micro-batch " + std::to_string(base.micro_batch) +
                      " x " + std::to_string(base.seq) + "; the smallest predicted peak of any plan is " +
                      format_bytes(smallest) + ": use a smaller micro-batch or a shorter context");
}

// For the input's model and precision.
template <class Config>
std::vector<Recompute> auto_recompute(const PlanInput<Config>& in, std::size_t budget) {
    in.validate();
    return auto_recompute(static_cast<const RunShape&>(in), in.model.n_layer, config_recomputes_selectively<Config>(),
                          budget, plan_predictor(in));
}

// The same for any MeterableModel built from `config` under Precision (its
// blocks counted on its Meter twin).
template <MeterableModel Model, PrecisionPolicy Precision, class Config>
std::vector<Recompute> auto_recompute(const Config& config, const RunShape& base, std::size_t budget) {
    return auto_recompute(base, metered_blocks<Model>(config), recomputes_selectively<Model>(), budget,
                          [&](const RunShape& shape) { return predict_training_memory<Model, Precision>(config, shape); });
}

// ---- the --plan search --------------------------------------------------------------

// The --plan search. From `base` it takes the model, precision, seq, backend
// workspace and sampling window (micro_batch, accumulation and recompute are
// chosen here). For each checkpoint policy from the cheapest
// (checkpoint_candidates' order) it finds the largest micro-batch B that
// divides wanted_batch and fits `budget` (accumulation = wanted_batch / B:
// accumulate only what does not fit); the first policy with any B wins:
// checkpoint only when even B = 1 does not fit without it. This one serves
// any model: its candidates (cheapest first) and predict(RunShape) ->
// MemoryPlan, that model's planner.
template <class Predict>
BudgetPlan plan_for_budget(const RunShape& base, const std::vector<CheckpointCandidate>& candidates,
                           int wanted_batch, std::size_t budget, Predict&& predict) {
    if (wanted_batch < 1)
        throw ConfigError("plan_for_budget: the wanted batch must be at least 1 sequence, got " +
                          std::to_string(wanted_batch));
    BudgetPlan plan;
    plan.budget = budget;
    plan.wanted_batch = wanted_batch;
    plan.seq = base.seq;
    std::vector<int> divisors;  // largest first
    for (int b = wanted_batch; b >= 1; --b)
        if (wanted_batch % b == 0) divisors.push_back(b);
    for (const CheckpointCandidate& candidate : candidates) {
        RunShape probe = base;
        probe.recompute = candidate.recompute;
        PolicyTry t{candidate.name, 0, 0};
        for (std::size_t i = 0; i < divisors.size(); ++i) {
            probe.micro_batch = divisors[i];
            probe.accumulation = wanted_batch / divisors[i];
            const MemoryPlan m = predict(probe);
            if (m.required > budget) {
                if (i + 1 == divisors.size()) t.bytes = m.required;  // micro-batch 1
                continue;
            }
            t.micro_batch = divisors[i];
            t.bytes = m.required;
            plan.fits = true;
            plan.checkpoint = candidate.name;
            plan.recompute = candidate.recompute;
            plan.micro_batch = divisors[i];
            plan.accumulation = probe.accumulation;
            plan.memory = m;
            if (i > 0) {
                RunShape next = probe;
                next.micro_batch = divisors[i - 1];
                next.accumulation = wanted_batch / divisors[i - 1];
                plan.next_micro_batch = divisors[i - 1];
                plan.next_micro_batch_bytes = predict(next).required;
            }
            break;
        }
        plan.tried.push_back(t);
        if (plan.fits) break;
    }
    return plan;
}

// For base's model and precision.
template <class Config>
BudgetPlan plan_for_budget(const PlanInput<Config>& base, int wanted_batch, std::size_t budget) {
    return plan_for_budget(static_cast<const RunShape&>(base),
                           checkpoint_candidates(base.model, base.precision, 1, base.seq), wanted_batch, budget,
                           plan_predictor(base));
}

// The same for any MeterableModel built from `config` under Precision: the
// fastest configuration of `wanted_batch` sequences per update at base's T.
template <MeterableModel Model, PrecisionPolicy Precision, class Config>
BudgetPlan plan_for_budget(const Config& config, const RunShape& base, int wanted_batch, std::size_t budget) {
    return plan_for_budget(base, checkpoint_candidates<Model>(config, 1, base.seq), wanted_batch, budget,
                           [&](const RunShape& shape) { return predict_training_memory<Model, Precision>(config, shape); });
}

// The two searches above for a card (snug::card(12_GiB)): shape as run on
// it, its memory the budget.
template <MeterableModel Model, PrecisionPolicy Precision, class Config>
int largest_micro_batch(const Config& config, const RunShape& shape, const Card& card) {
    return largest_micro_batch<Model, Precision>(config, card.on(shape), card.memory);
}
template <MeterableModel Model, PrecisionPolicy Precision, class Config>
BudgetPlan plan_for_budget(const Config& config, const RunShape& base, int wanted_batch, const Card& card) {
    return plan_for_budget<Model, Precision>(config, card.on(base), wanted_batch, card.memory);
}

// ---- the largest model -----------------------------------------------------------------

// A shape family: the model of each depth.
template <class Config>
using DepthFamily = std::function<Config(int depth)>;
using ModelFamily = DepthFamily<GPTConfig>;

// The family of depths of a model like `like` (--plan's "largest model").
// GPT: llm.c's and snug's "dN" family: L = d blocks, C = 64 d channels, NH = d
// heads (head size 64); vocabulary and context from `like`.
inline ModelFamily depth_family(const GPTConfig& like) {
    return [like](int depth) {
        GPTConfig c = like;
        c.n_layer = depth;
        c.n_head = depth;
        c.channels = 64 * depth;
        return c;
    };
}

// A CausalLM: its blocks as they are, d of them.
template <class Family>
DepthFamily<CausalLMConfig<Family>> depth_family(const CausalLMConfig<Family>& like) {
    return [like](int depth) {
        CausalLMConfig<Family> c = like;
        c.n_layer = depth;
        if constexpr (requires { c.block.layers; }) c.block.layers = depth;  // the residual init's depth
        return c;
    };
}


// The deepest model of `family` (memory growing with depth) that trains at
// micro-batch 1 within `budget` under some checkpoint policy, full
// checkpointing included, and the cheapest policy that fits at that depth.
// From `base`: precision, seq, accumulation, backend workspace, sampling
// window. Depths up to max_depth are searched by doubling, then bisection
// (memory grows with depth): about 2 log2(depth) measured runs per policy.
template <class Config>
ModelFit largest_model_that_fits(const DepthFamily<Config>& family, const PlanInput<Config>& base, std::size_t budget,
                                 int max_depth = 1024) {
    // One depth: the cheapest policy that fits (fit.depth 0 when none does),
    // and the least any policy needs.
    auto at = [&](int depth) {
        ModelFit fit;
        fit.budget = budget;
        PlanInput<Config> probe = base;
        probe.model = family(depth);
        probe.micro_batch = 1;
        fit.next_depth_bytes = static_cast<std::size_t>(-1);
        for (const CheckpointCandidate& candidate : checkpoint_candidates(probe.model, base.precision, 1, base.seq)) {
            probe.recompute = candidate.recompute;
            const MemoryPlan m = predict_memory(probe);
            fit.next_depth_bytes = std::min(fit.next_depth_bytes, m.required);
            if (fit.depth == 0 && m.required <= budget) {
                fit.depth = depth;
                fit.model = model_summary(probe.model);
                fit.checkpoint = candidate.name;
                fit.recompute = candidate.recompute;
                fit.memory = m;
            }
        }
        return fit;
    };
    // Memory grows with depth, so: double the depth until one does not fit
    // (or the limit), then halve the interval between the last that fits and
    // the first that does not.
    ModelFit best = at(1);
    if (best.depth == 0) return best;
    int fits = 1, fails = 0;
    std::size_t fails_bytes = 0;
    auto probe = [&](int d) {  // moves `fits` or `fails` to d
        ModelFit f = at(d);
        if (f.depth != 0) {
            fits = d;
            best = std::move(f);
        } else {
            fails = d;
            fails_bytes = f.next_depth_bytes;
        }
    };
    while (fails == 0 && fits < max_depth) probe(std::min(2 * fits, max_depth));
    while (fails != 0 && fails - fits > 1) probe(fits + (fails - fits) / 2);
    best.next_depth_bytes = fails_bytes;  // 0 at the limit: no deeper model was tried
    best.at_limit = fails == 0;
    return best;
}

template <class Config>
MemoryOutlook memory_outlook(const PlanInput<Config>& in, std::optional<std::size_t> budget) {
    MemoryOutlook o;
    o.plan = predict_memory(in);
    o.bytes_per_sequence = bytes_per_sequence(in);
    o.seq = in.seq;
    o.budget = budget;
    if (budget) {
        o.largest_micro_batch = largest_micro_batch(in, *budget);
        PlanInput<Config> one = in;
        one.micro_batch = 1;
        o.micro_batch_1_bytes = o.largest_micro_batch > 0 ? 0 : predict_memory(one).required;
    }
    return o;
}

}  // namespace snug
