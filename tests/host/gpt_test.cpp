// The GPT model on the host backend: presets and parameter counts, exact
// memory accounting, the forward/backward protocol and its errors,
// determinism, 16-bit variants, and that AdamW training lowers the loss.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "snug/core/rng.hpp"
#include "snug/nn/gpt.hpp"
#include "snug/optim/adamw.hpp"
#include "snug/optim/grad_norm.hpp"
#include "support/host_run.hpp"

using snug::GPTConfig;
using snug::MemoryCategory;

namespace {

GPTConfig tiny() {
    GPTConfig c;
    c.vocab_size = 61;
    c.padded_vocab_size = 64;
    c.max_seq_len = 12;
    c.n_layer = 2;
    c.n_head = 3;
    c.channels = 24;
    return c;
}

std::vector<std::int32_t> random_tokens(std::size_t n, int vocab, std::uint64_t seed) {
    snug::Generator g(seed);
    std::vector<std::int32_t> t(n);
    for (auto& x : t) x = static_cast<std::int32_t>(g.below(static_cast<std::uint32_t>(vocab)));
    return t;
}

}  // namespace

TEST_CASE("presets have GPT-2's shapes and parameter counts") {
    // llm.c reports 124,475,904 parameters for GPT-2 small with the vocabulary padded to 50304.
    CHECK(GPTConfig::preset("124M").num_parameters() == 124475904);
    const GPTConfig m = GPTConfig::preset("350M");
    CHECK((m.n_layer == 24 && m.n_head == 16 && m.channels == 1024));
    CHECK(GPTConfig::preset("d12").num_parameters() == GPTConfig::preset("124M").num_parameters());
    CHECK(GPTConfig::preset("1558M").channels == 1600);
    CHECK(GPTConfig::preset("d2").n_layer == 2);
    CHECK_THROWS_AS(GPTConfig::preset("gpt5"), snug::ConfigError);
    CHECK(GPTConfig::pad_vocab(50257) == 50304);
    CHECK(GPTConfig::pad_vocab(256) == 256);
    GPTConfig bad = tiny();
    bad.channels = 25;  // not a multiple of 3 heads
    CHECK_THROWS_WITH(bad.validate(), Catch::Contains("channels (25)") && Catch::Contains("n_head (3)"));
    bad = tiny();
    bad.padded_vocab_size = 60;
    CHECK_THROWS_AS(bad.validate(), snug::ConfigError);
}

TEST_CASE("model FLOPs per token follow 6N + 12 L C T") {
    const GPTConfig c = GPTConfig::preset("124M");
    // N counts the tied wte once (V rows, not the padding), the blocks and ln_f.
    const double N = 50257.0 * 768 + 12.0 * (12.0 * 768 * 768 + 13.0 * 768) + 2.0 * 768;
    CHECK(c.flops_per_token(1024) == Approx(6.0 * N + 12.0 * 12 * 768 * 1024).epsilon(1e-12));
}

TEST_CASE("memory is accounted exactly: parameters, gradients, activations, temporaries") {
    GPTConfig c = tiny();
    c.attention = GENERATE(snug::AttentionKind::flash, snug::AttentionKind::materialized);
    INFO(snug::attention_kind_name(c.attention) << " attention");
    snug::test::HostRun run;
    snug::GPT<float, snug::Host> model(c, run.tracker);
    const std::int64_t P = c.num_parameters();
    CHECK(model.num_parameters() == P);
    CHECK(run.tracker.current(MemoryCategory::parameters) == static_cast<std::size_t>(P) * 4);
    CHECK(run.tracker.current(MemoryCategory::gradients) == static_cast<std::size_t>(P) * 4);
    model.load_weights(run.ctx.device, snug::gpt_initial_weights(c, 1));
    model.zero_grad(run.ctx.device);

    const int B = 2, T = 9;
    const auto tokens = random_tokens(B * T, c.vocab_size, 3), targets = random_tokens(B * T, c.vocab_size, 4);
    model.forward(run.ctx, tokens.data(), targets.data(), B, T, 1.0f / (B * T));
    model.backward(run.ctx, tokens.data());

    // What the design keeps, in bytes (A = 4 for fp32, N = B T):
    //   embedding and every block output (N C A each), per block ln1, ln2 (N C A),
    //   their mean and rstd (4 N floats), qkv (3 N C A), what attention keeps
    //   (flash: one fp32 log-sum-exp per row, 4 B NH T; materialised: the
    //   probabilities, B NH T² A), attention output and the residual (N C A each),
    //   the MLP hidden before and after GELU (4 N C A each); ln_f's mean and rstd
    //   (8 N) and the head's gradient for ln_f (N C A). No logits: the head ran
    //   a chunk at a time in scratch.
    const std::size_t A = 4, N = B * T, C = static_cast<std::size_t>(c.channels), L = 2, NH = 3,
                      Vp = static_cast<std::size_t>(c.padded_vocab_size);
    const bool flash = c.attention == snug::AttentionKind::flash;
    const std::size_t att = flash ? 4 * B * NH * T : A * B * NH * T * T;
    const std::size_t activations = A * (N * C + L * 16 * N * C + N * C) + L * att + 16 * L * N + 8 * N;
    CHECK(run.tracker.peak(MemoryCategory::activations) == activations);
    // Temporaries: the larger of the head's in forward — ln_f (N C A), the
    // per-token losses (4 N) and one chunk of logits: the automatic chunk is
    // at least 128 rows, so here all N (N Vp A) — and backward's: two (N, C) residual-stream gradients
    // plus, within a block, the larger of the MLP's hidden gradient (4 N C)
    // and attention's d out and d qkv (N C + 3 N C) with its scratch, as large
    // as what it keeps (flash: D per row; materialised: dS).
    const std::size_t head = A * N * C + 4 * N + N * Vp * A;
    const std::size_t block_backward = A * (2 * N * C + 4 * N * C) + att;
    CHECK(head < block_backward);
    CHECK(run.tracker.peak(MemoryCategory::temporaries) == block_backward);
    CHECK(run.tracker.current(MemoryCategory::activations) == 0);
    CHECK(run.tracker.current(MemoryCategory::temporaries) == 0);
}

TEST_CASE("forward and backward enforce their protocol with clear errors") {
    const GPTConfig c = tiny();
    snug::test::HostRun run;
    snug::GPT<float, snug::Host> model(c, run.tracker);
    model.load_weights(run.ctx.device, snug::gpt_initial_weights(c, 1));
    const auto tokens = random_tokens(2 * 12, c.vocab_size, 5);
    CHECK_THROWS_AS(model.backward(run.ctx, tokens.data()), snug::Error);
    CHECK_THROWS_WITH(model.forward(run.ctx, tokens.data(), tokens.data(), 1, 13, 1.0f),
                      Catch::Contains("T = 13 tokens are longer than the model's context, max_seq_len = 12") &&
                          Catch::Contains("larger max_seq_len") && !Catch::Contains("positive"));
    CHECK_THROWS_WITH(model.forward(run.ctx, tokens.data(), tokens.data(), 0, 12, 1.0f),
                      Catch::Contains("B = 0 and T = 12 must both be positive"));
    CHECK_THROWS_AS(model.forward(run.ctx, tokens.data(), nullptr, 2, 12, 1.0f), snug::Error);
    model.forward(run.ctx, tokens.data(), tokens.data(), 2, 12, 1.0f);
    CHECK_THROWS_AS(model.forward(run.ctx, tokens.data(), tokens.data(), 2, 12, 1.0f), snug::Error);
    CHECK_THROWS_AS(model.release(run.ctx), snug::Error);  // a training pass must be finished by backward
    model.backward(run.ctx, tokens.data());
    // An evaluation pass leaves the logits readable until release.
    const float loss = model.evaluate(run.ctx, tokens.data(), tokens.data(), 2, 12);
    CHECK(std::isfinite(loss));
    CHECK_THROWS_AS(model.logits(), snug::Error);
    std::vector<float> wrong(7);
    CHECK_THROWS_AS(model.load_weights(run.ctx.device, wrong), snug::ShapeError);
    const std::vector<std::int32_t> bad_target(2 * 12, c.vocab_size);  // id == V is out of range
    CHECK_THROWS_WITH(model.forward(run.ctx, tokens.data(), bad_target.data(), 2, 12, 0.0f),
                      Catch::Contains(std::to_string(c.vocab_size)));
}

TEST_CASE("a pass is deterministic: the same gradients to the bit") {
    const GPTConfig c = tiny();
    snug::test::HostRun run;
    snug::GPT<float, snug::Host> model(c, run.tracker);
    model.load_weights(run.ctx.device, snug::gpt_initial_weights(c, 7));
    const auto tokens = random_tokens(3 * 10, c.vocab_size, 8), targets = random_tokens(3 * 10, c.vocab_size, 9);
    std::vector<std::vector<float>> grads;
    for (int run_i = 0; run_i < 2; ++run_i) {
        model.zero_grad(run.ctx.device);
        model.forward(run.ctx, tokens.data(), targets.data(), 3, 10, 1.0f / 30);
        model.backward(run.ctx, tokens.data());
        grads.emplace_back(model.gradients(), model.gradients() + model.num_parameters());
    }
    CHECK(grads[0] == grads[1]);
}

// Flash attention (the default) against the materialised kernel on the same
// weights and batch: the loss and every gradient within 1e-5 of the largest
// gradient (fp32; the two sum the same products in another order), and at
// least the probabilities' bytes saved. T = 70 crosses a 64-row tile.
TEST_CASE("flash and materialised attention train the same GPT") {
    GPTConfig c = tiny();
    c.max_seq_len = 70;
    const auto weights = snug::gpt_initial_weights(c, 21);
    const int B = 2, T = 70;
    const auto tokens = random_tokens(B * T, c.vocab_size, 22), targets = random_tokens(B * T, c.vocab_size, 23);
    struct Result {
        float loss;
        std::vector<float> grads;
        std::size_t activation_peak;
    };
    auto pass = [&](snug::AttentionKind kind) {
        GPTConfig k = c;
        k.attention = kind;
        snug::test::HostRun run;
        snug::GPT<float, snug::Host> model(k, run.tracker);
        model.load_weights(run.ctx.device, weights);
        model.zero_grad(run.ctx.device);
        const float loss = model.forward(run.ctx, tokens.data(), targets.data(), B, T, 1.0f / (B * T));
        model.backward(run.ctx, tokens.data());
        return Result{loss, std::vector<float>(model.gradients(), model.gradients() + model.num_parameters()),
                      run.tracker.peak(MemoryCategory::activations)};
    };
    const Result flash = pass(snug::AttentionKind::flash);
    const Result materialized = pass(snug::AttentionKind::materialized);
    CHECK(std::abs(flash.loss - materialized.loss) < 1e-5 * materialized.loss);
    float largest = 0;
    for (float g : materialized.grads) largest = std::max(largest, std::abs(g));
    REQUIRE(largest > 0);
    std::size_t off = 0;
    for (std::size_t i = 0; i < flash.grads.size(); ++i)
        off += std::abs(flash.grads[i] - materialized.grads[i]) > 1e-5f * largest ? 1 : 0;
    CHECK(off == 0);
    // Per block: B NH T² fp32 probabilities kept, against B NH T fp32 statistics.
    const std::size_t saved = std::size_t{2} * B * 3 * (std::size_t{T} * T * 4 - std::size_t{T} * 4);
    CHECK(materialized.activation_peak - flash.activation_peak == saved);
}

TEST_CASE("any classifier chunk trains the same GPT, and sampling's logits are the last position's") {
    GPTConfig c = tiny();
    const auto weights = snug::gpt_initial_weights(c, 31);
    const int B = 2, T = 12;
    const auto tokens = random_tokens(B * T, c.vocab_size, 32), targets = random_tokens(B * T, c.vocab_size, 33);
    struct Result {
        float loss;
        std::vector<float> grads;
        std::size_t temporaries_peak;
    };
    auto pass = [&](std::int64_t chunk) {
        GPTConfig k = c;
        k.classifier_chunk = chunk;
        snug::test::HostRun run;
        snug::GPT<float, snug::Host> model(k, run.tracker);
        model.load_weights(run.ctx.device, weights);
        model.zero_grad(run.ctx.device);
        const float loss = model.forward(run.ctx, tokens.data(), targets.data(), B, T, 1.0f / (B * T));
        model.backward(run.ctx, tokens.data());
        return Result{loss, std::vector<float>(model.gradients(), model.gradients() + model.num_parameters()),
                      run.tracker.peak(MemoryCategory::temporaries)};
    };
    const Result whole = pass(B * T);  // one chunk: the unchunked head
    float largest = 0;
    for (float g : whole.grads) largest = std::max(largest, std::abs(g));
    REQUIRE(largest > 0);
    for (const std::int64_t chunk : {std::int64_t{0}, std::int64_t{1}, std::int64_t{7}}) {
        INFO("chunk " << chunk);
        const Result r = pass(chunk);
        CHECK(std::abs(r.loss - whole.loss) <= 1e-6f * whole.loss);
        std::size_t off = 0;
        for (std::size_t i = 0; i < r.grads.size(); ++i)
            off += std::abs(r.grads[i] - whole.grads[i]) > 1e-5f * largest ? 1 : 0;
        CHECK(off == 0);
    }

    // Sampling's forward keeps B rows of logits: each the whole forward's last.
    snug::test::HostRun run;
    snug::GPT<float, snug::Host> model(c, run.tracker);
    model.load_weights(run.ctx.device, weights);
    model.forward(run.ctx, tokens.data(), nullptr, B, T, 0.0f);
    const std::vector<float> all(model.logits().data(), model.logits().data() + std::size_t{B} * T * 64);
    model.release(run.ctx);
    model.forward_last(run.ctx, tokens.data(), B, T);
    REQUIRE(model.logits().shape()[1] == 1);
    const float* last = model.logits().data();
    for (int b = 0; b < B; ++b)
        for (int v = 0; v < 64; ++v)
            CHECK(std::abs(last[b * 64 + v] - all[static_cast<std::size_t>((b * T + T - 1) * 64 + v)]) <= 1e-6f);
    model.release(run.ctx);
    CHECK(run.tracker.current(MemoryCategory::activations) == 0);
    CHECK(run.tracker.current(MemoryCategory::temporaries) == 0);
}

TEMPLATE_TEST_CASE("a 16-bit GPT tracks the fp32 one", "", snug::bfloat16, snug::half) {
    const GPTConfig c = tiny();
    const auto weights = snug::gpt_initial_weights(c, 11);
    const auto tokens = random_tokens(2 * 12, c.vocab_size, 12), targets = random_tokens(2 * 12, c.vocab_size, 13);
    snug::test::HostRun r32, r16;
    snug::GPT<float, snug::Host> m32(c, r32.tracker);
    snug::GPT<TestType, snug::Host> m16(c, r16.tracker);
    m32.load_weights(r32.ctx.device, weights);
    m16.load_weights(r16.ctx.device, weights);
    CHECK(r16.tracker.current(MemoryCategory::parameters) * 2 == r32.tracker.current(MemoryCategory::parameters));
    m32.zero_grad(r32.ctx.device);
    m16.zero_grad(r16.ctx.device);
    const float l32 = m32.forward(r32.ctx, tokens.data(), targets.data(), 2, 12, 1.0f / 24);
    const float l16 = m16.forward(r16.ctx, tokens.data(), targets.data(), 2, 12, 1.0f / 24);
    m32.backward(r32.ctx, tokens.data());
    m16.backward(r16.ctx, tokens.data());
    CHECK(std::abs(l16 - l32) / l32 < 1e-2);
    // The gradients point the same way: cosine similarity of the whole vector.
    double dot = 0, n32 = 0, n16 = 0;
    for (std::int64_t i = 0; i < m32.num_parameters(); ++i) {
        dot += double(m32.gradients()[i]) * m16.gradients()[i];
        n32 += double(m32.gradients()[i]) * m32.gradients()[i];
        n16 += double(m16.gradients()[i]) * m16.gradients()[i];
    }
    CHECK(dot / std::sqrt(n32 * n16) > 0.99);
}

TEST_CASE("AdamW with clipping overfits one batch: the loss falls") {
    const GPTConfig c = tiny();
    snug::test::HostRun run;
    snug::GPT<float, snug::Host> model(c, run.tracker);
    const auto w0 = snug::gpt_initial_weights(c, 21);
    model.load_weights(run.ctx.device, w0);
    snug::AdamWConfig cfg;
    cfg.weight_decay = 0.0f;
    snug::AdamW<float, snug::Host> opt(run.ctx.device, run.tracker, model.num_parameters(),
                                       snug::gpt_parameter_groups(c), cfg, w0);
    snug::GradNorm<snug::Host> grad_norm(run.tracker);
    const auto tokens = random_tokens(4 * 12, c.vocab_size, 22), targets = random_tokens(4 * 12, c.vocab_size, 23);
    float first = 0, last = 0;
    for (int step = 0; step < 30; ++step) {
        model.zero_grad(run.ctx.device);
        last = model.forward(run.ctx, tokens.data(), targets.data(), 4, 12, 1.0f / 48);
        if (step == 0) first = last;
        model.backward(run.ctx, tokens.data());
        const float norm = grad_norm(run.ctx.device, model.gradients(), model.num_parameters());
        REQUIRE(std::isfinite(norm));
        opt.step(run.ctx.device, model.parameters(), model.gradients(), 3e-3f, snug::clip_factor(norm, 1.0f));
    }
    CHECK(opt.steps() == 30);
    CHECK(first == Approx(std::log(61.0)).epsilon(0.05));  // small init: near-uniform predictions
    CHECK(last < 0.5f * first);
    // Optimizer state is counted: two moments, no master copy for fp32.
    CHECK(run.tracker.current(MemoryCategory::optimizer_state) == 2 * 4 * static_cast<std::size_t>(c.num_parameters()));
    CHECK(run.tracker.current(MemoryCategory::master_weights) == 0);
}
