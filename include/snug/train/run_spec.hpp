// RunSpec: one run-time description of a training configuration — precision,
// checkpoint policy, micro-batch, sequence length, accumulation — and the one
// place that turns it into the static policy types TrainStep is built from.
// A command line, the VRAM ladder and the planner call sites all read the
// same description, so a precision or checkpoint name is parsed once, and a
// name nobody compiled is an error naming it, never a silent default.
//
//   snug::RunSpec spec{.precision = snug::parse_precision_kind("bf16"),
//                      .checkpoint = snug::parse_checkpoint_kind("selective")};
//   spec.visit([&]<class Precision, class Checkpoint>() {
//       using Step = snug::TrainStep<Model, Precision, snug::accumulate::Steps, Checkpoint>;
//       ...
//   });
//
// (train_gpt's run loop visits only the precision and applies the policy as
// its plan, checkpoint::Given: one loop per precision to compile, not 21.)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "snug/checkpoint/kind.hpp"
#include "snug/checkpoint/policies.hpp"
#include "snug/core/error.hpp"
#include "snug/optim/state_storage.hpp"
#include "snug/precision/loss_scaler.hpp"
#include "snug/precision/kind.hpp"
#include "snug/precision/policies.hpp"
#include "snug/train/memory_plan.hpp"

namespace snug {

// What decides a run's memory and speed, known at run time.
struct RunSpec {
    PrecisionKind precision = PrecisionKind::fp32;
    CheckpointKind checkpoint = CheckpointKind::none;
    int micro_batch = 32;   // B: sequences per forward
    int seq = 32;           // T: tokens per sequence
    int accumulation = 1;   // n: micro-batches per update
    // The optimizer-memory policy (optim/adamw.hpp): AdamW's moments and master
    // weights, and where they live (offload: host memory, the update on the CPU).
    MomentStorage moments = MomentStorage::fp32;
    MasterStorage master = MasterStorage::fp32;
    bool offload = false;
    // ZeRO-1: the optimizer's state sharded over this many data-parallel ranks
    // (train_gpt --zero under mpirun -np N); 1: every rank keeps all of it.
    int zero_ranks = 1;

    const char* precision_name() const { return snug::precision_name(precision).data(); }
    const char* checkpoint_name() const { return checkpoint_kind_name(checkpoint); }
    // This spec with the leanest optimizer state snug has for its precision:
    // 8-bit moments, and no master copy where the weights are bf16.
    RunSpec with_lean_optimizer() const {
        RunSpec s = *this;
        s.moments = MomentStorage::int8;
        s.master = precision == PrecisionKind::bf16 ? MasterStorage::none : MasterStorage::fp32;
        return s;
    }
    // This spec with its optimizer's state sharded over `ranks` ranks (ZeRO-1).
    RunSpec with_zero(int ranks) const {
        RunSpec s = *this;
        s.zero_ranks = ranks;
        return s;
    }
    // This spec with its optimizer offloaded to the host (same storage).
    RunSpec with_offload() const {
        RunSpec s = *this;
        s.offload = true;
        return s;
    }
    // The command-line flags that choose this spec's optimizer state
    // ("--optimizer-state bf16 --master none --offload"; empty for the default).
    std::string optimizer_flags() const {
        std::string f;
        auto add = [&](const std::string& flag) { f += (f.empty() ? "" : " ") + flag; };
        if (moments != MomentStorage::fp32) add("--optimizer-state " + std::string(moment_storage_name(moments)));
        if (master != MasterStorage::fp32) add("--master " + std::string(master_storage_name(master)));
        if (offload) add("--offload");
        if (zero_ranks > 1) add("--zero (mpirun -np " + std::to_string(zero_ranks) + ")");
        return f;
    }
    // "AdamW moments fp32, master fp32" and the like, ", offloaded to the host" when it is.
    std::string optimizer_name() const {
        return "AdamW moments " + std::string(moment_storage_name(moments)) + ", master " +
               std::string(master_storage_name(master)) + (offload ? ", offloaded to the host" : "") +
               (zero_ranks > 1 ? ", sharded over " + std::to_string(zero_ranks) + " ranks (ZeRO-1)" : "");
    }
    std::int64_t tokens_per_update() const { return std::int64_t{accumulation} * micro_batch * seq; }

    // Calls f.template operator()<Precision, Checkpoint>() with the static
    // policy types this description names, and returns what it returns
    // (every instantiation must return the same type).
    template <class F>
    auto visit(F&& f) const {
        const CheckpointKind k = checkpoint;
        return visit_precision(precision, [&]<class Precision>() {
            return visit_checkpoint(k, [&]<class Checkpoint>() { return f.template operator()<Precision, Checkpoint>(); });
        });
    }
};

// The memory planner's input for a spec (planner.hpp): the model, the spec's
// precision and shapes, what the device adds (its workspace and
// reservations), the sampling window; the
// recompute plan of a named policy (--checkpoint auto's plan depends on a
// byte budget: see plan_input in snug/train/run_plan.hpp).
template <class Config>
PlanInput<Config> plan_input_for(const RunSpec& spec, const Config& config, const PlanTarget& target,
                                 int sampling_window) {
    PlanInput<Config> in;
    in.model = config;
    in.precision = spec.precision;
    in.micro_batch = spec.micro_batch;
    in.seq = spec.seq;
    in.accumulation = spec.accumulation;
    in.moments = spec.moments;
    in.master = spec.master;
    in.offload = spec.offload;
    in.zero_ranks = spec.zero_ranks;
    in.backend_workspace = target.backend_workspace;
    in.device = target.device;
    in.fused = target.fused;
    in.sampling_window = sampling_window;
    return in;
}

}  // namespace snug
