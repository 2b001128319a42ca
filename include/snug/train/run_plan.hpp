// Planning a run before it allocates anything: the memory planner's input for
// the options (snug/train/planner.hpp), the outlook a run reports before it
// trains, and --plan's answer: the fastest configuration that fits a budget
// and the largest model of the shape's family.
#pragma once

#include <limits>
#include <optional>
#include <string>

#include "snug/train/data_source.hpp"
#include "snug/train/host_allocation.hpp"
#include "snug/train/model_source.hpp"
#include "snug/train/options.hpp"
#include "snug/train/planner.hpp"
#include "snug/train/report.hpp"
#include "snug/train/run_spec.hpp"
#include "snug/train/session.hpp"

namespace snug {

// The memory planner's view of a run (snug/train/planner.hpp): what train()
// (snug/train/run.hpp) allocates for the options' precision and shapes, before a recompute
// plan is chosen (the input auto_recompute takes).
// Under --zero a rank's: its shard of the optimizer's state (the largest).
template <class Config>
PlanInput<Config> plan_base(const TrainOptions& o, const Config& config, const PlanTarget& target) {
    return plan_input_for(o.run.with_zero(o.zero_ranks()), config, target,
                          o.sample > 0 ? config.max_seq_len : 0);
}

// --checkpoint auto: the first plan in checkpoint::Budget's order whose whole
// run the planner predicts within the memory budget (nullopt: no budget).
template <class Config>
std::optional<std::vector<Recompute>> auto_recompute_plan(const TrainOptions& o, const Config& config,
                                                          const PlanTarget& target) {
    if (!o.budget_bytes) return std::nullopt;
    return auto_recompute(plan_base(o, config, target), *o.budget_bytes);
}

// The options' checkpoint policy as the plan it picks for the model; auto:
// `automatic` (auto_recompute_plan's), or without a budget every activation kept.
template <class Config>
std::vector<Recompute> recompute_plan_of(const TrainOptions& o, const Config& config,
                                         const std::optional<std::vector<Recompute>>& automatic) {
    if (o.run.checkpoint == CheckpointKind::selective && !config_recomputes_selectively<Config>())
        throw ConfigError("--checkpoint selective: a " + model_summary(config).family +
                          " model's blocks cannot recompute selectively; use full, every:K or auto");
    if (o.run.checkpoint != CheckpointKind::automatic)
        return recompute_plan_for(o.run.checkpoint_name(), config.n_layer);
    return automatic.value_or(std::vector<Recompute>(static_cast<std::size_t>(config.n_layer), Recompute::none));
}

// plan_base with the options' checkpoint policy as its plan.
template <class Config>
PlanInput<Config> plan_input(const TrainOptions& o, const Config& config, const PlanTarget& target) {
    PlanInput<Config> in = plan_base(o, config, target);
    const bool automatic = o.run.checkpoint == CheckpointKind::automatic;
    in.recompute = recompute_plan_of(o, config, automatic ? auto_recompute_plan(o, config, target) : std::nullopt);
    return in;
}

// Before training: the predicted peak, the memory per sequence, and the
// largest micro-batch the budget allows.
template <class Config>
void report_memory_outlook(const TrainOptions& o, const Config& config, const DeviceInfo& device, Report& report) {
    report.memory_outlook(memory_outlook(plan_input(o, config, plan_target(device)), o.budget_bytes));
}

// Before anything of the model's size is made: whether this machine can hold
// what the run keeps in host memory — the fp32 weights it starts from, an
// offloaded optimizer's state, and on the host backend the planner's whole
// predicted peak (the device's memory is the host's there). Throws
// OutOfMemory naming what is needed, what `room` allows (host_memory_room():
// the available memory, the address-space limit) and the options that
// shrink the run; nothing to check where the system says neither.
template <class Config>
void check_host_memory(const TrainOptions& o, const Config& config, const DeviceInfo& device,
                       const HostMemoryRoom& room = host_memory_room()) {
    const std::optional<std::size_t> can = room.least();
    if (!can) return;
    const auto refuse = [&](const std::string& need) {
        throw OutOfMemory("out of host memory: this run needs " + need + " but this machine can give it " +
                          format_bytes(*can) + " (" + room.describe() +
                          "); nothing was built. Shrink it with a smaller --model, --batch or --seq, --precision "
                          "bf16, --checkpoint full, --optimizer-state int8 or --master none");
    };
    // The weights alone first: planning a model far too large takes minutes.
    const std::size_t weights = static_cast<std::size_t>(model_summary(config).parameters) * sizeof(float);
    if (weights > *can) refuse("at least " + format_bytes(weights) + " of host memory (its fp32 initial weights alone)");
    const MemoryPlan plan = predict_memory(plan_input(o, config, plan_target(device)));
    const std::size_t on_host = device.cuda ? 0 : plan.required;
    const std::size_t need = weights + plan.host + on_host;
    if (need <= *can) return;
    std::string parts = format_bytes(weights) + " of fp32 initial weights";
    if (on_host > 0) parts = "the plan's peak of " + format_bytes(on_host) + " on the host backend + " + parts;
    if (plan.host > 0) parts += " + " + format_bytes(plan.host) + " of offloaded optimizer state";
    refuse(format_bytes(need) + " of host memory (" + parts + ")");
}

// --plan: for the budget, the fastest configuration that fits (the order of
// operations: the largest micro-batch, accumulation up to the wanted batch of
// --batch x --accum sequences, the cheapest checkpoint policy; when nothing
// fits, the same with lean optimizer state, then offloaded, and on how many
// ZeRO-1 ranks the run's own state fits), and the largest model of the
// shape's depth family. Nothing is allocated.
inline constexpr int max_zero_ranks = 64;  // --plan's ZeRO-1 search: 2, 4, ..., this many ranks

template <class Config = GPTConfig>
int run_plan_program(const TrainOptions& o, const DeviceInfo& device, Report& report) {
    if (!o.budget_bytes) throw ConfigError("--plan needs a memory budget (--vram-budget 12GiB, say), not 'none'");
    check_model_files<Config>(o);
    PlanAnswer answer;
    Config config;
    if constexpr (reads_model_files<Config>) {
        if (!o.init_from.empty()) {
            config = o.with_choices(read_model_file_of<Config>(o.init_from).config);
            validate_config(config);
        }
    }
    if (o.init_from.empty()) config = fresh_config<Config>(o, o.vocab != 0 ? o.vocab : data_vocab(o));
    answer.model = model_summary(config);
    answer.device = device;
    answer.budget = *o.budget_bytes;
    answer.run = o.run.with_zero(o.zero_ranks());
    const PlanInput<Config> in = plan_input(o, config, plan_target(device));
    answer.asked = memory_outlook(in, answer.budget);
    answer.fastest = plan_for_budget(in, o.run.micro_batch * o.run.accumulation, answer.budget);
    // Nothing fits even fully checkpointed: the optimizer's state is next,
    // leaner (on the device), then on the host.
    const int wanted = o.run.micro_batch * o.run.accumulation;
    const RunSpec lean = o.run.with_lean_optimizer();
    if (!answer.fastest.fits && !o.run.offload && lean.optimizer_flags() != o.run.optimizer_flags()) {
        PlanInput<Config> lean_in = in;
        lean_in.moments = lean.moments;
        lean_in.master = lean.master;
        answer.lean_run = lean;
        answer.lean = plan_for_budget(lean_in, wanted, answer.budget);
    }
    if (!answer.fastest.fits && !o.run.offload && !(answer.lean && answer.lean->fits)) {
        PlanInput<Config> offload_in = in;
        offload_in.offload = true;
        answer.offload_run = o.run.with_offload();
        answer.offloaded = plan_for_budget(offload_in, wanted, answer.budget);
    }
    // And with more cards: how many data-parallel ranks, each keeping its
    // shard of the run's own optimizer state (ZeRO-1), fit it on cards of the budget.
    if (!answer.fastest.fits && !o.run.offload && answer.run.zero_ranks == 1) {
        for (int ranks = 2; ranks <= max_zero_ranks; ranks *= 2) {
            PlanInput<Config> zero_in = in;
            zero_in.zero_ranks = ranks;
            answer.zero_run = o.run.with_zero(ranks);
            answer.zero = plan_for_budget(zero_in, wanted, answer.budget);
            if (answer.zero->fits) break;
        }
    }
    PlanInput<Config> one = in;
    one.micro_batch = 1;
    one.accumulation = 1;
    answer.largest = largest_model_that_fits(depth_family(config), one, answer.budget);
    report.plan(answer);
    return 0;
}

}  // namespace snug
