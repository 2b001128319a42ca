// ParameterRegistry: tensors laid out in declaration order, names unique and
// found, AdamW groups merged by decay, initial values drawn tensor by tensor;
// GPT's registry against an independent count of llm.c's layout and against
// GPT-2's initialisation written out by hand here.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "snug/core/rng.hpp"
#include "snug/nn/gpt.hpp"
#include "snug/nn/gpt_parameters.hpp"
#include "snug/nn/parameters.hpp"

using snug::Decay;
using snug::Init;
using snug::ParameterRegistry;

TEST_CASE("parameters: tensors are laid out in declaration order and found by name") {
    ParameterRegistry r;
    CHECK(r.add("embed.weight", {10, 4}, Init::normal(0.5f), Decay::yes) == 0);
    CHECK(r.add("norm.weight", {4}, Init::ones(), Decay::no) == 40);
    CHECK(r.add("norm.bias", {4}, Init::zeros(), Decay::no) == 44);
    CHECK(r.add("proj.weight", {3, 4}, Init::normal(0.1f, 6), Decay::yes) == 48);
    CHECK(r.total() == 60);
    REQUIRE(r.tensors().size() == 4);
    CHECK(r.find("norm.bias").offset == 44);
    CHECK(r.find("proj.weight").shape == snug::Shape{3, 4});
    CHECK_THROWS_WITH(r.find("nope"), Catch::Contains("no parameter named 'nope'"));

    // Groups: the two norm tensors merge; the decaying ones around them do not.
    const auto g = r.groups();
    REQUIRE(g.size() == 3);
    CHECK((g[0].offset == 0 && g[0].count == 40 && g[0].decay));
    CHECK((g[1].offset == 40 && g[1].count == 8 && !g[1].decay));
    CHECK((g[2].offset == 48 && g[2].count == 12 && g[2].decay));

    // Initial values: one stream, tensor by tensor; only the first 6 of
    // proj.weight drawn.
    const std::vector<float> w = r.initial_values(7);
    snug::Generator rng(7);
    for (int i = 0; i < 40; ++i) CHECK(w[static_cast<std::size_t>(i)] == 0.5f * rng.normal());
    for (int i = 40; i < 44; ++i) CHECK(w[static_cast<std::size_t>(i)] == 1.0f);
    for (int i = 44; i < 48; ++i) CHECK(w[static_cast<std::size_t>(i)] == 0.0f);
    for (int i = 48; i < 54; ++i) CHECK(w[static_cast<std::size_t>(i)] == 0.1f * rng.normal());
    for (int i = 54; i < 60; ++i) CHECK(w[static_cast<std::size_t>(i)] == 0.0f);
    CHECK(r.initial_values(7) == w);
    CHECK(r.initial_values(8) != w);
}

TEST_CASE("parameters: the ranges of the tensors under a name prefix, adjacent ones merged") {
    using R = snug::ParameterRange;
    ParameterRegistry r;
    r.add("a.0.x", {3}, Init::zeros(), Decay::no);      // [0, 3)
    r.add("a.0.y", {2}, Init::zeros(), Decay::no);      // [3, 5)
    r.add("b", {4}, Init::zeros(), Decay::no);          // [5, 9)
    r.add("a.0.z", {1}, Init::zeros(), Decay::no);      // [9, 10)
    r.add("a.1.x", {5}, Init::zeros(), Decay::no);      // [10, 15)
    r.add("a.10.x", {2}, Init::zeros(), Decay::no);     // [15, 17)
    CHECK(r.ranges("a.0.") == std::vector<R>{{0, 5}, {9, 1}});
    CHECK(r.ranges("a.1.") == std::vector<R>{{10, 5}});  // not a.10.x
    CHECK(r.ranges("a.") == std::vector<R>{{0, 5}, {9, 8}});
    CHECK(r.ranges("c.").empty());
}

TEST_CASE("parameters: bad declarations are refused, naming the tensor") {
    ParameterRegistry r;
    r.add("a", {2, 2}, Init::zeros(), Decay::no);
    CHECK_THROWS_WITH(r.add("a", {3}, Init::zeros(), Decay::no), Catch::Contains("'a' is declared twice"));
    CHECK_THROWS_WITH(r.add("empty", {0, 4}, Init::zeros(), Decay::no),
                      Catch::Contains("'empty'") && Catch::Contains("no elements"));
    CHECK_THROWS_WITH(r.add("", {1}, Init::zeros(), Decay::no), Catch::Contains("needs a name"));
    CHECK_THROWS_WITH(r.add("b", {2}, Init::normal(1.0f, 3), Decay::no), Catch::Contains("'b' draws 3"));
    CHECK(r.total() == 4);  // nothing refused was laid out
}

TEST_CASE("parameters: GPT's registry is llm.c's layout with GPT-2's names, groups and initialisation") {
    snug::GPTConfig c;
    c.n_layer = 3;
    c.n_head = 2;
    c.channels = 8;
    c = c.with_vocab(13).with_context(5);  // padded vocabulary 128 (a multiple of 128)
    const std::int64_t L = 3, C = 8, V = 13, Vp = c.padded_vocab_size, T = 5;
    const ParameterRegistry r = snug::gpt_parameter_registry(c);
    CHECK(r.total() == c.num_parameters());

    // llm.c's order counted by hand: wte, wpe, then each kind for all layers.
    const std::int64_t kinds[] = {C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C};
    const char* names[] = {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                           "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                           "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"};
    CHECK(r.find("wte.weight").offset == 0);
    CHECK(r.find("wpe.weight").offset == Vp * C);
    std::int64_t offset = Vp * C + T * C;
    for (int k = 0; k < 12; ++k) {
        for (int l = 0; l < L; ++l) {
            const auto& t = r.find("h." + std::to_string(l) + "." + names[k]);
            CHECK(t.offset == offset + l * kinds[k]);
            CHECK(t.count() == kinds[k]);
            CHECK((t.decay == Decay::yes) == (t.shape.rank() == 2));
        }
        offset += L * kinds[k];
    }
    CHECK(r.find("ln_f.weight").offset == offset);
    CHECK(r.find("ln_f.bias").offset == offset + C);
    CHECK(snug::GPTLayout(c).offset(snug::GPTTensor::fcw) == r.find("h.0.mlp.c_fc.weight").offset);

    // GPT-2's initialisation, written out here: N(0, 0.02) for wte's real
    // rows, wpe, c_attn and c_fc; N(0, 0.02 / sqrt(2 L)) for the projections;
    // LayerNorm weights 1; the rest 0; one stream in buffer order.
    const std::vector<float> w = snug::gpt_initial_weights(c, 42);
    std::vector<float> expected(static_cast<std::size_t>(r.total()), 0.0f);
    snug::Generator rng(42);
    const float residual = 0.02f / std::sqrt(2.0f * static_cast<float>(L));
    std::size_t at = 0;
    for (std::int64_t i = 0; i < Vp * C; ++i, ++at) expected[at] = i < V * C ? 0.02f * rng.normal() : 0.0f;
    for (std::int64_t i = 0; i < T * C; ++i, ++at) expected[at] = 0.02f * rng.normal();
    for (int k = 0; k < 12; ++k) {
        for (std::int64_t i = 0; i < L * kinds[k]; ++i, ++at) {
            if (k == 0 || k == 6) expected[at] = 1.0f;
            if (k == 2 || k == 8) expected[at] = 0.02f * rng.normal();
            if (k == 4 || k == 10) expected[at] = residual * rng.normal();
        }
    }
    for (std::int64_t i = 0; i < C; ++i, ++at) expected[at] = 1.0f;
    CHECK(at + static_cast<std::size_t>(C) == expected.size());
    CHECK(w == expected);
}
