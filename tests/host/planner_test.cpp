// The memory planner against the tracker: for tiny GPTs in every precision,
// with and without accumulation, under every checkpoint policy, a run built
// as train_gpt builds it (tracker, GPT, token buffers, TrainStep, the two
// arenas; two updates, an evaluation, a sampling pass) ends with the peaks
// the planner predicted, per category and in total, to the byte. Then the
// searches: budgets built from predictions pick the micro-batch, policy and
// depth they should, and the picked configuration really runs under that
// budget while the next larger one runs out of memory.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "snug/core/buffer.hpp"
#include "snug/core/rng.hpp"
#include "snug/nn/gpt.hpp"
#include "snug/report/text_report.hpp"
#include "snug/train/planner.hpp"
#include "snug/train/train_step.hpp"
#include "support/host_run.hpp"

using snug::GPTConfig;
using snug::MemoryCategory;
using snug::MemoryPlanInput;
using snug::Recompute;
using snug::PrecisionKind;

namespace {

GPTConfig shape(int vocab, int max_seq, int layers, int heads, int channels) {
    GPTConfig c = GPTConfig{}.with_vocab(vocab).with_context(max_seq);
    c.n_layer = layers;
    c.n_head = heads;
    c.channels = channels;
    return c;
}

// A checkpoint policy that answers with the modes it was given: how a test
// runs a plan the planner chose at run time.
struct Fixed {
    [[maybe_unused]] static constexpr const char* name = "fixed";  // the CheckpointPolicy contract; unused here
    std::vector<Recompute> modes;
    std::vector<Recompute> plan(const snug::CheckpointQuery&) const { return modes; }
};

struct Measured {
    snug::MemoryBreakdown peak{};
    std::size_t total = 0;
    snug::MemoryBreakdown at_total{};
    std::vector<Recompute> plan;
};

// What train_gpt does, in its order: the model, the token and target ids of
// n micro-batches (workspace), TrainStep; two updates; an evaluation; a
// sampling window and a forward over it without targets.
template <class Precision, class Checkpoint>
Measured run_like_trainer(const GPTConfig& c, int B, int T, int n, Checkpoint checkpoint,
                          std::optional<std::size_t> budget = std::nullopt, int window = 0,
                          snug::TrainConfig train_config = {}) {
    using Act = typename Precision::compute_type;
    using Model = snug::GPT<Act, snug::Host>;
    snug::test::HostRun run;
    run.tracker.set_budget(budget);
    Model model(c, run.tracker);
    const auto weights = snug::gpt_initial_weights(c, 11);
    model.load_weights(run.ctx.device, weights);
    const auto count = static_cast<std::size_t>(n) * static_cast<std::size_t>(B) * static_cast<std::size_t>(T);
    snug::Buffer<std::int32_t, snug::Host> tokens(run.tracker, MemoryCategory::workspace, count, "token ids");
    snug::Buffer<std::int32_t, snug::Host> targets(run.tracker, MemoryCategory::workspace, count, "target ids");
    snug::Generator g(3);
    for (std::size_t i = 0; i < count; ++i) {
        tokens.data()[i] = static_cast<std::int32_t>(g.below(static_cast<std::uint64_t>(c.vocab_size)));
        targets.data()[i] = static_cast<std::int32_t>(g.below(static_cast<std::uint64_t>(c.vocab_size)));
    }
    snug::TrainStep<Model, Precision, snug::accumulate::Steps, Checkpoint> step(
        model, run.tracker, run.ctx.device, weights, train_config, {}, snug::accumulate::Steps(n), checkpoint);
    std::vector<snug::MicroBatch> batches;
    const std::int64_t BT = std::int64_t{B} * T;
    for (int m = 0; m < n; ++m) batches.push_back({tokens.data() + m * BT, targets.data() + m * BT});
    for (int update = 0; update < 2; ++update) step.step(run.ctx, batches, B, T, 1e-3f);
    (void)model.evaluate(run.ctx, tokens.data(), targets.data(), B, T);
    if (window > 0) {
        snug::Buffer<std::int32_t, snug::Host> ids(run.tracker, MemoryCategory::workspace,
                                                   static_cast<std::size_t>(c.max_seq_len), "sampling window");
        for (int i = 0; i < window; ++i) ids.data()[i] = tokens.data()[i % static_cast<int>(count)];
        model.forward_last(run.ctx, ids.data(), 1, window);  // as train/sampling.hpp does
        model.release(run.ctx);
    }
    Measured m;
    for (MemoryCategory cat : snug::all_memory_categories)
        m.peak[static_cast<std::size_t>(cat)] = run.tracker.peak(cat);
    m.total = run.tracker.peak_total();
    m.at_total = run.tracker.peak_breakdown();
    m.plan.assign(step.recompute_plan().begin(), step.recompute_plan().end());
    return m;
}

MemoryPlanInput plan_input(const GPTConfig& c, PrecisionKind p, int B, int T, int n, std::vector<Recompute> modes,
                           std::size_t backend_workspace, int window) {
    MemoryPlanInput in;
    in.model = c;
    in.precision = p;
    in.micro_batch = B;
    in.seq = T;
    in.accumulation = n;
    in.recompute = std::move(modes);
    in.backend_workspace = backend_workspace;
    in.sampling_window = window;
    return in;
}

std::string describe(const MemoryPlanInput& in) {
    std::string modes;
    for (Recompute r : in.modes()) modes += std::string(modes.empty() ? "" : " ") + snug::recompute_name(r);
    return fmt::format("L {} NH {} C {} Vp {}, {} B {} T {} n {}, window {}, modes [{}]", in.model.n_layer,
                       in.model.n_head, in.model.channels, in.model.padded_vocab_size,
                       snug::precision_name(in.precision), in.micro_batch, in.seq, in.accumulation,
                       in.sampling_window, modes);
}

// Every category, the total and the breakdown at the total's peak: exact,
// and within the 2% in any case.
void compare(const MemoryPlanInput& in, const snug::MemoryPlan& predicted, const Measured& measured) {
    INFO(describe(in));
    INFO("predicted peak: " << predicted.peak_moment);
    auto within_2_percent = [](std::size_t pred, std::size_t meas) {
        const double diff = pred > meas ? double(pred - meas) : double(meas - pred);
        return diff <= 0.02 * double(meas);
    };
    for (MemoryCategory cat : snug::all_memory_categories) {
        const auto i = static_cast<std::size_t>(cat);
        INFO(fmt::format("{}: predicted {}, measured {}", snug::category_name(cat), predicted.peak[i],
                         measured.peak[i]));
        CHECK(within_2_percent(predicted.peak[i], measured.peak[i]));
        CHECK(predicted.peak[i] == measured.peak[i]);
        INFO(fmt::format("at the total's peak: predicted {}, measured {}", predicted.at_total_peak[i],
                         measured.at_total[i]));
        CHECK(predicted.at_total_peak[i] == measured.at_total[i]);
    }
    INFO(fmt::format("total: predicted {}, measured {}", predicted.total, measured.total));
    CHECK(within_2_percent(predicted.total, measured.total));
    CHECK(predicted.total == measured.total);
}

template <class Precision, class Checkpoint>
void check_policy(const GPTConfig& c, int B, int T, int n, Checkpoint checkpoint, int window) {
    constexpr PrecisionKind p = snug::precision_kind<Precision>();
    MemoryPlanInput in = plan_input(c, p, B, T, n, snug::plan_recompute(checkpoint, c, p, B, T), 0, window);
    const snug::MemoryPlan predicted = snug::predict_memory(in);
    const Measured measured = run_like_trainer<Precision>(c, B, T, n, checkpoint, std::nullopt, window);
    INFO("checkpoint " << snug::checkpoint_label(checkpoint));
    CHECK(measured.plan == in.recompute);
    compare(in, predicted, measured);
}

template <class Precision>
void check_every_policy(const GPTConfig& c, int B, int T, int n, int window) {
    namespace ck = snug::checkpoint;
    check_policy<Precision>(c, B, T, n, ck::None{}, window);
    check_policy<Precision>(c, B, T, n, ck::Full{}, window);
    check_policy<Precision>(c, B, T, n, ck::EveryNth<2>{}, window);
    check_policy<Precision>(c, B, T, n, ck::Selective{}, window);
    // A budget between what full checkpointing and keeping everything need.
    constexpr PrecisionKind p = snug::precision_kind<Precision>();
    const auto L = static_cast<std::size_t>(c.n_layer);
    const std::size_t keep_all = snug::activation_peak(c, p, B, T, std::vector<Recompute>(L, Recompute::none));
    const std::size_t full = snug::activation_peak(c, p, B, T, std::vector<Recompute>(L, Recompute::full));
    check_policy<Precision>(c, B, T, n, ck::Budget((keep_all + full) / 2), window);
}

// Runs a configuration chosen at run time (any precision, fixed modes).
Measured run_input(const MemoryPlanInput& in, std::optional<std::size_t> budget) {
    const Fixed modes{in.modes()};
    switch (in.precision) {
        case PrecisionKind::fp32:
            return run_like_trainer<snug::precision::Fp32>(in.model, in.micro_batch, in.seq, in.accumulation, modes,
                                                          budget, in.sampling_window);
        case PrecisionKind::bf16:
            return run_like_trainer<snug::precision::Bf16>(in.model, in.micro_batch, in.seq, in.accumulation, modes,
                                                          budget, in.sampling_window);
        case PrecisionKind::fp16:
            return run_like_trainer<snug::precision::Fp16<snug::DynamicLossScaler>>(
                in.model, in.micro_batch, in.seq, in.accumulation, modes, budget, in.sampling_window);
    }
    return {};
}

}  // namespace

TEST_CASE("the prediction is the tracker's peak, per category and in total, for every policy") {
    struct Case {
        GPTConfig c;
        int B, T, window;
    };
    // Logits small next to the blocks; attention wider than the channels
    // (NH T > 9 C at T = 16, and Vp != V); a padded vocabulary whose logits
    // dominate; five blocks, so every:2 leaves an odd one out.
    const Case cases[] = {
        {shape(64, 16, 2, 2, 16), 2, 8, 16},
        {shape(50, 16, 3, 4, 8), 1, 16, 0},
        {shape(300, 8, 2, 1, 8), 3, 4, 8},
        {shape(32, 8, 5, 2, 16), 2, 8, 0},
    };
    for (const Case& k : cases) {
        for (int n : {1, 2}) {
            check_every_policy<snug::precision::Fp32>(k.c, k.B, k.T, n, k.window);
            check_every_policy<snug::precision::Bf16>(k.c, k.B, k.T, n, k.window);
            check_every_policy<snug::precision::Fp16<snug::DynamicLossScaler>>(k.c, k.B, k.T, n, k.window);
        }
    }
}

TEST_CASE("categories that a hand count gives") {
    // L 2, C 16, NH 2, V = Vp = 64, maxT 16: P = 64·16 + 16·16 + 2·(12·256 + 13·16) + 2·16 = 7872.
    const GPTConfig c = shape(64, 16, 2, 2, 16);
    MemoryPlanInput in = plan_input(c, PrecisionKind::bf16, 2, 8, 3, {}, 1000, 16);
    const snug::MemoryPlan plan = snug::predict_memory(in);
    CHECK(plan[MemoryCategory::parameters] == 7872 * 2);
    CHECK(plan[MemoryCategory::master_weights] == 7872 * 4);
    CHECK(plan[MemoryCategory::gradients] == 7872 * 4);
    CHECK(plan[MemoryCategory::optimizer_state] == 7872 * 8);
    // cuBLASLt 1000, ids 2·3·2·8·4 = 384, the overflow flag and the norm (4
    // each) and the update's loss total (a double, 8), the window 16·4 = 64.
    CHECK(plan[MemoryCategory::workspace] == 1000 + 384 + 16 + 64);
    // Backward of a block, at attention: two (B, T, C) residual-stream
    // gradients, d attention out (one) and d qkv (three), and flash
    // attention's fp32 row sums (B, NH, T): 6 · 2·8·16·2 + 2·2·8·4 = 3072 + 128
    // (the MLP's hidden gradient, four (B, T, C), is gone by then).
    CHECK(plan[MemoryCategory::temporaries] == 3200);
    // The materialised attention's scratch is (B, NH, T, T) of bf16 instead: 3072 + 2·2·8·8·2.
    in.model.attention = snug::AttentionKind::materialized;
    CHECK(snug::predict_memory(in)[MemoryCategory::temporaries] == 3072 + 512);
    in.model.attention = snug::AttentionKind::flash;
    in.precision = PrecisionKind::fp32;
    CHECK(snug::predict_memory(in)[MemoryCategory::master_weights] == 0);
    CHECK(snug::predict_memory(in)[MemoryCategory::temporaries] == 2 * 3072 + 128);

    CHECK_THROWS_AS(snug::predict_memory(plan_input(c, PrecisionKind::fp32, 1, 17, 1, {}, 0, 0)),
                    snug::ConfigError);
    CHECK_THROWS_AS(snug::predict_memory(plan_input(c, PrecisionKind::fp32, 1, 8, 1, {Recompute::full}, 0, 0)),
                    snug::ConfigError);
    CHECK_THROWS_AS(snug::parse_precision_kind("fp8"), snug::ConfigError);
    CHECK(snug::parse_precision_kind("bf16") == PrecisionKind::bf16);
    CHECK(snug::format_memory_plan(plan).find("optimizer state") != std::string::npos);
}

TEST_CASE("lean optimizer state: the prediction is the tracker's peak, and the state shrinks as the policy says") {
    using snug::MasterStorage;
    using snug::MomentStorage;
    const GPTConfig c = shape(64, 16, 2, 2, 16);  // P = 7872, as counted above
    const std::size_t P = 7872;
    struct Case {
        MomentStorage moments;
        MasterStorage master;
        std::size_t state, master_bytes;
    };
    const Case cases[] = {
        {MomentStorage::bf16, MasterStorage::fp32, 4 * P, 4 * P},
        {MomentStorage::fp32, MasterStorage::none, 8 * P, 0},
        {MomentStorage::bf16, MasterStorage::none, 4 * P, 0},
        // 8-bit: the decayed groups (wte + wpe 1280, qkv 1536, attention
        // projection 512, fc 2048, fc projection 2048: Q = 7424 in 5 + 6 + 2 +
        // 8 + 8 = 29 blocks of 256) a byte each for m and v and an fp32 absmax
        // per block; the biases and norms (P - Q = 448) fp32 moments.
        {MomentStorage::int8, MasterStorage::none, 2 * 7424 + 2 * 29 * 4 + 2 * 448 * 4, 0},
        {MomentStorage::int8, MasterStorage::fp32, 2 * 7424 + 2 * 29 * 4 + 2 * 448 * 4, 4 * P},
    };
    for (const Case& k : cases) {
        INFO("moments " << snug::moment_storage_name(k.moments) << ", master " << snug::master_storage_name(k.master));
        MemoryPlanInput in = plan_input(c, PrecisionKind::bf16, 2, 8, 2, {}, 0, 16);
        in.moments = k.moments;
        in.master = k.master;
        const snug::MemoryPlan predicted = snug::predict_memory(in);
        CHECK(predicted[MemoryCategory::optimizer_state] == k.state);
        CHECK(predicted[MemoryCategory::master_weights] == k.master_bytes);
        snug::TrainConfig tc;
        tc.adamw.moments = k.moments;
        tc.adamw.master = k.master;
        const Measured measured = run_like_trainer<snug::precision::Bf16>(c, 2, 8, 2, Fixed{in.modes()}, std::nullopt,
                                                                         16, tc);
        compare(in, predicted, measured);
    }
    // A master-less plan for weights that cannot do without one is refused, naming why.
    MemoryPlanInput fp16 = plan_input(c, PrecisionKind::fp16, 1, 8, 1, {}, 0, 0);
    fp16.master = MasterStorage::none;
    CHECK_THROWS_WITH(snug::predict_memory(fp16), Catch::Matchers::Contains("master none needs bf16 weights"));
}

TEST_CASE("an offloaded optimizer: nothing of its state on the device, and its host bytes planned as on CUDA") {
    using snug::MasterStorage;
    using snug::MomentStorage;
    const GPTConfig c = shape(64, 16, 2, 2, 16);  // P = 7872, as counted above
    const std::size_t P = 7872;
    MemoryPlanInput in = plan_input(c, PrecisionKind::bf16, 2, 8, 2, {}, 0, 16);
    const snug::MemoryPlan on_device = snug::predict_memory(in);
    in.offload = true;
    const snug::MemoryPlan offloaded = snug::predict_memory(in);
    CHECK(offloaded[MemoryCategory::master_weights] == 0);
    CHECK(offloaded[MemoryCategory::optimizer_state] == 0);
    CHECK(offloaded.total == on_device.total - 12 * P);
    // On the host: fp32 master (4 P) and moments (8 P); as CUDA stages them, a
    // bf16 copy of the weights (2 P) and two gradient slots of the longest
    // piece (the fc weights, 2048 parameters: the groups are counted above).
    CHECK(offloaded.host == 12 * P + 2 * P + 2 * 2048 * 4);
    CHECK(on_device.host == 0);
    // The host run (no staging there: the update runs in place) holds on its
    // device ledger what the plan says.
    snug::TrainConfig tc;
    tc.adamw.offload = true;
    const Measured measured = run_like_trainer<snug::precision::Bf16>(c, 2, 8, 2, Fixed{in.modes()}, std::nullopt, 16, tc);
    compare(in, offloaded, measured);
    // 8-bit moments and no master on the host too: the host bytes shrink, the device's do not.
    in.moments = MomentStorage::int8;
    in.master = MasterStorage::none;
    const snug::MemoryPlan lean = snug::predict_memory(in);
    CHECK(lean.total == offloaded.total);
    CHECK(lean.host == 2 * 7424 + 2 * 29 * 4 + 2 * 448 * 4 + 2 * P + 2 * 2048 * 4);

    // ZeRO-1 over 2 ranks, offloaded: each rank's host holds its shard's. The
    // cut falls in the first fc weights (group [3584, 5632)) at a whole 256
    // block past P / 2 = 3936 rounded down: 3840, so the larger shard, which
    // the plan is for, is [3840, 7872): 4032 parameters, its longest piece the
    // second fc weights' 2048. The device holds what the unsharded offload's does.
    in.moments = MomentStorage::fp32;
    in.master = MasterStorage::fp32;
    in.zero_ranks = 2;
    const snug::MemoryPlan sharded = snug::predict_memory(in);
    const std::size_t S = 4032;
    CHECK(sharded.host == 12 * S + 2 * S + 2 * 2048 * 4);
    CHECK(sharded.total == offloaded.total);
    CHECK(sharded[MemoryCategory::optimizer_state] == 0);
}

TEST_CASE("what the device reserves: arena chunks whole, each allocation at the device's granularity, the context") {
    // The hand-counted run above: 18 P bytes of weights and optimizer state,
    // 1464 bytes of workspace in 12 allocations (cuBLASLt, params, grads,
    // master, two moments, token and target ids, three scalars, the window),
    // and one 64 MiB chunk for each arena.
    const GPTConfig c = shape(64, 16, 2, 2, 16);
    MemoryPlanInput in = plan_input(c, PrecisionKind::bf16, 2, 8, 3, {}, 1000, 16);
    const std::size_t chunks = 2 * (std::size_t{64} << 20);
    const snug::MemoryPlan host = snug::predict_memory(in);
    CHECK(host.reserved == 18 * 7872 + 1464 + chunks);
    CHECK(host.required == host.total);  // no device: the tracker's bytes are what a budget limits
    in.device = snug::cuda_reservation;
    const snug::MemoryPlan cuda = snug::predict_memory(in);
    CHECK(cuda.total == host.total);  // the tracker sees the same bytes
    CHECK(cuda.reserved == 12 * (std::size_t{2} << 20) + chunks + (std::size_t{512} << 20));
    CHECK(cuda.required == cuda.reserved);
    CHECK(cuda.context == (std::size_t{512} << 20));
    CHECK(host.context == 0);
    CHECK(snug::format_memory_plan(cuda).find("device reserves") != std::string::npos);
    // A budget is checked against what the card reserves.
    CHECK(snug::largest_micro_batch(in, cuda.reserved - 1) == 0);
    CHECK(snug::largest_micro_batch(in, cuda.reserved) >= 2);
}

TEST_CASE("a card (snug::card(12_GiB)): its memory the budget, checked against what it reserves with cuBLASLt's workspace") {
    using namespace snug::literals;
    CHECK(12_GiB == std::size_t{12884901888});
    CHECK(512_MiB + 4_KiB == std::size_t{536875008});
    const snug::Card card = snug::card(12_GiB);
    CHECK(card.memory == 12_GiB);
    CHECK(card.workspace == 32_MiB);  // Hopper's, the larger of cuda::Blas's two
    CHECK(card.reservation.context == 512_MiB);
    CHECK(card.reservation.granularity == 2_MiB);

    using Model = snug::GPT<float, snug::Meter>;
    const GPTConfig c = shape(64, 16, 2, 2, 16);
    snug::RunShape run;
    run.seq = 16;
    const snug::RunShape on_card = card.on(run);
    CHECK(on_card.seq == 16);
    CHECK(on_card.backend_workspace == 32_MiB);
    REQUIRE(on_card.device.has_value());
    // What the card needs is the tracker's bytes at 2 MiB pages, with the
    // context and the workspace: more than the host plan, by at least those.
    const snug::MemoryPlan host = snug::predict_training_memory<Model, snug::precision::Fp32>(c, run);
    const snug::MemoryPlan dev = snug::predict_training_memory<Model, snug::precision::Fp32>(c, on_card);
    CHECK(dev.required >= host.required + 512_MiB + 32_MiB);
    CHECK(dev.required == dev.reserved);
    // A card only a byte short of micro-batch 1 fits nothing; the host budget
    // of the same size fits many.
    const snug::Card short_card{dev.required - 1};
    CHECK(snug::largest_micro_batch<Model, snug::precision::Fp32>(c, run, short_card) == 0);
    CHECK(snug::largest_micro_batch<Model, snug::precision::Fp32>(c, run, dev.required - 1) > 1);
    const int on_card_fit = snug::largest_micro_batch<Model, snug::precision::Fp32>(c, run, snug::Card{dev.required});
    CHECK(on_card_fit >= 1);
    CHECK(on_card_fit < snug::largest_micro_batch<Model, snug::precision::Fp32>(c, run, dev.required));
    const snug::BudgetPlan none = snug::plan_for_budget<Model, snug::precision::Fp32>(c, run, 4, short_card);
    CHECK_FALSE(none.fits);
    const snug::BudgetPlan fits = snug::plan_for_budget<Model, snug::precision::Fp32>(c, run, 4, card);
    CHECK(fits.fits);
    CHECK(fits.memory.required <= 12_GiB);
    CHECK(fits.memory.reserved == fits.memory.required);  // judged as the card reserves
}

TEST_CASE("planning needs nothing of the model's size: GPT-2 XL in fp32 is 16 bytes a parameter, none of them real") {
    // 1.56 B parameters: 25 GB of weights, gradients and moments, more than
    // this machine has. The Meter run allocates none of it.
    GPTConfig c = GPTConfig{}.with_vocab(50257).with_context(1024);
    c.n_layer = 48;
    c.n_head = 25;
    c.channels = 1600;
    const auto P = static_cast<std::size_t>(c.num_parameters());
    REQUIRE(P > std::size_t{1500} * 1000 * 1000);
    const MemoryPlanInput in = plan_input(c, PrecisionKind::fp32, 1, 1024, 1, {}, 0, 0);
    const snug::MemoryPlan plan = snug::predict_memory(in);
    CHECK(plan[MemoryCategory::parameters] == 4 * P);
    CHECK(plan[MemoryCategory::gradients] == 4 * P);
    CHECK(plan[MemoryCategory::optimizer_state] == 8 * P);
    CHECK(plan[MemoryCategory::master_weights] == 0);
    CHECK(plan.total > 16 * P);
    CHECK(plan.peak_moment.find("training") != std::string::npos);
}

TEST_CASE("memory per sequence is what one more sequence adds to the measured peak") {
    const GPTConfig c = shape(64, 16, 2, 2, 16);
    MemoryPlanInput in = plan_input(c, PrecisionKind::fp16, 2, 8, 2, std::vector<Recompute>{Recompute::selective, Recompute::full}, 0, 0);
    const std::size_t per_sequence = snug::bytes_per_sequence(in);
    in.micro_batch = 2;
    const Measured two = run_input(in, std::nullopt);
    in.micro_batch = 3;
    const Measured three = run_input(in, std::nullopt);
    CHECK(per_sequence == three.total - two.total);
    const snug::MemoryOutlook outlook = snug::memory_outlook(in, std::size_t{1} << 30);
    CHECK(outlook.bytes_per_sequence == per_sequence);
    CHECK(outlook.plan.total == three.total);
    CHECK(outlook.largest_micro_batch == snug::largest_micro_batch(in, std::size_t{1} << 30));
    CHECK(snug::format_outlook(outlook).find("memory per sequence " + snug::format_bytes(per_sequence)) !=
          std::string::npos);
}

TEST_CASE("the largest micro-batch fits its budget and one more does not") {
    const GPTConfig c = shape(64, 16, 2, 2, 16);
    MemoryPlanInput in = plan_input(c, PrecisionKind::fp32, 8, 8, 1, {}, 0, 0);
    const std::size_t eight = snug::predict_memory(in).total;
    CHECK(snug::largest_micro_batch(in, eight) == 8);
    CHECK(snug::largest_micro_batch(in, eight - 1) == 7);
    in.micro_batch = 7;
    CHECK_NOTHROW(run_input(in, eight - 1));
    in.micro_batch = 8;
    CHECK_THROWS_AS(run_input(in, eight - 1), snug::OutOfMemory);
    in.micro_batch = 1;
    const std::size_t one = snug::predict_memory(in).total;
    CHECK(snug::largest_micro_batch(in, one - 1) == 0);
    CHECK_THROWS_AS(run_input(in, one - 1), snug::OutOfMemory);
}

TEST_CASE("plan_for_budget (--plan): the largest dividing micro-batch first, then the cheapest checkpoint that fits") {
    const GPTConfig c = shape(64, 16, 4, 2, 16);
    const int wanted = 8;
    MemoryPlanInput base = plan_input(c, PrecisionKind::bf16, 1, 16, 1, {}, 0, 0);

    SECTION("no checkpointing: accumulation takes what does not fit") {
        MemoryPlanInput all = base;
        all.micro_batch = 8;
        const std::size_t budget = snug::predict_memory(all).total - 1;
        const snug::BudgetPlan plan = snug::plan_for_budget(base, wanted, budget);
        INFO(snug::format_budget_plan(plan));
        REQUIRE(plan.fits);
        CHECK(plan.checkpoint == "none");
        CHECK(plan.micro_batch == 4);
        CHECK(plan.accumulation == 2);
        CHECK(plan.next_micro_batch == 8);
        CHECK(plan.tried.size() == 1);
        MemoryPlanInput chosen = base;
        chosen.micro_batch = 4;
        chosen.accumulation = 2;
        CHECK(run_input(chosen, budget).total <= budget);
        CHECK_THROWS_AS(run_input(all, budget), snug::OutOfMemory);
    }

    SECTION("checkpointing only when even micro-batch 1 does not fit without it") {
        MemoryPlanInput one = base;
        one.accumulation = wanted;
        const std::size_t budget = snug::predict_memory(one).total - 1;
        const snug::BudgetPlan plan = snug::plan_for_budget(base, wanted, budget);
        INFO(snug::format_budget_plan(plan));
        REQUIRE(plan.fits);
        CHECK(plan.checkpoint != "none");
        REQUIRE(plan.tried.size() >= 2);
        CHECK(plan.tried.front().checkpoint == "none");
        CHECK(plan.tried.front().micro_batch == 0);
        CHECK(plan.tried.front().bytes == budget + 1);
        CHECK(plan.micro_batch * plan.accumulation == wanted);
        MemoryPlanInput chosen = base;
        chosen.micro_batch = plan.micro_batch;
        chosen.accumulation = plan.accumulation;
        chosen.recompute = plan.recompute;
        const Measured m = run_input(chosen, budget);
        CHECK(m.total == plan.memory.total);
        CHECK(m.total <= budget);
        if (plan.next_micro_batch) {
            chosen.micro_batch = *plan.next_micro_batch;
            chosen.accumulation = wanted / *plan.next_micro_batch;
            CHECK_THROWS_AS(run_input(chosen, budget), snug::OutOfMemory);
        }
        CHECK(snug::format_budget_plan(plan).find("why: the cheaper checkpoint") != std::string::npos);
    }

    SECTION("nothing fits") {
        const snug::BudgetPlan plan = snug::plan_for_budget(base, wanted, 1000);
        CHECK_FALSE(plan.fits);
        CHECK(plan.tried.size() == 6);
        CHECK(plan.tried.back().checkpoint == "full");
    }
}

TEST_CASE("plan_for_budget for any meterable model: on GPT's type it gives the GPT search's answer") {
    const GPTConfig c = shape(64, 16, 4, 2, 16);
    const int wanted = 8;
    MemoryPlanInput base = plan_input(c, PrecisionKind::bf16, 1, 16, 1, {}, 0, 0);
    MemoryPlanInput one = base;
    one.accumulation = wanted;
    using Model = snug::GPT<snug::bfloat16, snug::Host>;
    for (const std::size_t budget : {snug::predict_memory(one).total - 1, std::size_t{1} << 30, std::size_t{1000}}) {
        INFO("budget " << budget);
        const snug::BudgetPlan gpt = snug::plan_for_budget(base, wanted, budget);
        const snug::BudgetPlan any =
            snug::plan_for_budget<Model, snug::precision::Bf16>(c, static_cast<const snug::RunShape&>(base), wanted,
                                                                budget);
        CHECK(any.fits == gpt.fits);
        CHECK(any.checkpoint == gpt.checkpoint);
        CHECK(any.recompute == gpt.recompute);
        CHECK(any.micro_batch == gpt.micro_batch);
        CHECK(any.accumulation == gpt.accumulation);
        CHECK(any.memory.total == gpt.memory.total);
        CHECK(any.tried.size() == gpt.tried.size());
    }
    const auto candidates = snug::checkpoint_candidates<Model>(c, 1, 16);
    const auto gpt_candidates = snug::checkpoint_candidates(c, PrecisionKind::bf16, 1, 16);
    REQUIRE(candidates.size() == gpt_candidates.size());
    for (std::size_t i = 0; i < candidates.size(); ++i) {
        CHECK(candidates[i].name == gpt_candidates[i].name);
        CHECK(candidates[i].recompute == gpt_candidates[i].recompute);
    }
}

TEST_CASE("the candidates' order and modes") {
    const GPTConfig c = shape(64, 16, 4, 2, 16);
    const auto candidates = snug::checkpoint_candidates(c, PrecisionKind::fp32, 1, 16);
    std::vector<std::string> names;
    for (const auto& k : candidates) names.push_back(k.name);
    CHECK(names == std::vector<std::string>{"none", "selective", "every:4", "every:3", "every:2", "full"});
    using R = Recompute;
    CHECK(candidates[3].recompute == std::vector<R>{R::full, R::none, R::none, R::full});
    CHECK(candidates[1].recompute == std::vector<R>(4, R::selective));

    CHECK(snug::recompute_plan_for("every:3", 5) == std::vector<R>{R::full, R::none, R::none, R::full, R::none});
    CHECK(snug::recompute_plan_for("every:1", 2) == std::vector<R>(2, R::full));
    CHECK(snug::recompute_plan_for("selective", 3) == std::vector<R>(3, R::selective));
    CHECK(snug::recompute_plan_for("none", 2) == std::vector<R>(2, R::none));
    CHECK(snug::recompute_plan_for("full", 2) == std::vector<R>(2, R::full));
    for (const char* bad : {"every:0", "every:", "every:x", "every:17", "auto", "Full"})
        CHECK_THROWS_AS(snug::recompute_plan_for(bad, 2), snug::ConfigError);
}

TEST_CASE("the largest model of a family that fits, and one block deeper does not") {
    const GPTConfig like = shape(64, 16, 1, 1, 64);
    const auto d = snug::depth_family(GPTConfig::preset("124M"));
    CHECK(d(12).n_layer == 12);
    CHECK(d(12).n_head == 12);
    CHECK(d(12).channels == 768);

    // A family small enough to train here: L = d, C = 8 d, NH = d.
    const snug::ModelFamily family = [&](int depth) {
        GPTConfig c = like;
        c.n_layer = depth;
        c.n_head = depth;
        c.channels = 8 * depth;
        return c;
    };
    MemoryPlanInput base = plan_input(like, PrecisionKind::fp32, 1, 16, 1, {}, 0, 0);
    auto least_at = [&](int depth) {
        MemoryPlanInput in = base;
        in.model = family(depth);
        std::size_t least = static_cast<std::size_t>(-1);
        for (const auto& k : snug::checkpoint_candidates(in.model, base.precision, 1, base.seq)) {
            in.recompute = k.recompute;
            least = std::min(least, snug::predict_memory(in).total);
        }
        return least;
    };
    const std::size_t budget = least_at(4) - 1;
    REQUIRE(least_at(3) <= budget);
    const snug::ModelFit fit = snug::largest_model_that_fits(family, base, budget);
    INFO(snug::format_model_fit(fit));
    CHECK(fit.depth == 3);
    CHECK(fit.next_depth_bytes == budget + 1);
    CHECK_FALSE(fit.at_limit);
    // Depth 5 with the search limited to 3: the limit, said as such.
    const snug::ModelFit limited = snug::largest_model_that_fits(family, base, least_at(5), 3);
    CHECK(limited.depth == 3);
    CHECK(limited.at_limit);
    CHECK_THAT(snug::format_model_fit(limited), Catch::Contains("the search stops at this depth"));
    MemoryPlanInput chosen = base;
    chosen.model = family(3);
    chosen.recompute = fit.recompute;
    CHECK(run_input(chosen, budget).total <= budget);
    // Depth 4 runs out under every policy.
    chosen.model = family(4);
    for (const auto& k : snug::checkpoint_candidates(chosen.model, base.precision, 1, base.seq)) {
        INFO("depth 4, checkpoint " << k.name);
        chosen.recompute = k.recompute;
        CHECK_THROWS_AS(run_input(chosen, budget), snug::OutOfMemory);
    }
    CHECK(snug::largest_model_that_fits(family, base, 100).depth == 0);
}

TEST_CASE("auto_recompute (--checkpoint auto): the first plan of growing recompute whose whole run fits") {
    const GPTConfig c = shape(64, 16, 4, 2, 16);
    MemoryPlanInput in = plan_input(c, PrecisionKind::bf16, 2, 16, 1, {}, 0, 0);
    const std::size_t keep_all = snug::predict_memory(in).total;
    in.recompute.assign(4, Recompute::full);
    const std::size_t full = snug::predict_memory(in).total;
    REQUIRE(full < keep_all);
    in.recompute.clear();
    const std::size_t budget = (keep_all + full) / 2;
    const std::vector<Recompute> plan = snug::auto_recompute(in, budget);
    CHECK(plan != std::vector<Recompute>(4, Recompute::none));
    const Measured m = run_like_trainer<snug::precision::Bf16>(c, 2, 16, 1, snug::checkpoint::Given{plan}, budget);
    CHECK(m.plan == plan);
    CHECK(m.total <= budget);
    CHECK(snug::auto_recompute(in, keep_all) == std::vector<Recompute>(4, Recompute::none));
    CHECK_THROWS_WITH(snug::auto_recompute(in, 1000), Catch::Contains("no recompute plan fits the budget of 1000 B") &&
                                                          Catch::Contains("smallest predicted peak of any plan"));
}

TEST_CASE("auto_recompute for any meterable model: on GPT's type it gives the GPT answer") {
    const GPTConfig c = shape(64, 16, 4, 2, 16);
    MemoryPlanInput in = plan_input(c, PrecisionKind::bf16, 2, 16, 1, {}, 0, 0);
    const std::size_t keep_all = snug::predict_memory(in).total;
    in.recompute.assign(4, Recompute::full);
    const std::size_t full = snug::predict_memory(in).total;
    in.recompute.clear();
    using Model = snug::GPT<snug::bfloat16, snug::Host>;
    const snug::RunShape& run = in;
    for (const std::size_t budget : {keep_all, (keep_all + full) / 2, (keep_all + 3 * full) / 4, full}) {
        INFO("budget " << budget);
        const std::vector<Recompute> gpt = snug::auto_recompute(in, budget);
        CHECK(snug::auto_recompute<Model, snug::precision::Bf16>(c, run, budget) == gpt);
    }
    CHECK_THROWS_WITH((snug::auto_recompute<Model, snug::precision::Bf16>(c, run, 1000)),
                      Catch::Contains("no recompute plan fits the budget of 1000 B"));
}

TEST_CASE("auto_recompute judges each plan by its total, not its activations alone") {
    // train_gpt's tiny fp16 run (2 layers, C 16, V 256, B 2, T 16): full
    // recomputation of both blocks needs the least in total, but a plan
    // before it in Budget's order keeps no more activations (and needs more
    // temporaries), so an activation budget could never reach it: --checkpoint
    // auto used to refuse budgets that `--checkpoint full` fits.
    const GPTConfig c = shape(256, 16, 2, 2, 16);
    MemoryPlanInput in = plan_input(c, PrecisionKind::fp16, 2, 16, 1, {}, 0, 0);
    const std::vector<Recompute> full(2, Recompute::full);
    in.recompute = full;
    const std::size_t full_total = snug::predict_memory(in).required;
    in.recompute.clear();
    std::size_t others = static_cast<std::size_t>(-1);  // the least any other plan needs
    for (const Recompute a : {Recompute::none, Recompute::selective, Recompute::full})
        for (const Recompute b : {Recompute::none, Recompute::selective, Recompute::full}) {
            MemoryPlanInput probe = in;
            probe.recompute = {a, b};
            if (probe.recompute != full) others = std::min(others, snug::predict_memory(probe).required);
        }
    REQUIRE(full_total < others);
    CHECK(snug::auto_recompute(in, full_total) == full);
    CHECK_THROWS_AS(snug::auto_recompute(in, full_total - 1), snug::OutOfMemory);
}
