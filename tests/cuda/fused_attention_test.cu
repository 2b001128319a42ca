// The fused attention engine this executable registered (cuDNN's SDPA,
// snug/cuda/cudnn_attention.hpp, through examples/cudnn_engine.cpp;
// emulated, its emulated twin) against the host flash kernels, the twin every
// attention path is held to: fresh random inputs, every output poisoned
// first, bfloat16 and half, forward and backward (twice: the deterministic
// backward gives the same bits). Also its refusals, its workspace, the layer
// wiring (a GPT whose attention runs on the engine against the host's, and
// checkpointed == plain), and the planner's prediction of a whole run with
// the engine's workspace, to the byte.
//
// Tolerances, relative to |host| + rms(host): out 8 units of roundoff of the
// 16-bit type (2^-5 bfloat16, 2^-8 half), dqkv the same, lse 1e-4. cuDNN
// tiles and rounds in its own order (the host kernel follows snug's
// contract): twice the flash kernels' bound (tests/cuda/flash_attention_test.cu),
// stated before any GPU run; on the emulated backend the engine is the host
// kernel, so the comparisons there check the wiring (strides, offsets, types).
// Where this executable has no engine (a GPU build without cuDNN) each test
// says so and checks nothing.
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "snug/cuda/fused_attention.hpp"
#include "snug/host/flash_attention.hpp"
#include "snug/snug.hpp"
#include "snug/train/run.hpp"
#include "snug/train/run_plan.hpp"
#include "support/cuda_support.hpp"
#include "support/model_pass.hpp"

using snug::Cuda;
using snug::FusedAttentionShape;
using snug::MemoryTracker;
using namespace snug::test;

namespace {

snug::cuda::FusedAttention* engine_or_say_why() {
    snug::cuda::FusedAttention* engine = snug::cuda::registered_fused_attention();
    if (engine == nullptr) WARN("nothing checked: this executable has no fused attention engine (built without cuDNN)");
    return engine;
}

// Eight units of roundoff of the 16-bit types (4 ulps).
template <class T>
constexpr double engine_tolerance() {
    return std::is_same_v<T, snug::bfloat16> ? 8.0 / 256.0 : 8.0 / 2048.0;
}

template <class T>
void check_engine(snug::cuda::FusedAttention& engine, snug::Generator& rng, int B, int T_, int C, int NH) {
    INFO("B = " << B << ", T = " << T_ << ", C = " << C << ", NH = " << NH);
    MemoryTracker tracker;
    Cuda dev{};
    dev.fused = &engine;
    REQUIRE(snug::cuda::fused_attention_refusal<T>(dev, B, T_, C, NH) == "");
    const auto bt = static_cast<std::size_t>(B) * static_cast<std::size_t>(T_);
    const auto c = static_cast<std::size_t>(C);
    const auto stats = static_cast<std::size_t>(snug::ops::flash_stat_elems(B, T_, NH));
    const auto qkv = random_values<T>(rng, bt * 3 * c, -1.5f, 1.5f);
    const auto dout = random_values<T>(rng, bt * c, -1.0f, 1.0f);
    auto qkv_d = to_device(tracker, qkv);
    auto out_d = poisoned<T>(tracker, bt * c);
    auto lse_d = poisoned<float>(tracker, stats);
    {
        auto workspace = poisoned<std::byte>(
            tracker, snug::cuda::fused_attention_workspace<T>(dev, snug::AttentionPass::forward, B, T_, C, NH));
        snug::cuda::fused_attention_forward(dev, workspace.data(), out_d.data(), lse_d.data(), qkv_d.data(), B, T_, C,
                                            NH);
    }
    const auto out = to_host(out_d);
    const auto lse = to_host(lse_d);
    const snug::Host host;
    std::vector<T> host_out(bt * c);
    std::vector<float> host_lse(stats);
    snug::host::flash_attention_forward(host, host_out.data(), host_lse.data(), qkv.data(), B, T_, C, NH);
    check_close(out, host_out, engine_tolerance<T>(), "out against the host");
    check_close(lse, host_lse, 1e-4, "lse against the host");

    // The backward from the engine's out and lse, on both sides; twice on
    // the device, which must give the same bits.
    auto dout_d = to_device(tracker, dout);
    std::vector<T> first;
    for (int run = 0; run < 2; ++run) {
        auto dqkv_d = poisoned<T>(tracker, bt * 3 * c);
        auto workspace = poisoned<std::byte>(
            tracker, snug::cuda::fused_attention_workspace<T>(dev, snug::AttentionPass::backward, B, T_, C, NH));
        snug::cuda::fused_attention_backward(dev, workspace.data(), dqkv_d.data(), dout_d.data(), qkv_d.data(),
                                             out_d.data(), lse_d.data(), B, T_, C, NH);
        if (run == 0)
            first = to_host(dqkv_d);
        else
            check_same_bits(to_host(dqkv_d), first, "dqkv, second run");
    }
    std::vector<T> host_dqkv(bt * 3 * c);
    std::vector<float> host_D(stats);
    snug::host::flash_attention_backward(host, host_dqkv.data(), host_D.data(), dout.data(), qkv.data(), out.data(),
                                         lse.data(), B, T_, C, NH);
    check_close(first, host_dqkv, engine_tolerance<T>(), "dqkv against the host");
}

snug::GPTConfig small_config() {
    snug::GPTConfig c;
    c.vocab_size = 61;
    c.padded_vocab_size = 64;
    c.max_seq_len = 40;
    c.n_layer = 2;
    c.n_head = 3;
    c.channels = 48;  // head size 16
    return c;
}

}  // namespace

TEMPLATE_TEST_CASE("the fused attention engine matches the host flash kernels", "[cuda][fused_attention]",
                   snug::bfloat16, snug::half) {
    snug::cuda::FusedAttention* engine = engine_or_say_why();
    if (engine == nullptr) return;
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    check_engine<TestType>(*engine, rng, 2, 70, 128, 2);  // hs 64, two key tiles, the second partial
    check_engine<TestType>(*engine, rng, 1, 33, 96, 3);   // hs 32
    check_engine<TestType>(*engine, rng, 2, 1, 64, 1);    // one row
}

TEST_CASE("the fused attention engine refuses what it does not take, naming why, and sizes its workspace",
          "[cuda][fused_attention]") {
    snug::cuda::FusedAttention* engine = engine_or_say_why();
    if (engine == nullptr) return;
    CHECK_THAT(engine->refusal({snug::DType::f32, 2, 16, 64, 2}), Catch::Contains("bf16 or fp16"));
    CHECK(engine->refusal({snug::DType::bf16, 2, 16, 24, 2}) != "");  // hs 12: not a multiple of 8
    CHECK_THROWS_WITH(engine->workspace_bytes({snug::DType::bf16, 2, 16, 24, 2}, snug::AttentionPass::backward),
                      Catch::StartsWith("cuDNN SDPA (bf16, B 2, T 16, C 24, NH 2): "));
    CHECK(engine->refusal({snug::DType::bf16, 2, 16, 64, 2}) == "");
    CHECK_THAT(engine->describe(), Catch::StartsWith("cuDNN 9.") && Catch::Contains("fused SDPA (frontend 1."));
    // Without an engine, a device tag refuses every call.
    CHECK_THAT(snug::cuda::fused_attention_refusal<snug::bfloat16>(Cuda{}, 2, 16, 64, 2),
               Catch::Contains("built without cuDNN"));
#if defined(SNUG_CUDA_EMULATED)
    // The emulator's documented sizes: nothing forward; backward, the softmax
    // sums (B NH T fp32) and the deterministic path's dP buffer (B NH T64^2 2 bytes).
    const FusedAttentionShape s{snug::DType::f16, 3, 70, 64, 2};
    CHECK(engine->workspace_bytes(s, snug::AttentionPass::forward) == 0);
    CHECK(engine->workspace_bytes(s, snug::AttentionPass::backward) == 3 * 2 * 70 * 4 + 3 * 2 * 128 * 128 * 2);
#endif
}

TEST_CASE("a GPT whose attention runs on the fused engine matches the host's, and checkpointing changes no bit",
          "[cuda][fused_attention]") {
    if (engine_or_say_why() == nullptr) return;
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    snug::GPTConfig host_config = small_config();
    snug::GPTConfig fused_config = host_config;
    fused_config.attention = snug::AttentionKind::cudnn;
    const auto w = snug::gpt_initial_weights(host_config, seed);
    snug::Generator g(seed + 1);
    const int B = 3, T = 33;
    std::vector<std::int32_t> tokens(B * T), targets(B * T);
    for (auto& t : tokens) t = static_cast<std::int32_t>(g.below(61));
    for (auto& t : targets) t = static_cast<std::int32_t>(g.below(61));
    using Act = snug::bfloat16;
    const auto host = training_pass<snug::GPT<Act, snug::Host>>(host_config, w, tokens, targets, B, T);
    const auto fused = training_pass<snug::GPT<Act, Cuda>>(fused_config, w, tokens, targets, B, T);
    check_pass_close<Act>(fused, host, snug::gpt_named_tensors(host_config));
    const auto recomputed =
        training_pass<snug::GPT<Act, Cuda>>(fused_config, w, tokens, targets, B, T, snug::Recompute::full);
    CHECK(recomputed.loss == fused.loss);
    CHECK(recomputed.grads == fused.grads);
}

TEST_CASE("a run whose attention runs on the fused engine is planned to the byte, its workspace included",
          "[cuda][fused_attention]") {
    if (engine_or_say_why() == nullptr) return;
    snug::TrainOptions o;
    o.layers = 2;
    o.heads = 2;
    o.channels = 32;  // head size 16
    o.run = snug::RunSpec{snug::PrecisionKind::bf16, snug::CheckpointKind::none, /*micro_batch=*/2, /*seq=*/16,
                          /*accumulation=*/2};
    o.steps = 2;
    o.warmup = 1;
    o.eval_every = 2;
    o.eval_batches = 1;
    o.sample = 0;
    o.budget_bytes = std::nullopt;
    const snug::DeviceInfo device = snug::choose_device("cuda");
    o.attention = snug::resolve_attention(snug::AttentionKind::automatic, device);
    REQUIRE(o.attention == snug::AttentionKind::cudnn);
    const snug::RunInputs in = snug::load_inputs(o, o.run.tokens_per_update() * o.steps + 1);
    snug::Report silent;
    const snug::RunResult r = snug::train<Cuda, snug::precision::Bf16>(o, in.data, in.source, device, silent);
    REQUIRE(r.exit_code == 0);
    CHECK_THAT(r.attention, Catch::StartsWith("cuDNN 9."));
    const snug::MemoryPlan plan = snug::predict_memory(snug::plan_input(o, in.source.config, snug::plan_target(device)));
    for (snug::MemoryCategory c : snug::all_memory_categories) {
        INFO(snug::category_name(c));
        CHECK(plan[c] == r.peak_bytes[static_cast<std::size_t>(c)]);
    }
    CHECK(plan.total == r.peak_total);
    // The engine's backward workspace sets the temporaries' peak: the same run
    // planned without the engine (the flash kernels' row sums) peaks lower.
    snug::PlanTarget without = snug::plan_target(device);
    without.fused = nullptr;
    const snug::MemoryPlan flash = snug::predict_memory(snug::plan_input(o, in.source.config, without));
    CHECK(flash[snug::MemoryCategory::temporaries] < plan[snug::MemoryCategory::temporaries]);
}
