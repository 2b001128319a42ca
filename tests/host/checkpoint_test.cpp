// Activation checkpointing on the host: every policy gives the same fp32
// gradients as the plain run, to the bit; the tracker's activation peak is
// what the prediction says, to the byte, and the drop from None to Full
// matches a formula derived by hand; recomputation replays dropout; the
// budget policy picks the cheapest plan that fits.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "snug/checkpoint/policies.hpp"
#include "snug/core/rng.hpp"
#include "snug/nn/checkpointed.hpp"
#include "snug/nn/activation_peak.hpp"
#include "snug/nn/gpt.hpp"
#include "snug/nn/layer_stack.hpp"
#include "support/host_run.hpp"

using snug::GPTConfig;
using snug::MemoryCategory;
using snug::Recompute;

namespace {

GPTConfig config(snug::AttentionKind attention = snug::AttentionKind::flash) {
    GPTConfig c;
    c.attention = attention;
    c.vocab_size = 50;
    c.padded_vocab_size = 56;
    c.max_seq_len = 16;
    c.n_layer = 4;
    c.n_head = 2;
    c.channels = 16;
    return c;
}

struct Pass {
    std::vector<float> grads;
    std::size_t activation_peak;
};

Pass run_pass(const std::vector<Recompute>& modes, int B, int T,
              snug::AttentionKind attention = snug::AttentionKind::flash) {
    const GPTConfig c = config(attention);
    snug::test::HostRun run;
    snug::GPT<float, snug::Host> model(c, run.tracker);
    model.load_weights(run.ctx.device, snug::gpt_initial_weights(c, 5));
    model.set_recompute(modes);
    model.zero_grad(run.ctx.device);
    snug::Generator g(6);
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(B * T)), targets(tokens.size());
    for (auto& t : tokens) t = static_cast<std::int32_t>(g.below(50));
    for (auto& t : targets) t = static_cast<std::int32_t>(g.below(50));
    model.forward(run.ctx, tokens.data(), targets.data(), B, T, 1.0f / float(B * T));
    model.backward(run.ctx, tokens.data());
    CHECK(run.tracker.current(MemoryCategory::activations) == 0);
    CHECK(snug::predict_activation_peak(model, B, T, modes) == run.tracker.peak(MemoryCategory::activations));
    return {std::vector<float>(model.gradients(), model.gradients() + model.num_parameters()),
            run.tracker.peak(MemoryCategory::activations)};
}

std::vector<Recompute> plan_of(const auto& policy) {
    return policy.plan(snug::CheckpointQuery{4, [](std::span<const Recompute>) { return std::size_t{0}; }});
}

}  // namespace

TEST_CASE("every checkpoint policy gives the plain run's gradients, bit for bit") {
    const int B = 3, T = 13;
    const auto attention = GENERATE(snug::AttentionKind::flash, snug::AttentionKind::materialized);
    INFO(snug::attention_kind_name(attention) << " attention");
    const Pass plain = run_pass(plan_of(snug::checkpoint::None{}), B, T, attention);
    const std::vector<std::vector<Recompute>> plans = {
        plan_of(snug::checkpoint::Full{}),
        plan_of(snug::checkpoint::EveryNth<2>{}),
        plan_of(snug::checkpoint::EveryNth<3>{}),
        plan_of(snug::checkpoint::Selective{}),
        {Recompute::full, Recompute::selective, Recompute::none, Recompute::selective},
    };
    for (const auto& plan : plans) {
        const Pass p = run_pass(plan, B, T, attention);
        CHECK(p.grads == plain.grads);
        CHECK(p.activation_peak < plain.activation_peak);
    }
}

TEST_CASE("policies plan the documented modes") {
    using R = Recompute;
    CHECK(plan_of(snug::checkpoint::EveryNth<2>{}) == std::vector<R>{R::full, R::none, R::full, R::none});
    CHECK(plan_of(snug::checkpoint::EveryNth<3>{}) == std::vector<R>{R::full, R::none, R::none, R::full});
    CHECK(plan_of(snug::checkpoint::EveryNth<1>{}) == plan_of(snug::checkpoint::Full{}));
    CHECK(plan_of(snug::checkpoint::Selective{}) == std::vector<R>(4, R::selective));
}

TEST_CASE("full checkpointing saves what a hand count says, to the byte") {
    const int B = 2, T = 11;
    const GPTConfig c = config();
    const std::size_t A = 4, N = B * T, x = A * N * 16, L = 4;
    // One block keeps 15 (N, C) tensors, one fp32 log-sum-exp per row and head
    // (flash attention) and 4 N-float statistics.
    const std::size_t keep = A * 15 * N * 16 + 4 * std::size_t{B} * 2 * T + 16 * N;
    // The head: ln_f's statistics (8 N bytes) and the gradient for ln_f that
    // the chunked classifier computed in forward (N C A); no logits.
    const std::size_t head = x + 8 * N;
    // None: peak at the end of forward: embedding, every block's output and all it keeps, the head.
    const std::size_t none = x + L * (x + keep) + head;
    // Full: either the end of forward (only outputs kept) or the last block's
    // backward (its input and output, one recomputed output, one block's worth).
    const std::size_t full = std::max(x + L * x + head, x + L * x + x + keep);
    CHECK(run_pass(plan_of(snug::checkpoint::None{}), B, T).activation_peak == none);
    CHECK(run_pass(plan_of(snug::checkpoint::Full{}), B, T).activation_peak == full);
    (void)c;
}

TEST_CASE("the budget policy picks the cheapest plan that fits, or says none does") {
    const GPTConfig c = config();
    snug::test::HostRun run;
    snug::GPT<float, snug::Host> model(c, run.tracker);
    const int B = 2, T = 16;
    auto peak = [&](std::span<const Recompute> m) { return snug::predict_activation_peak(model, B, T, m); };
    const snug::CheckpointQuery q{4, peak};
    const std::size_t none = peak(std::vector<Recompute>(4, Recompute::none));
    const std::size_t selective = peak(std::vector<Recompute>(4, Recompute::selective));
    const std::size_t full = peak(std::vector<Recompute>(4, Recompute::full));
    REQUIRE(full < selective);
    REQUIRE(selective < none);
    CHECK(snug::checkpoint::Budget(none).plan(q) == std::vector<Recompute>(4, Recompute::none));
    // Just under the plain peak: the first block goes selective.
    const auto one = snug::checkpoint::Budget(none - 1).plan(q);
    CHECK(one[0] == Recompute::selective);
    CHECK(std::count(one.begin(), one.end(), Recompute::none) == 3);
    // Under the all-selective peak: full checkpointing enters, from the first block.
    const auto deep = snug::checkpoint::Budget(selective - 1).plan(q);
    CHECK(deep[0] == Recompute::full);
    CHECK(peak(deep) <= selective - 1);
    // Whatever it picks fits; a budget below every plan's peak is refused.
    const auto tight = snug::checkpoint::Budget(full - 1).plan(q);
    CHECK(peak(tight) <= full - 1);
    CHECK_THROWS_AS(snug::checkpoint::Budget(1000).plan(q), snug::OutOfMemory);
    CHECK_THROWS_WITH(snug::checkpoint::Budget(1000).plan(q), Catch::Contains("smallest predicted peak"));
    // Blocks that cannot recompute selectively get full checkpointing instead.
    snug::CheckpointQuery no_selective = q;
    no_selective.selective_available = false;
    const auto plain_only = snug::checkpoint::Budget(none - 1).plan(no_selective);
    CHECK(plain_only[0] == Recompute::full);
    CHECK(std::count(plain_only.begin(), plain_only.end(), Recompute::selective) == 0);
}

namespace {

// A user's layer with dropout: y = dropout_p(x) * w (one weight per channel).
// It draws its mask from the context's random stream, as a layer must for
// checkpointing to replay it.
class DropScale {
public:
    using value_type = float;
    using device_type = snug::Host;
    DropScale(const float* w, float* dw, int C, float p) : w_(w), dw_(dw), C_(C), p_(p) {}
    snug::Shape output_shape(const snug::Shape& in) const { return in; }
    void forward(snug::Context<snug::Host>& ctx, snug::TensorView<const float> x, snug::TensorView<float> y) {
        const std::int64_t n = x.numel();
        mask_ = ctx.activations.push<float>(static_cast<std::size_t>(n), "dropout mask");
        for (std::int64_t i = 0; i < n; ++i) {
            const bool keep = snug::random_uniform(ctx.seed, ctx.rng_offset, static_cast<std::uint64_t>(i)) >= p_;
            mask_[i] = keep ? 1.0f / (1.0f - p_) : 0.0f;
            y.data()[i] = x.data()[i] * mask_[i] * w_[i % C_];
        }
        ctx.rng_offset += static_cast<std::uint64_t>(n);
    }
    void backward(snug::Context<snug::Host>& ctx, snug::TensorView<const float> x, snug::TensorView<const float> dy,
                  snug::TensorView<float> dx) {
        for (std::int64_t i = 0; i < x.numel(); ++i) {
            dx.data()[i] = dy.data()[i] * mask_[i] * w_[i % C_];
            dw_[i % C_] += dy.data()[i] * mask_[i] * x.data()[i];
        }
        if (!forget_pop_) ctx.activations.pop(mask_);
    }
    // A broken backward, for the test of what the stack says about it.
    void forget_pop() { forget_pop_ = true; }

private:
    const float* w_;
    float* dw_;
    int C_;
    float p_;
    float* mask_ = nullptr;
    bool forget_pop_ = false;
};
static_assert(snug::Layer<DropScale>);

}  // namespace

TEST_CASE("Checkpointed<L> replays a user layer's dropout: same gradients") {
    const int C = 8;
    std::vector<float> w(C), x(5 * C), dy(5 * C);
    snug::Generator g(3);
    for (auto& v : w) v = g.uniform() + 0.5f;
    for (auto& v : x) v = g.uniform() - 0.5f;
    for (auto& v : dy) v = g.uniform() - 0.5f;
    auto run = [&](bool checkpointed, std::vector<float>& dw, std::vector<float>& dx, std::vector<float>& y) {
        snug::test::HostRun r;
        r.ctx.seed = 99;
        r.ctx.rng_offset = 1000;
        DropScale layer(w.data(), dw.data(), C, 0.3f);
        snug::Checkpointed<DropScale> wrapped(layer);
        const snug::TensorView<const float> in(x.data(), {5, C});
        const snug::TensorView<float> out(y.data(), {5, C});
        if (checkpointed) wrapped.forward(r.ctx, in, out); else layer.forward(r.ctx, in, out);
        if (checkpointed) CHECK(r.tracker.current(MemoryCategory::activations) == 0);  // the mask is gone
        // Another layer draws numbers in between: the replay must not see them.
        r.ctx.rng_offset += 12345;
        const snug::TensorView<const float> gout(dy.data(), {5, C});
        const snug::TensorView<float> gin(dx.data(), {5, C});
        if (checkpointed) wrapped.backward(r.ctx, in, gout, gin); else layer.backward(r.ctx, in, gout, gin);
        CHECK(r.ctx.rng_offset == 1000 + 5 * C + 12345);  // the stream continues where it was
        CHECK(r.tracker.current(MemoryCategory::activations) == 0);
    };
    std::vector<float> dw1(C, 0.0f), dx1(5 * C), y1(5 * C), dw2(C, 0.0f), dx2(5 * C), y2(5 * C);
    run(false, dw1, dx1, y1);
    run(true, dw2, dx2, y2);
    CHECK(y1 == y2);
    CHECK(dx1 == dx2);
    CHECK(dw1 == dw2);
    CHECK(std::count(y1.begin(), y1.end(), 0.0f) > 0);  // the mask really dropped something
}

TEST_CASE("a layer whose backward leaves its activations live is named, in every recompute mode") {
    const int C = 8, N = 3;
    std::vector<float> w(C, 1.5f), dw(C, 0.0f), x(N * C), dy(N * C), a(N * C), b(N * C);
    snug::Generator g(5);
    for (auto& v : x) v = g.uniform() - 0.5f;
    for (auto& v : dy) v = g.uniform() - 0.5f;
    for (Recompute mode : {Recompute::none, Recompute::full}) {
        CAPTURE(static_cast<int>(mode));
        snug::test::HostRun r;
        std::vector<DropScale> layers(3, DropScale(w.data(), dw.data(), C, 0.25f));
        layers[1].forget_pop();
        snug::LayerStack<DropScale> stack(std::move(layers), "layers.");
        const std::vector<Recompute> modes(3, mode);
        stack.set_modes(modes);
        std::copy(dy.begin(), dy.end(), a.begin());
        stack.forward(r.ctx, snug::TensorView<const float>(x.data(), {N, C}));
        // Layer 2 is fine; layer 1's backward keeps its mask: the stack names
        // layer 1 and what it left, not the push that happens to be popped next.
        CHECK_THROWS_WITH(stack.backward(r.ctx, a.data(), b.data()),
                          Catch::Equals("layers.1: its backward left 1 activation of its forward live: \"dropout "
                                        "mask\" (96 B); a layer's backward must pop everything its forward pushed, "
                                        "in reverse order"));
    }
}
