// LlamaBlock on the host, composed of the nn/ modules (RMSNorm,
// CausalSelfAttention<RoPE>, SwiGLUMLP, Linear): its backward against central
// finite differences in double (input and parameter gradients), its tensors'
// names, shapes and groups as declared into the registry, and a LayerStack
// of them checkpointed (Recompute::full) giving the plain run's gradients to
// the bit while keeping fewer activation bytes.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "snug/core/buffer.hpp"
#include "snug/nn/layer_stack.hpp"
#include "snug/nn/llama_block.hpp"
#include "support/host_run.hpp"
#include "support/host_support.hpp"

using snug::Host;
using snug::LlamaBlock;
using snug::LlamaBlockShape;
using snug::ParameterRegistry;
using snug::Recompute;
using snug::Shape;
using snug::TensorView;

namespace {

constexpr LlamaBlockShape small{.channels = 8, .heads = 2, .hidden = 12, .layers = 2};
// Grouped-query attention: 4 query heads of 4 channels sharing 2 key/value heads.
constexpr LlamaBlockShape grouped{.channels = 16, .heads = 4, .kv_heads = 2, .hidden = 12, .layers = 2};

// One block in double with its weights drawn by the registry (plus noise on
// the norms, which start at one) and the loss sum(out * G).
struct DoubleBlock {
    LlamaBlockShape shape;
    ParameterRegistry registry;
    LlamaBlock<double, Host> block{registry, "layers.0.", shape};
    std::vector<double> params;
    std::vector<float> grads;

    explicit DoubleBlock(const LlamaBlockShape& s) : shape(s) {
        const std::vector<float> init = registry.initial_values(11);
        const auto noise = snug::test::random_values<double>(init.size(), 12, -0.2, 0.2);
        params.resize(init.size());
        for (std::size_t i = 0; i < init.size(); ++i) params[i] = init[i] + noise[i];
        grads.assign(init.size(), 0.0f);
        block.bind({params.data(), grads.data()});
    }

    double loss(const std::vector<double>& x, const std::vector<double>& G, int B, int T) {
        snug::test::HostRun run;
        std::vector<double> out(x.size());
        block.forward(run.ctx, TensorView<const double, Host>(x.data(), {B, T, shape.channels}),
                      TensorView<double, Host>(out.data(), {B, T, shape.channels}));
        run.activations.clear();
        double l = 0.0;
        for (std::size_t i = 0; i < out.size(); ++i) l += out[i] * G[i];
        return l;
    }
};

}  // namespace

TEST_CASE("LlamaBlock backward: central finite differences in double, input and parameters", "[llama]") {
    const LlamaBlockShape shape = GENERATE(small, grouped);
    INFO("heads " << shape.heads << ", key/value heads " << shape.key_value_heads());
    const int B = 2, T = 5, C = shape.channels;
    const std::size_t n = static_cast<std::size_t>(B) * T * C;
    DoubleBlock m(shape);
    auto x = snug::test::random_values<double>(n, 21, -1.5, 1.5);
    const auto G = snug::test::random_values<double>(n, 22, -1.0, 1.0);

    snug::test::HostRun run;
    std::vector<double> out(n), dx(n, 1e300);  // dx is overwritten
    const Shape s{B, T, C};
    m.block.forward(run.ctx, TensorView<const double, Host>(x.data(), s), TensorView<double, Host>(out.data(), s));
    m.block.backward(run.ctx, TensorView<const double, Host>(x.data(), s), TensorView<const double, Host>(G.data(), s),
                     TensorView<double, Host>(dx.data(), s));
    CHECK(run.activations.live_bytes() == 0);  // backward released what forward kept
    CHECK(run.scratch.live_bytes() == 0);

    const auto dx_fd = snug::test::central_differences(x, [&] { return m.loss(x, G, B, T); });
    // rstd is kept in fp32 (as on every backend): about 1e-7 relative.
    CHECK(snug::test::max_rel(dx, dx_fd, 1e-3) < 1e-5);

    // Every parameter tensor: its fp32 gradient against the differences.
    const std::vector<float> grads = m.grads;
    const auto dp_fd = snug::test::central_differences(m.params, [&] { return m.loss(x, G, B, T); });
    for (const snug::ParameterTensor& t : m.registry.tensors()) {
        INFO(t.name);
        const auto at = static_cast<std::size_t>(t.offset);
        const std::vector<float> got(grads.begin() + at, grads.begin() + at + t.count());
        const std::vector<double> want(dp_fd.begin() + at, dp_fd.begin() + at + t.count());
        CHECK(snug::test::max_rel(got, want, 1e-3) < 1e-4);
    }
}

TEST_CASE("LlamaBlock declares Hugging Face Llama's tensors, fused, decaying only the projections", "[llama]") {
    ParameterRegistry r;
    const LlamaBlock<float, Host> block(r, "layers.3.", small);
    const int C = small.channels, H = small.hidden;
    struct Want {
        const char* name;
        Shape shape;
        bool decay;
    };
    const Want want[] = {{"layers.3.input_layernorm.weight", {C}, false},
                         {"layers.3.self_attn.qkv_proj.weight", {3 * C, C}, true},
                         {"layers.3.self_attn.o_proj.weight", {C, C}, true},
                         {"layers.3.post_attention_layernorm.weight", {C}, false},
                         {"layers.3.mlp.gate_up_proj.weight", {2 * H, C}, true},
                         {"layers.3.mlp.down_proj.weight", {C, H}, true}};
    REQUIRE(r.tensors().size() == std::size(want));
    std::int64_t offset = 0;
    for (std::size_t i = 0; i < std::size(want); ++i) {
        const snug::ParameterTensor& t = r.tensors()[i];
        INFO(want[i].name);
        CHECK(t.name == want[i].name);
        CHECK(t.shape == want[i].shape);
        CHECK((t.decay == snug::Decay::yes) == want[i].decay);
        CHECK(t.offset == offset);
        offset += want[i].shape.numel();
    }
    CHECK(r.total() == 2 * C + 3 * C * C + C * C + 3 * H * C);
    // The residual projections start smaller: 0.02 / sqrt(2 L).
    CHECK(r.find("layers.3.self_attn.o_proj.weight").init.std == Approx(0.02 / std::sqrt(4.0)));
    CHECK(r.find("layers.3.self_attn.qkv_proj.weight").init.std == Approx(0.02));
    CHECK_THROWS_WITH((LlamaBlock<float, Host>(r, "x.", LlamaBlockShape{.channels = 12, .heads = 4, .hidden = 8})),
                      Catch::Contains("head size 3") && Catch::Contains("even"));
}

TEST_CASE("A grouped-query LlamaBlock's qkv holds the key/value heads once, and bad groupings are refused",
          "[llama]") {
    ParameterRegistry r;
    const LlamaBlock<float, Host> block(r, "layers.0.", grouped);
    const int C = grouped.channels, hs = C / grouped.heads, KV = grouped.kv_heads;
    CHECK(r.find("layers.0.self_attn.qkv_proj.weight").shape == Shape{C + 2 * KV * hs, C});
    CHECK(r.find("layers.0.self_attn.o_proj.weight").shape == Shape{C, C});
    CHECK(grouped.key_value_heads() == 2);
    CHECK(small.key_value_heads() == small.heads);  // 0: as many as heads
    LlamaBlockShape bad = grouped;
    bad.kv_heads = 3;
    CHECK_THROWS_WITH((LlamaBlock<float, Host>(r, "x.", bad)),
                      Catch::Contains("heads 4") && Catch::Contains("multiple of key/value heads 3"));
    bad.kv_heads = 2;
    bad.attention = snug::AttentionKind::materialized;
    CHECK_THROWS_WITH((LlamaBlock<float, Host>(r, "y.", bad)),
                      Catch::Contains("grouped-query attention") && Catch::Contains("materialized"));
}

TEST_CASE("A LayerStack of LlamaBlocks, fully checkpointed, gives the plain gradients to the bit", "[llama]") {
    const int B = 2, T = 7, C = 16, L = 3;
    const LlamaBlockShape shape{.channels = C, .heads = 4, .hidden = 24, .layers = L};
    ParameterRegistry r;
    std::vector<LlamaBlock<float, Host>> blocks;
    for (int l = 0; l < L; ++l) blocks.emplace_back(r, "layers." + std::to_string(l) + ".", shape);
    std::vector<float> params = r.initial_values(5);
    for (float& p : params) p += 0.05f;  // norms off one, nothing at zero
    const std::size_t n = static_cast<std::size_t>(B) * T * C;
    const auto x = snug::test::random_values<float>(n, 31, -1.0, 1.0);
    const auto G = snug::test::random_values<float>(n, 32, -1.0, 1.0);

    auto run_once = [&](Recompute mode, std::size_t& peak) {
        std::vector<float> grads(params.size(), 0.0f);
        for (auto& b : blocks) b.bind({params.data(), grads.data()});
        snug::LayerStack<LlamaBlock<float, Host>> stack(blocks);
        const std::vector<Recompute> modes(L, mode);
        stack.set_modes(modes);
        snug::test::HostRun run;
        stack.forward(run.ctx, TensorView<const float, Host>(x.data(), {B, T, C}));
        std::vector<float> g = G, other(n, 0.0f);
        const float* dx = stack.backward(run.ctx, g.data(), other.data());
        std::vector<float> out(dx, dx + n);
        out.insert(out.end(), grads.begin(), grads.end());
        peak = run.tracker.peak(snug::MemoryCategory::activations);
        return out;
    };
    std::size_t plain_peak = 0, full_peak = 0;
    const auto plain = run_once(Recompute::none, plain_peak);
    const auto full = run_once(Recompute::full, full_peak);
    CHECK(plain == full);
    CHECK(full_peak < plain_peak);
    bool any_nonzero = false;
    for (std::size_t i = n; i < plain.size(); ++i) any_nonzero = any_nonzero || plain[i] != 0.0f;
    CHECK(any_nonzero);
}
