// RunSpec: names parse to the policies they say, unknown names are refused
// naming the value (no silent default), and visit() hands over the static
// policy types TrainStep is built from.
#include <catch2/catch.hpp>

#include <string>
#include <type_traits>
#include <vector>

#include "snug/train/run_spec.hpp"

namespace {

// What visit() handed over, as names the test can compare.
struct Seen {
    std::string precision, checkpoint;
    bool budget = false;
    int every = 0;
};

template <class C>
constexpr int every_k() {
    if constexpr (requires { C::k; })
        return C::k;
    else
        return 0;
}

Seen seen(const snug::RunSpec& spec) {
    return spec.visit([]<class Precision, class Checkpoint>() {
        return Seen{Precision::name, Checkpoint::name, std::is_same_v<Checkpoint, snug::checkpoint::Budget>,
                    every_k<Checkpoint>()};
    });
}

}  // namespace

TEST_CASE("run spec: every name parses back to itself and visits its policy types") {
    for (snug::CheckpointKind k : snug::all_checkpoint_kinds) {
        CHECK(snug::parse_checkpoint_kind(snug::checkpoint_kind_name(k)) == k);
        for (const char* p : {"fp32", "bf16", "fp16"}) {
            const snug::RunSpec spec{snug::parse_precision_kind(p), k, 2, 8, 1};
            const Seen s = seen(spec);
            CHECK(s.precision == p);
            CHECK(s.budget == (k == snug::CheckpointKind::automatic));
        }
    }
    const snug::RunSpec every3{snug::PrecisionKind::bf16, snug::parse_checkpoint_kind("every:3"), 4, 16, 2};
    CHECK(seen(every3).every == 3);
    CHECK(std::string(every3.checkpoint_name()) == "every:3");
    CHECK(std::string(every3.precision_name()) == "bf16");
    CHECK(every3.tokens_per_update() == 2 * 4 * 16);
    // fp16 is the dynamic loss scaler's policy, reached only by its own name.
    const bool fp16_scaled = snug::visit_precision(snug::PrecisionKind::fp16, []<class P>() {
        return std::is_same_v<P, snug::precision::Fp16<snug::DynamicLossScaler>>;
    });
    CHECK(fp16_scaled);
}

TEST_CASE("precision kinds: the lists a command line offers are the kinds, in order, each its policy's name") {
    CHECK(snug::precision_names() == std::vector<std::string>{"fp32", "bf16", "fp16"});
    CHECK(snug::checkpoint_names() ==
          std::vector<std::string>{"none", "full", "every:2", "every:3", "every:4", "selective", "auto"});
    for (snug::PrecisionKind p : snug::all_precision_kinds) {
        const std::string policy_name = snug::visit_precision(p, []<class P>() { return std::string(P::name); });
        CHECK(std::string(snug::precision_name(p)) == policy_name);
    }
    // Any loss scaler's fp16 is the fp16 kind (the planner's question).
    STATIC_REQUIRE(snug::precision_kind<snug::precision::Fp16<snug::StaticLossScaler>>() == snug::PrecisionKind::fp16);
    STATIC_REQUIRE(snug::precision_kind<snug::precision::Bf16>() == snug::PrecisionKind::bf16);
    STATIC_REQUIRE(snug::precision_name(snug::PrecisionKind::fp32) == "fp32");
}

TEST_CASE("run spec: an unknown precision or checkpoint name is refused, naming it") {
    // Before, any precision that was not fp32 or bf16 silently trained in fp16.
    CHECK_THROWS_WITH(snug::parse_precision_kind("fp8"), Catch::Contains("'fp8'") && Catch::Contains("fp32, bf16 or fp16"));
    CHECK_THROWS_AS(snug::parse_precision_kind("FP16"), snug::ConfigError);
    CHECK_THROWS_AS(snug::parse_precision_kind(""), snug::ConfigError);
    CHECK_THROWS_WITH(snug::parse_checkpoint_kind("every:5", "--checkpoint"),
                      Catch::StartsWith("--checkpoint every:5: every:K is compiled for K = 2, 3, 4 only"));
    CHECK_THROWS_WITH(snug::parse_checkpoint_kind("sometimes"),
                      Catch::StartsWith("checkpoint sometimes: expected none, full, every:K"));
    CHECK_THROWS_AS(snug::parse_checkpoint_kind("every:"), snug::ConfigError);
}

TEST_CASE("attention kinds: every name parses back, anything else is refused naming them all") {
    for (snug::AttentionKind k : {snug::AttentionKind::automatic, snug::AttentionKind::cudnn,
                                  snug::AttentionKind::flash, snug::AttentionKind::materialized})
        CHECK(snug::parse_attention_kind(snug::attention_kind_name(k)) == k);
    CHECK(std::string(snug::attention_kind_name(snug::AttentionKind::flash)) == "flash");
    CHECK(std::string(snug::attention_kind_name(snug::AttentionKind::automatic)) == "auto");
    CHECK(std::string(snug::attention_kind_name(snug::AttentionKind::cudnn)) == "cudnn");
    CHECK_THROWS_WITH(snug::parse_attention_kind("sparse", "--attention"),
                      Catch::Equals("--attention sparse: expected auto, cudnn, flash or materialized"));
    CHECK_THROWS_AS(snug::parse_attention_kind("Flash"), snug::ConfigError);
    // Flash attention is what a model gets unless it asks otherwise.
    CHECK(snug::GPTConfig{}.attention == snug::AttentionKind::flash);
}

TEST_CASE("run spec: the planner's input carries the spec") {
    const snug::GPTConfig c = snug::GPTConfig{}.with_vocab(64).with_context(16);
    snug::GPTConfig small = c;
    small.n_layer = 2;
    small.n_head = 2;
    small.channels = 16;
    const snug::RunSpec spec{snug::PrecisionKind::fp16, snug::CheckpointKind::selective, 3, 8, 5};
    const snug::MemoryPlanInput in = snug::plan_input_for(spec, small, {1234, snug::cuda_reservation}, 16);
    CHECK(in.precision == snug::PrecisionKind::fp16);
    CHECK(in.micro_batch == 3);
    CHECK(in.seq == 8);
    CHECK(in.accumulation == 5);
    CHECK(in.backend_workspace == 1234);
    REQUIRE(in.device.has_value());
    CHECK(in.device->context == snug::cuda_reservation.context);
    CHECK(in.sampling_window == 16);
    CHECK(in.model.n_layer == 2);
}
