// The AdamW optimizer class and gradient clipping: parameter groups, decay
// only where it belongs, fp32 master weights for 16-bit working copies, and
// PyTorch's clipping rule.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "snug/core/half.hpp"
#include "snug/nn/gpt_parameters.hpp"
#include "snug/optim/adamw.hpp"
#include "snug/optim/grad_norm.hpp"

using snug::MemoryCategory;

TEST_CASE("GPT parameter groups tile the buffer and decay only 2-D weights") {
    snug::GPTConfig c;
    c.vocab_size = 50;
    c.padded_vocab_size = 56;
    c.max_seq_len = 8;
    c.n_layer = 2;
    c.n_head = 2;
    c.channels = 8;
    const auto groups = snug::gpt_parameter_groups(c);
    std::int64_t next = 0, decayed = 0;
    for (const auto& g : groups) {
        CHECK(g.offset == next);
        next += g.count;
        if (g.decay) decayed += g.count;
    }
    CHECK(next == c.num_parameters());
    // Decayed: wte, wpe and the four matmul weights of each block.
    const std::int64_t C = 8, L = 2;
    CHECK(decayed == 56 * C + 8 * C + L * (3 * C * C + C * C + 4 * C * C + 4 * C * C));
}

TEST_CASE("with zero gradients AdamW only decays, and only the decayed groups") {
    const std::int64_t n = 10;
    std::vector<float> w(n);
    for (std::int64_t i = 0; i < n; ++i) w[static_cast<std::size_t>(i)] = 1.0f + 0.1f * static_cast<float>(i);
    snug::MemoryTracker tracker;
    snug::AdamWConfig cfg;
    cfg.weight_decay = 0.5f;
    snug::AdamW<float, snug::Host> opt(snug::Host{}, tracker, n, {{0, 4, true}, {4, 6, false}}, cfg, w);
    std::vector<float> params = w, grads(n, 0.0f);
    opt.step(snug::Host{}, params.data(), grads.data(), 0.1f);
    for (std::int64_t i = 0; i < n; ++i) {
        const float want = i < 4 ? w[static_cast<std::size_t>(i)] * (1.0f - 0.1f * 0.5f) : w[static_cast<std::size_t>(i)];
        CHECK(params[static_cast<std::size_t>(i)] == Approx(want).epsilon(1e-6));
    }
    CHECK_THROWS_AS((snug::AdamW<float, snug::Host>(snug::Host{}, tracker, n, {{0, 4, true}}, cfg, w)),
                    snug::ShapeError);
}

TEST_CASE("16-bit working weights: the fp32 master keeps what rounding would lose") {
    const std::int64_t n = 3;
    const std::vector<float> w{1.0f, -2.0f, 0.5f};
    snug::MemoryTracker tracker;
    snug::AdamWConfig cfg;
    cfg.weight_decay = 0.0f;
    snug::AdamW<snug::bfloat16, snug::Host> opt(snug::Host{}, tracker, n, {{0, n, false}}, cfg, w);
    CHECK(tracker.current(MemoryCategory::master_weights) == 3 * sizeof(float));
    std::vector<snug::bfloat16> params{snug::bfloat16(1.0f), snug::bfloat16(-2.0f), snug::bfloat16(0.5f)};
    const std::vector<float> grads{1.0f, -1.0f, 1.0f};
    // lr 1e-4 moves each weight by about 1e-4 per step, far below bf16's spacing
    // near 1 (2^-7): the working copy cannot move, the master must.
    for (int s = 0; s < 3; ++s) opt.step(snug::Host{}, params.data(), grads.data(), 1e-4f);
    CHECK(opt.master()[0] == Approx(1.0f - 3e-4f).epsilon(1e-5));
    CHECK(opt.master()[1] == Approx(-2.0f + 3e-4f).epsilon(1e-5));
    for (std::int64_t i = 0; i < n; ++i)
        CHECK(params[static_cast<std::size_t>(i)].bits == snug::bfloat16(opt.master()[i]).bits);
}

TEST_CASE("clip_factor follows torch.nn.utils.clip_grad_norm_") {
    CHECK(snug::clip_factor(0.5f, 1.0f) == 1.0f);
    CHECK(snug::clip_factor(4.0f, 1.0f) == Approx(1.0 / (4.0 + 1e-6)));
    CHECK(snug::clip_factor(4.0f, 0.0f) == 1.0f);  // disabled
    CHECK(snug::clip_factor(INFINITY, 1.0f) == 1.0f);
    snug::MemoryTracker tracker;
    snug::GradNorm<snug::Host> norm(tracker);
    const std::vector<float> g{3.0f, 4.0f};
    CHECK(norm(snug::Host{}, g.data(), 2) == 5.0f);
    CHECK(norm(snug::Host{}, g.data(), 2, 0.5f) == 2.5f);
}
