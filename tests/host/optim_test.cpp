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

TEST_CASE("lean optimizer state holds the bytes it says, per category, to the byte") {
    const std::int64_t n = 1000;
    const std::vector<float> w(static_cast<std::size_t>(n), 0.25f);
    auto bytes = [&]<class Act>(Act, snug::MomentStorage moments, snug::MasterStorage master) {
        snug::MemoryTracker tracker;
        snug::AdamWConfig cfg;
        cfg.moments = moments;
        cfg.master = master;
        snug::AdamW<Act, snug::Host> opt(snug::Host{}, tracker, n, {{0, n, true}}, cfg, w);
        return std::pair{tracker.current(MemoryCategory::optimizer_state), tracker.current(MemoryCategory::master_weights)};
    };
    using snug::MasterStorage;
    using snug::MomentStorage;
    const auto N = static_cast<std::size_t>(n);
    // PyTorch's layout: two fp32 moments, an fp32 master for 16-bit weights.
    CHECK(bytes(snug::bfloat16{}, MomentStorage::fp32, MasterStorage::fp32) == std::pair{8 * N, 4 * N});
    CHECK(bytes(float{}, MomentStorage::fp32, MasterStorage::fp32) == std::pair{8 * N, std::size_t{0}});
    // bf16 moments halve the state; no master drops the copy.
    CHECK(bytes(snug::bfloat16{}, MomentStorage::bf16, MasterStorage::fp32) == std::pair{4 * N, 4 * N});
    CHECK(bytes(snug::half{}, MomentStorage::bf16, MasterStorage::fp32) == std::pair{4 * N, 4 * N});
    CHECK(bytes(float{}, MomentStorage::bf16, MasterStorage::fp32) == std::pair{4 * N, std::size_t{0}});
    CHECK(bytes(snug::bfloat16{}, MomentStorage::bf16, MasterStorage::none) == std::pair{4 * N, std::size_t{0}});
    CHECK(bytes(snug::bfloat16{}, MomentStorage::fp32, MasterStorage::none) == std::pair{8 * N, std::size_t{0}});
    // 8-bit moments: a byte each for m and v, and an fp32 absmax per 256
    // (1000 = 3 whole blocks and one of 232: 4 blocks).
    CHECK(bytes(snug::bfloat16{}, MomentStorage::int8, MasterStorage::none) == std::pair{2 * N + 2 * 4 * 4, std::size_t{0}});
    CHECK(bytes(snug::bfloat16{}, MomentStorage::int8, MasterStorage::fp32) == std::pair{2 * N + 2 * 4 * 4, 4 * N});
}

TEST_CASE("8-bit moments quantise the groups with decay and keep fp32 moments for the others") {
    // Groups of 300 (decay), 40 (none), 513 (decay), 7 (none): quantised 813
    // parameters in 2 + 3 blocks, fp32 47.
    const std::vector<snug::ParameterGroup> groups{{0, 300, true}, {300, 40, false}, {340, 513, true}, {853, 7, false}};
    const std::int64_t n = 860;
    snug::MemoryTracker tracker;
    snug::AdamWConfig cfg;
    cfg.moments = snug::MomentStorage::int8;
    const std::vector<float> w(static_cast<std::size_t>(n), 0.5f);
    snug::AdamW<float, snug::Host> opt(snug::Host{}, tracker, n, groups, cfg, w);
    const std::size_t want = 2 * 813 + 2 * 5 * sizeof(float) + 2 * 47 * sizeof(float);
    CHECK(tracker.current(MemoryCategory::optimizer_state) == want);
    CHECK((snug::AdamW<float, snug::Host>::state_bytes(n, groups, cfg)) == std::pair{want, std::size_t{0}});
    const std::vector<snug::StateBuffer> b = opt.state_buffers();
    REQUIRE(b.size() == 6);
    CHECK(b[0].name == "first_moment_codes");
    CHECK(b[0].count == 813);
    CHECK(b[1].name == "first_moment_absmax");
    CHECK(b[1].count == 5);
    CHECK(b[4].name == "first_moment");
    CHECK(b[4].count == 47);
    // One update: the fp32 groups follow fp32 AdamW exactly (the same kernel
    // as an all-fp32 optimizer), the quantised ones move every weight too.
    snug::MemoryTracker t2;
    snug::AdamWConfig plain;
    snug::AdamW<float, snug::Host> ref(snug::Host{}, t2, n, groups, plain, w);
    std::vector<float> p(w), q(w), grads(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < grads.size(); ++i) grads[i] = std::sin(0.37f * static_cast<float>(i)) + 0.01f;
    opt.step(snug::Host{}, p.data(), grads.data(), 1e-2f);
    ref.step(snug::Host{}, q.data(), grads.data(), 1e-2f);
    for (std::size_t i = 300; i < 340; ++i) CHECK(p[i] == q[i]);
    for (std::size_t i = 853; i < 860; ++i) CHECK(p[i] == q[i]);
    // Step 1 from zero moments: the quantised m and v are only stored, the
    // update uses the fp32 values, so the weights equal fp32 AdamW's.
    for (std::size_t i = 0; i < 300; ++i) CHECK(p[i] == q[i]);
    // Step 2 reads the quantised moments back: close to fp32's, not equal.
    opt.step(snug::Host{}, p.data(), grads.data(), 1e-2f);
    ref.step(snug::Host{}, q.data(), grads.data(), 1e-2f);
    double worst = 0.0;
    std::size_t differ = 0;
    for (std::size_t i = 0; i < 300; ++i) {
        worst = std::max(worst, std::abs(double(p[i]) - double(q[i])));
        differ += p[i] != q[i];
    }
    CHECK(differ > 0);
    CHECK(worst < 2e-3);  // 2 steps of lr 1e-2: the update's size, quantised moments off by a few percent
    for (std::size_t i = 853; i < 860; ++i) CHECK(p[i] == q[i]);
}

TEST_CASE("master none is refused where there is no master to drop or no rounding for it") {
    snug::MemoryTracker tracker;
    snug::AdamWConfig cfg;
    cfg.master = snug::MasterStorage::none;
    const std::vector<float> w(4, 1.0f);
    using Catch::Matchers::Contains;
    CHECK_THROWS_WITH((snug::AdamW<float, snug::Host>(snug::Host{}, tracker, 4, {{0, 4, true}}, cfg, w)),
                      Contains("master none") && Contains("fp32 weights are their own master"));
    CHECK_THROWS_WITH((snug::AdamW<snug::half, snug::Host>(snug::Host{}, tracker, 4, {{0, 4, true}}, cfg, w)),
                      Contains("master none needs bf16 weights"));
    CHECK(tracker.current_total() == 0);  // nothing left allocated
    CHECK_THROWS_WITH(snug::parse_moment_storage("int4"), Contains("'int4'") && Contains("fp32, bf16 or int8"));
    CHECK_THROWS_WITH(snug::parse_master_storage("fp16"), Contains("'fp16'") && Contains("fp32 or none"));
}

TEST_CASE("bf16 weights without a master move by updates that round-to-nearest would lose") {
    // The fp32-master test above, without the master: lr 1e-4 per step is far
    // below bf16's spacing near 1 (2^-8 below, 2^-7 above), so round-to-nearest
    // would never move a weight; stochastic rounding moves about 1e-4 / 2^-8
    // of them per step, and the weights' mean follows the updates.
    const std::int64_t n = 20000;
    const std::vector<float> w(static_cast<std::size_t>(n), 1.0f);
    snug::MemoryTracker tracker;
    snug::AdamWConfig cfg;
    cfg.weight_decay = 0.0f;
    cfg.moments = snug::MomentStorage::bf16;
    cfg.master = snug::MasterStorage::none;
    snug::AdamW<snug::bfloat16, snug::Host> opt(snug::Host{}, tracker, n, {{0, n, false}}, cfg, w);
    CHECK(opt.master() == nullptr);
    CHECK(opt.first_moment() == nullptr);  // kept in bf16: state_buffers
    std::vector<snug::bfloat16> params(static_cast<std::size_t>(n), snug::bfloat16(1.0f));
    const std::vector<float> grads(static_cast<std::size_t>(n), 1.0f);
    for (int s = 0; s < 10; ++s) opt.step(snug::Host{}, params.data(), grads.data(), 1e-4f);
    double mean = 0.0;
    for (const auto p : params) mean += static_cast<float>(p);
    mean /= double(n);
    // 10 updates of about 1e-4 each; the mean's noise is about 2^-8 sqrt(0.0256 10 / n) = 1.4e-5.
    CHECK(mean == Approx(1.0 - 1e-3).margin(1e-4));
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
