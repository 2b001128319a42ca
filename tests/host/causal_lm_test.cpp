// CausalLM on the host, as a Llama (nn/llama.hpp): its tensors and their
// order, config errors, training under TrainStep with falling loss in fp32
// and bf16, every checkpoint plan giving the plain gradients to the bit with
// the activation peak the Meter twin predicts, and the whole run's memory
// plan (predict_training_memory) equal to the tracker's peaks to the byte.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "snug/accumulate/policies.hpp"
#include "snug/checkpoint/policies.hpp"
#include "snug/core/buffer.hpp"
#include "snug/core/rng.hpp"
#include "snug/nn/activation_peak.hpp"
#include "snug/nn/llama.hpp"
#include "snug/precision/policies.hpp"
#include "snug/report/text_report.hpp"
#include "snug/train/planner.hpp"
#include "snug/train/train_step.hpp"
#include "support/host_run.hpp"

using snug::Host;
using snug::LlamaConfig;
using snug::MemoryCategory;
using snug::Recompute;

namespace {

// kv_heads: 0 for multi-head attention, 2 or 1 for grouped queries.
LlamaConfig tiny(int kv_heads = 0) { return snug::make_llama_config(29, 16, 3, 16, 4, 40, kv_heads); }

// A synthetic task: random tokens, target (5 token + 2) mod V.
struct Task {
    std::vector<std::int32_t> tokens, targets;
    Task(int n, int V, std::uint64_t seed) {
        snug::Generator rng(seed);
        for (int i = 0; i < n; ++i) {
            tokens.push_back(static_cast<std::int32_t>(rng.below(static_cast<std::uint32_t>(V))));
            targets.push_back((tokens.back() * 5 + 2) % V);
        }
    }
};

// One fp32 update of a fresh tiny Llama (weights and a Task of B x T tokens
// from `seed`) under `checkpoint` and a tracker budget of `budget` bytes,
// with the ids in tracked memory as a real run keeps them: the tracker's
// peak. Throws OutOfMemory when the step does not fit.
template <class Checkpoint>
std::size_t one_step_peak(const LlamaConfig& c, int B, int T, std::size_t budget, Checkpoint checkpoint,
                          std::uint64_t seed) {
    using Model = snug::Llama<float, Host>;
    using P = snug::precision::Fp32;
    snug::test::HostRun run;
    run.tracker.set_budget(budget);
    Model model(c, run.tracker);
    const std::vector<float> w0 = model.initial_weights(seed);
    model.load_weights(run.ctx.device, w0);
    snug::TrainStep<Model, P, snug::accumulate::None, Checkpoint> step(
        model, run.tracker, run.ctx.device, w0, {}, P{}, snug::accumulate::None{}, std::move(checkpoint));
    const Task task(B * T, c.vocab_size, seed);
    snug::Buffer<std::int32_t, Host> tokens(run.tracker, MemoryCategory::workspace, task.tokens.size(), "token ids");
    snug::Buffer<std::int32_t, Host> targets(run.tracker, MemoryCategory::workspace, task.targets.size(),
                                             "target ids");
    std::copy(task.tokens.begin(), task.tokens.end(), tokens.data());
    std::copy(task.targets.begin(), task.targets.end(), targets.data());
    const snug::MicroBatch mb[] = {{tokens.data(), targets.data()}};
    (void)step.step(run.ctx, mb, B, T, 1e-3f);
    return run.tracker.peak_total();
}

}  // namespace

static_assert(snug::TrainableModel<snug::Llama<float, Host>>);
static_assert(!snug::Llama<float, Host>::supports_selective());

TEST_CASE("A Llama declares embedding, blocks, norm and an untied head, in that order", "[causal_lm]") {
    snug::test::HostRun run;
    const LlamaConfig c = tiny();
    const snug::Llama<float, Host> model(c, run.tracker);
    const auto tensors = model.registry().tensors();
    REQUIRE(tensors.size() == 1 + 6 * 3 + 2);
    CHECK(tensors.front().name == "embed_tokens.weight");
    CHECK(tensors.front().shape == snug::Shape{64, 16});
    CHECK(tensors[1].name == "layers.0.input_layernorm.weight");
    CHECK(tensors[tensors.size() - 2].name == "norm.weight");
    CHECK(tensors.back().name == "lm_head.weight");
    // 2 Vp C + L (2C + 4C^2 + 3HC) + C
    const std::int64_t C = 16, H = 40, Vp = 64;
    CHECK(model.num_parameters() == 2 * Vp * C + 3 * (2 * C + 4 * C * C + 3 * H * C) + C);
    // Each block's tensors lie together: one range per block, after the embedding.
    const std::int64_t block = 2 * C + 4 * C * C + 3 * H * C;
    for (int l = 0; l < 3; ++l)
        CHECK(model.block_parameters(l) == std::vector<snug::ParameterRange>{{Vp * C + l * block, block}});
    CHECK(run.tracker.current(MemoryCategory::parameters) == model.num_parameters() * sizeof(float));
    // The padded rows of both tables start at zero.
    const std::vector<float> w = model.initial_weights(1);
    const auto& head = model.registry().find("lm_head.weight");
    for (std::int64_t i = 29 * C; i < Vp * C; ++i) REQUIRE(w[static_cast<std::size_t>(head.offset + i)] == 0.0f);

    LlamaConfig bad = c;
    bad.padded_vocab_size = 20;
    CHECK_THROWS_WITH((snug::Llama<float, Host>(bad, run.tracker)),
                      Catch::Contains("padded_vocab_size 20") && Catch::Contains("vocab_size 29"));
    bad = c;
    bad.n_layer = 0;
    CHECK_THROWS_AS((snug::Llama<float, Host>(bad, run.tracker)), snug::ConfigError);
}

TEST_CASE("Every checkpoint plan gives a Llama the plain gradients, at the predicted activation peak", "[causal_lm]") {
    snug::test::HostRun run;
    const int kv_heads = GENERATE(0, 2, 1);
    INFO("key/value heads " << kv_heads);
    const LlamaConfig c = tiny(kv_heads);
    snug::Llama<float, Host> model(c, run.tracker);
    model.load_weights(run.ctx.device, model.initial_weights(3));
    const int B = 2, T = 12;
    const Task task(B * T, c.vocab_size, 4);
    const std::vector<std::vector<Recompute>> plans = {{Recompute::none, Recompute::none, Recompute::none},
                                                       {Recompute::full, Recompute::full, Recompute::full},
                                                       {Recompute::full, Recompute::none, Recompute::full}};
    std::vector<float> plain;
    std::size_t plain_peak = 0;
    for (const auto& plan : plans) {
        model.set_recompute(plan);
        model.zero_grad(run.ctx.device);
        run.tracker.reset_peaks();
        const float loss = model.forward(run.ctx, task.tokens.data(), task.targets.data(), B, T, 1.0f / (B * T));
        model.backward(run.ctx, task.tokens.data());
        CHECK(loss == Approx(std::log(29.0)).epsilon(0.05));  // about uniform at the start
        std::vector<float> grads(model.gradients(), model.gradients() + model.num_parameters());
        const std::size_t peak = run.tracker.peak(MemoryCategory::activations);
        CHECK(peak == snug::predict_activation_peak(model, B, T, plan));
        if (plain.empty()) {
            plain = grads;
            plain_peak = peak;
        } else {
            CHECK(grads == plain);
            CHECK(peak < plain_peak);
        }
    }
    std::size_t nonzero = 0;
    for (float g : plain) nonzero += g != 0.0f;
    CHECK(nonzero > plain.size() / 2);
    CHECK(run.activations.live_bytes() == 0);
}

TEMPLATE_TEST_CASE("A Llama trains under TrainStep: the loss falls, the memory plan is exact", "[causal_lm]",
                   snug::precision::Fp32, snug::precision::Bf16) {
    using Act = typename TestType::compute_type;
    using Model = snug::Llama<Act, Host>;
    snug::test::HostRun run;
    const int kv_heads = GENERATE(0, 2);  // multi-head, grouped queries
    INFO("key/value heads " << kv_heads);
    const LlamaConfig c = tiny(kv_heads);
    Model model(c, run.tracker);
    const std::vector<float> w0 = model.initial_weights(5);
    model.load_weights(run.ctx.device, w0);
    const int B = 4, T = 16;
    snug::TrainStep<Model, TestType, snug::accumulate::Steps, snug::checkpoint::EveryNth<2>> step(
        model, run.tracker, run.ctx.device, w0, {}, TestType{}, snug::accumulate::Steps(2));
    // Two micro-batches of ids, in tracked memory as a real run keeps them.
    const auto n = static_cast<std::size_t>(2 * B * T);
    snug::Buffer<std::int32_t, Host> tokens(run.tracker, MemoryCategory::workspace, n, "token ids");
    snug::Buffer<std::int32_t, Host> targets(run.tracker, MemoryCategory::workspace, n, "target ids");
    const snug::MicroBatch mb[] = {{tokens.data(), targets.data()},
                                   {tokens.data() + B * T, targets.data() + B * T}};
    std::vector<float> losses;
    for (int u = 0; u < 60; ++u) {
        const Task task(2 * B * T, c.vocab_size, 100 + u);
        std::copy(task.tokens.begin(), task.tokens.end(), tokens.data());
        std::copy(task.targets.begin(), task.targets.end(), targets.data());
        losses.push_back(step.step(run.ctx, mb, B, T, 3e-3f).loss);
    }
    INFO("first loss " << losses.front() << ", last " << losses.back());
    CHECK(losses.back() < 0.5f * losses.front());

    snug::RunShape shape;
    shape.micro_batch = B;
    shape.seq = T;
    shape.accumulation = 2;
    shape.recompute.assign(step.recompute_plan().begin(), step.recompute_plan().end());
    const snug::MemoryPlan plan = snug::predict_training_memory<Model, TestType>(c, shape);
    for (MemoryCategory cat : snug::all_memory_categories) {
        INFO(snug::category_name(cat));
        CHECK(plan[cat] == run.tracker.peak(cat));
    }
}

TEST_CASE("The largest micro-batch of a Llama for a budget: that many fit, one more does not", "[causal_lm]") {
    using Model = snug::Llama<float, Host>;
    const LlamaConfig c = tiny();
    snug::RunShape shape;
    shape.seq = 16;
    shape.micro_batch = 5;
    const std::size_t five = snug::predict_training_memory<Model, snug::precision::Fp32>(c, shape).total;
    CHECK(snug::largest_micro_batch<Model, snug::precision::Fp32>(c, shape, five) == 5);
    CHECK(snug::largest_micro_batch<Model, snug::precision::Fp32>(c, shape, five - 1) == 4);
    shape.micro_batch = 1;
    const std::size_t one = snug::predict_training_memory<Model, snug::precision::Fp32>(c, shape).total;
    CHECK(snug::largest_micro_batch<Model, snug::precision::Fp32>(c, shape, one - 1) == 0);
    // The real step at 5 under a tracker budget of `five` runs; at 6 it runs out.
    CHECK(one_step_peak(c, 5, 16, five, snug::checkpoint::None{}, 2) == five);
    CHECK_THROWS_AS(one_step_peak(c, 6, 16, five, snug::checkpoint::None{}, 2), snug::OutOfMemory);
}

TEST_CASE("The fastest plan for a Llama: the chosen configuration runs within the budget", "[causal_lm]") {
    using Model = snug::Llama<float, Host>;
    using P = snug::precision::Fp32;
    const LlamaConfig c = tiny();
    snug::RunShape base;
    base.seq = 16;
    // A budget one byte short of micro-batch 1 without checkpointing, 4 sequences per update.
    snug::RunShape one = base;
    one.accumulation = 4;
    const std::size_t budget = snug::predict_training_memory<Model, P>(c, one).total - 1;
    const snug::BudgetPlan plan = snug::plan_for_budget<Model, P>(c, base, 4, budget);
    INFO(snug::format_budget_plan(plan));
    REQUIRE(plan.fits);
    CHECK(plan.checkpoint != "none");
    CHECK(plan.micro_batch * plan.accumulation == 4);
    CHECK(plan.memory.total <= budget);
    // LlamaBlock does not recompute selectively, so selective (which
    // TrainStep would refuse for it) is not a candidate.
    REQUIRE_FALSE(snug::recomputes_selectively<Model>());
    std::vector<std::string> names;
    for (const auto& k : snug::checkpoint_candidates<Model>(c, 1, 16)) names.push_back(k.name);
    CHECK(names == std::vector<std::string>{"none", "every:4", "every:3", "every:2", "full"});
    CHECK_FALSE(snug::plan_for_budget<Model, P>(c, base, 4, 1000).fits);
}

TEST_CASE("checkpoint auto for a Llama: the plan it picks runs within the budget at the predicted peak",
          "[causal_lm]") {
    using Model = snug::Llama<float, Host>;
    using P = snug::precision::Fp32;
    const LlamaConfig c = tiny();
    const int B = 4, T = 16;
    snug::RunShape shape;
    shape.micro_batch = B;
    shape.seq = T;
    const std::size_t keep_all = snug::predict_training_memory<Model, P>(c, shape).total;
    shape.recompute.assign(static_cast<std::size_t>(c.n_layer), Recompute::full);
    const std::size_t full = snug::predict_training_memory<Model, P>(c, shape).total;
    REQUIRE(full < keep_all);
    shape.recompute.clear();
    const std::size_t budget = (keep_all + full) / 2;
    const std::vector<Recompute> plan = snug::auto_recompute<Model, P>(c, shape, budget);
    CHECK(plan != std::vector<Recompute>(static_cast<std::size_t>(c.n_layer), Recompute::none));
    CHECK(std::find(plan.begin(), plan.end(), Recompute::selective) == plan.end());  // LlamaBlock cannot
    CHECK(snug::auto_recompute<Model, P>(c, shape, keep_all) ==
          std::vector<Recompute>(static_cast<std::size_t>(c.n_layer), Recompute::none));
    CHECK_THROWS_WITH((snug::auto_recompute<Model, P>(c, shape, 1000)),
                      Catch::Contains("no recompute plan fits the budget of 1000 B"));

    // The real step under that plan and a tracker budget of `budget` runs, at the predicted peak.
    const std::size_t peak = one_step_peak(c, B, T, budget, snug::checkpoint::Given{plan}, 3);
    shape.recompute = plan;
    CHECK(peak == snug::predict_training_memory<Model, P>(c, shape).total);
    CHECK(peak <= budget);
}

TEST_CASE("A Llama's final norm takes the blocks' epsilon, not RMSNorm's default", "[causal_lm]") {
    // With an epsilon far above the residual stream's mean square (embeddings
    // of std 0.02), every norm's output, the final one's included, is about
    // x / sqrt(eps): the logits are ~0 and the loss is ln(V) to a few 1e-5.
    // A final norm left at 1e-5 normalises the stream to rms 1 and its logits
    // move the loss by far more.
    LlamaConfig c = tiny();
    c.block.norm_eps = 1e6;
    snug::test::HostRun run;
    snug::Llama<float, Host> model(c, run.tracker);
    model.load_weights(run.ctx.device, model.initial_weights(3));
    const Task task(2 * 16, c.vocab_size, 4);
    const float loss = model.evaluate(run.ctx, task.tokens.data(), task.targets.data(), 2, 16);
    CHECK(std::abs(loss - std::log(static_cast<float>(c.vocab_size))) < 1e-4f);
    // The same weights with the default epsilon everywhere: a loss ln(V) does not explain.
    LlamaConfig d = tiny();
    snug::test::HostRun run2;
    snug::Llama<float, Host> plain(d, run2.tracker);
    plain.load_weights(run2.ctx.device, plain.initial_weights(3));
    const float loss2 = plain.evaluate(run2.ctx, task.tokens.data(), task.targets.data(), 2, 16);
    CHECK(std::abs(loss2 - std::log(static_cast<float>(c.vocab_size))) > 1e-3f);
}

TEST_CASE("A Llama planned with the precision named at run time: the measured peak of the real step", "[causal_lm]") {
    const LlamaConfig c = tiny();
    snug::PlanInput<LlamaConfig> in;
    in.model = c;
    in.precision = snug::PrecisionKind::fp32;
    in.micro_batch = 3;
    in.seq = 16;
    in.recompute.assign(static_cast<std::size_t>(c.n_layer), Recompute::full);
    const snug::MemoryPlan plan = snug::predict_memory(in);
    // The real fp32 update under full checkpointing (one_step_peak adds no
    // evaluation, and neither does a plan without a sampling window: the
    // evaluation pass of the plan is the training forward's subset).
    CHECK(plan.total == one_step_peak(c, 3, 16, std::size_t{1} << 30, snug::checkpoint::Full{}, 4));
    // The searches take it too: the largest micro-batch for that total is 3.
    CHECK(snug::largest_micro_batch(in, plan.total) == 3);
    CHECK(snug::largest_micro_batch(in, plan.total - 1) == 2);
    // and a Llama's blocks are not offered selective recomputation.
    for (const auto& k : snug::checkpoint_candidates(c, snug::PrecisionKind::bf16, 1, 16)) CHECK(k.name != "selective");
}

TEST_CASE("A Llama's summary counts its parameters and model FLOPs from its shape", "[causal_lm]") {
    const LlamaConfig c = tiny();
    const snug::ModelSummary s = snug::model_summary(c);
    const std::int64_t C = c.block.channels, H = c.block.hidden, V = c.vocab_size, Vp = c.padded_vocab_size;
    // Two norms, qkv, o, gate+up, down.
    const std::int64_t block = 2 * C + 3 * C * C + C * C + 2 * H * C + H * C;
    CHECK(s.family == "llama");
    CHECK(s.layers == c.n_layer);
    CHECK(s.heads == c.block.heads);
    CHECK(s.channels == C);
    CHECK(s.block_parameters == block);
    // Embedding and untied head (Vp rows each), the blocks, the final norm.
    CHECK(s.parameters == 2 * Vp * C + c.n_layer * block + C);
    const double T = 16;
    CHECK(s.flops_per_token(16) ==
          6.0 * (static_cast<double>(V) * C + static_cast<double>(c.n_layer) * block + C) + 12.0 * c.n_layer * C * T);
}
