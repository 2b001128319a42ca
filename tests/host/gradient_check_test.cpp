// check_gradients (nn/gradient_check.hpp), the public finite-difference check
// of a family's block: it passes LlamaBlock, whose backward tests/host's
// llama_block_test holds to its own central differences, and it catches each
// kind of broken backward — a wrong input gradient, a wrong parameter
// gradient (named by its tensor), activations left on the arena.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>

#include "snug/nn/gradient_check.hpp"
#include "snug/nn/llama.hpp"

namespace {

constexpr snug::LlamaBlockShape small{.channels = 8, .heads = 2, .hidden = 12, .layers = 2};

enum class Fault { input_gradient, first_weight_gradient, leaves_activations };

// LlamaBlock with one fault put into its backward.
template <Fault F>
struct Broken {
    template <class Act, snug::DeviceTag D>
    struct Block : snug::LlamaBlock<Act, D> {
        using snug::LlamaBlock<Act, D>::LlamaBlock;
        void bind(snug::ParameterBinding<Act> b) {
            snug::LlamaBlock<Act, D>::bind(b);
            grads = b.grads;
        }
        void backward(snug::Context<D>& ctx, snug::TensorView<const Act, D> in, snug::TensorView<const Act, D> dout,
                      snug::TensorView<Act, D> din) {
            snug::LlamaBlock<Act, D>::backward(ctx, in, dout, din);
            if constexpr (F == Fault::input_gradient) din.data()[3] *= 1.01;
            if constexpr (F == Fault::first_weight_gradient) grads[1] *= 1.01f;
            if constexpr (F == Fault::leaves_activations) ctx.activations.template push<float>(4, "forgotten");
        }
        float* grads = nullptr;
    };
};

template <Fault F>
struct BrokenFamily : snug::LlamaFamily {
    template <class Act, snug::DeviceTag D>
    using Block = typename Broken<F>::template Block<Act, D>;
};

}  // namespace

TEST_CASE("check_gradients passes LlamaBlock: every tensor compared, within 1e-4", "[gradient_check]") {
    const snug::GradientCheck g = snug::check_gradients<snug::LlamaFamily>(small);
    INFO(g.summary());
    CHECK(g.released);
    // Its six tensors, named as the registry names them.
    REQUIRE(g.tensors.size() == 6);
    CHECK(g.tensors[0].name == "layers.0.input_layernorm.weight");
    CHECK(g.tensors[5].name == "layers.0.mlp.down_proj.weight");
    // rstd is fp32 on every backend and the parameter gradients are fp32
    // buffers: about 1e-7 relative.
    CHECK(g.input.error < 1e-6);
    CHECK(g.worst().error < 1e-6);
    CHECK(g.passes(1e-4));
}

TEST_CASE("check_gradients passes a grouped-query LlamaBlock (4 heads, 2 key/value heads)", "[gradient_check]") {
    const snug::LlamaBlockShape grouped{.channels = 16, .heads = 4, .kv_heads = 2, .hidden = 12, .layers = 2};
    const snug::GradientCheck g = snug::check_gradients<snug::LlamaFamily>(grouped);
    INFO(g.summary());
    CHECK(g.released);
    REQUIRE(g.tensors.size() == 6);
    CHECK(g.input.error < 1e-6);
    CHECK(g.worst().error < 1e-6);
}

TEST_CASE("check_gradients catches a wrong input gradient", "[gradient_check]") {
    const snug::GradientCheck g = snug::check_gradients<BrokenFamily<Fault::input_gradient>>(small);
    INFO(g.summary());
    CHECK(g.input.at == 3);
    CHECK(g.input.error > 5e-3);
    CHECK(g.worst().name == "input");
    CHECK_FALSE(g.passes(1e-4));
}

TEST_CASE("check_gradients names the tensor whose gradient is wrong", "[gradient_check]") {
    const snug::GradientCheck g = snug::check_gradients<BrokenFamily<Fault::first_weight_gradient>>(small);
    INFO(g.summary());
    CHECK(g.input.error < 1e-5);
    CHECK(g.worst().name == "layers.0.input_layernorm.weight");
    CHECK(g.worst().at == 1);
    CHECK(g.worst().error > 1e-3);  // 1% of an element a fifth of its tensor's largest
    CHECK_FALSE(g.passes(1e-4));
    CHECK(g.summary().find("layers.0.input_layernorm.weight") != std::string::npos);
}

TEST_CASE("check_gradients fails a backward that leaves activations on the arena", "[gradient_check]") {
    const snug::GradientCheck g = snug::check_gradients<BrokenFamily<Fault::leaves_activations>>(small);
    CHECK_FALSE(g.released);
    CHECK(g.worst().error < 1e-4);  // the numbers are right; the contract is not
    CHECK_FALSE(g.passes(1e-4));
    CHECK(g.summary().find("must pop") != std::string::npos);
}

TEST_CASE("check_gradients refuses a shape it cannot run, naming it", "[gradient_check]") {
    snug::GradientCheckOptions o;
    o.seq = 0;
    CHECK_THROWS_WITH(snug::check_gradients<snug::LlamaFamily>(small, o),
                      Catch::Contains("T 0") && Catch::Contains("must be positive"));
}
