// The GPT model on CUDA against the same model on the host: one training pass
// (loss and every parameter gradient) for fp32 and bfloat16, from the same
// weights and tokens. Runs only where a GPU exists.
//
// Tolerances: support/model_pass.hpp's (fp32 gradients within 1e-4 of each
// tensor's largest; bf16 by cosine similarity).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "snug/cuda/blas.hpp"
#include "snug/nn/gpt.hpp"
#include "snug/snug.hpp"
#include "support/model_pass.hpp"

using snug::Cuda;
using snug::GPTConfig;
using snug::MemoryCategory;
using namespace snug::test;

namespace {

GPTConfig small_config() {
    GPTConfig c;
    c.vocab_size = 61;  // not a multiple of 8, padded
    c.padded_vocab_size = 64;
    c.max_seq_len = 40;
    c.n_layer = 2;
    c.n_head = 3;
    c.channels = 48;  // head size 16; not a multiple of 32
    return c;
}

}  // namespace

TEMPLATE_TEST_CASE("GPT on CUDA matches GPT on the host", "", float, snug::bfloat16) {
    std::random_device device;
    const std::uint64_t seed = device();
    INFO("seed " << seed);
    const GPTConfig c = small_config();
    const auto w = snug::gpt_initial_weights(c, seed);
    snug::Generator g(seed + 1);
    const int B = 3, T = 33;
    std::vector<std::int32_t> tokens(B * T), targets(B * T);
    for (auto& t : tokens) t = static_cast<std::int32_t>(g.below(61));
    for (auto& t : targets) t = static_cast<std::int32_t>(g.below(61));

    const auto host = training_pass<snug::GPT<TestType, snug::Host>>(c, w, tokens, targets, B, T);
    const auto cuda = training_pass<snug::GPT<TestType, Cuda>>(c, w, tokens, targets, B, T);
    check_pass_close<TestType>(cuda, host, snug::gpt_named_tensors(c));
}

TEST_CASE("GPT on CUDA needs channels that keep tensors 16-byte aligned") {
    GPTConfig c = small_config();
    c.channels = 36;
    c.n_head = 3;
    snug::MemoryTracker tracker;
    CHECK_THROWS_WITH((snug::GPT<float, Cuda>(c, tracker)), Catch::Contains("multiple of 8"));
}
