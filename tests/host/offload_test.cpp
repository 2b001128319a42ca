// Optimizer offload (optim/offload.hpp, optim/optimizer.hpp) on the host, and
// the piecewise update it rests on (AdamW::begin_update / update_range /
// chunks): pieces in any order give step()'s bits for every storage; a piece
// that cuts an 8-bit block is refused; an offloaded TrainStep gives the
// device optimizer's bits, holds no optimizer state or master weights in the
// device's ledger and exactly that state in the host's. (The CUDA link —
// staging, slots, a second stream — is tested emulated in
// tests/cuda/train_step_test.cu, and end to end by tests/examples/offload.sh.)
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "snug/core/half.hpp"
#include "snug/nn/gpt.hpp"
#include "snug/optim/adamw.hpp"
#include "snug/optim/optimizer.hpp"
#include "snug/train/train_step.hpp"
#include "support/host_run.hpp"
#include "support/awkward_groups.hpp"
#include "support/host_support.hpp"
#include "support/offloaded_shards.hpp"
using snug::Host;
using snug::MasterStorage;
using snug::MemoryCategory;
using snug::MomentStorage;

namespace {

const auto& groups = snug::test::awkward_groups;
constexpr std::int64_t n = snug::test::awkward_parameters;
using snug::test::bytes_of;

template <class Act>
std::vector<std::vector<unsigned char>> state_bytes(snug::AdamW<Act, Host>& opt) {
    std::vector<std::vector<unsigned char>> out;
    for (const snug::StateBuffer& b : opt.state_buffers())
        out.push_back(bytes_of(b.data, static_cast<std::size_t>(b.count) * snug::dtype_size(b.dtype)));
    return out;
}

// Two updates with step(), and with update_range over chunks(piece) in a
// shuffled order: the same weights and state, bit for bit.
template <class Act>
void pieces_match_step(MomentStorage moments, MasterStorage master, std::int64_t piece) {
    INFO("moments " << snug::moment_storage_name(moments) << ", master " << snug::master_storage_name(master)
                    << ", pieces of " << piece);
    snug::AdamWConfig cfg;
    cfg.moments = moments;
    cfg.master = master;
    const std::vector<float> w0 = snug::test::random_grad(static_cast<std::size_t>(n), 3);
    snug::MemoryTracker t1, t2;
    snug::AdamW<Act, Host> whole(Host{}, t1, n, groups, cfg, w0), pieces(Host{}, t2, n, groups, cfg, w0);
    std::vector<Act> p1(static_cast<std::size_t>(n)), p2(p1.size());
    for (std::size_t i = 0; i < p1.size(); ++i) p1[i] = p2[i] = Act(w0[i]);
    auto chunks = pieces.chunks(piece);
    // The pieces tile [0, n) in order, none longer than asked (whole blocks of 256).
    std::int64_t at = 0;
    for (const auto& [a, b] : chunks) {
        CHECK(a == at);
        CHECK(b - a <= std::max<std::int64_t>(256, piece / 256 * 256));
        at = b;
    }
    CHECK(at == n);
    std::mt19937 gen(7);
    for (int s = 0; s < 2; ++s) {
        const std::vector<float> g = snug::test::random_grad(static_cast<std::size_t>(n), 10 + static_cast<std::uint32_t>(s));
        whole.step(Host{}, p1.data(), g.data(), 1e-2f, 0.5f);
        std::shuffle(chunks.begin(), chunks.end(), gen);
        pieces.begin_update();
        for (const auto& [a, b] : chunks) pieces.update_range(Host{}, p2.data() + a, g.data() + a, 1e-2f, 0.5f, a, b);
    }
    CHECK(bytes_of(p1.data(), p1.size() * sizeof(Act)) == bytes_of(p2.data(), p2.size() * sizeof(Act)));
    CHECK(state_bytes(whole) == state_bytes(pieces));
    CHECK(whole.steps() == pieces.steps());
}

}  // namespace

TEST_CASE("AdamW's update in pieces, in any order, gives step()'s bits for every storage") {
    for (const std::int64_t piece : {std::int64_t{1}, std::int64_t{700}, std::int64_t{1} << 22}) {
        pieces_match_step<float>(MomentStorage::fp32, MasterStorage::fp32, piece);
        pieces_match_step<float>(MomentStorage::int8, MasterStorage::fp32, piece);
        pieces_match_step<snug::bfloat16>(MomentStorage::bf16, MasterStorage::none, piece);
        pieces_match_step<snug::bfloat16>(MomentStorage::int8, MasterStorage::none, piece);
        pieces_match_step<snug::half>(MomentStorage::bf16, MasterStorage::fp32, piece);
    }
}

TEST_CASE("AdamW::update_range refuses a piece outside the parameters or inside an 8-bit block") {
    using Catch::Matchers::Contains;
    snug::AdamWConfig cfg;
    cfg.moments = MomentStorage::int8;
    snug::MemoryTracker tracker;
    const std::vector<float> w(static_cast<std::size_t>(n), 0.25f);
    snug::AdamW<float, Host> opt(Host{}, tracker, n, groups, cfg, w);
    std::vector<float> p(w), g(static_cast<std::size_t>(n), 0.5f);
    const std::vector<float> before = p;
    opt.begin_update();
    // 1037 + 100 is inside the third group's first block (it starts at 1037).
    CHECK_THROWS_WITH(opt.update_range(Host{}, p.data() + 1037, g.data() + 1037, 1e-3f, 1.0f, 1037, 1137),
                      Contains("[1037, 1137)") && Contains("inside a block of 256"));
    CHECK_THROWS_WITH(opt.update_range(Host{}, p.data(), g.data(), 1e-3f, 1.0f, 0, n + 1),
                      Contains("is not within [0, 3347)"));
    CHECK(p == before);  // refused before anything was written
    // The unquantised groups may be cut anywhere; a quantised one at its end.
    opt.update_range(Host{}, p.data() + 1000, g.data() + 1000, 1e-3f, 1.0f, 1000, 1037 + 512);
    CHECK(p[1000] != before[1000]);
}

namespace {

// Three updates of a d2-shaped GPT with accumulation 2, the optimizer on the
// device or offloaded: final weights, losses, the state's bytes, and what
// each ledger holds.
struct Outcome {
    std::vector<unsigned char> weights;
    std::vector<float> losses;
    std::vector<std::vector<unsigned char>> state;
    std::size_t device_state = 0, host_state = 0, host_total_now = 0;
};

template <class Precision>
Outcome train(snug::TrainConfig tc) {
    using Act = typename Precision::compute_type;
    using Model = snug::GPT<Act, Host>;
    const snug::GPTConfig c = snug::GPTConfig::preset("d2").with_vocab(64).with_context(16);
    snug::test::HostRun run;
    Model model(c, run.tracker);
    const auto w0 = snug::gpt_initial_weights(c, 21);
    model.load_weights(run.ctx.device, w0);
    snug::TrainStep<Model, Precision, snug::accumulate::Steps, snug::checkpoint::Selective> step(
        model, run.tracker, run.ctx.device, w0, tc, Precision{}, snug::accumulate::Steps(2));
    std::vector<std::int32_t> tokens(2 * 4 * 16), targets(tokens.size());
    for (std::size_t i = 0; i < tokens.size(); ++i) {
        tokens[i] = static_cast<std::int32_t>((i * 37 + 11) % 64);
        targets[i] = (tokens[i] * 5 + 1) % 64;
    }
    const snug::MicroBatch mbs[] = {{tokens.data(), targets.data()}, {tokens.data() + 64, targets.data() + 64}};
    Outcome o;
    for (int s = 0; s < 3; ++s) o.losses.push_back(step.step(run.ctx, mbs, 4, 16, 3e-3f).loss);
    o.weights = bytes_of(model.parameters(), static_cast<std::size_t>(model.num_parameters()) * sizeof(Act));
    for (const snug::StateBuffer& b : step.optimizer().state_buffers())
        o.state.push_back(bytes_of(b.data, static_cast<std::size_t>(b.count) * snug::dtype_size(b.dtype)));
    o.device_state = run.tracker.peak(MemoryCategory::master_weights) + run.tracker.peak(MemoryCategory::optimizer_state);
    o.host_state = step.optimizer().host_memory().peak_total();
    o.host_total_now = step.optimizer().host_memory().current_total();
    return o;
}

template <class Precision>
void offload_matches(MomentStorage moments, MasterStorage master) {
    INFO(Precision::name << ", moments " << snug::moment_storage_name(moments) << ", master "
                         << snug::master_storage_name(master));
    snug::TrainConfig tc;
    tc.adamw.moments = moments;
    tc.adamw.master = master;
    const Outcome on_device = train<Precision>(tc);
    tc.adamw.offload = true;
    const Outcome offloaded = train<Precision>(tc);
    CHECK(offloaded.weights == on_device.weights);
    CHECK(offloaded.losses == on_device.losses);
    CHECK(offloaded.state == on_device.state);
    // The state moved from the device's ledger to the host's, byte for byte
    // (on the host backend there is no staging: the update runs in place).
    CHECK(on_device.device_state > 0);
    CHECK(offloaded.device_state == 0);
    CHECK(offloaded.host_state == on_device.device_state);
    CHECK(offloaded.host_total_now == on_device.device_state);
    CHECK(on_device.host_state == 0);
}

}  // namespace

TEST_CASE("an offloaded TrainStep on the host: the device's bits, its state in the host's ledger") {
    offload_matches<snug::precision::Fp32>(MomentStorage::fp32, MasterStorage::fp32);
    offload_matches<snug::precision::Bf16>(MomentStorage::int8, MasterStorage::none);
    offload_matches<snug::precision::Bf16>(MomentStorage::fp32, MasterStorage::fp32);
    offload_matches<snug::precision::Fp16<snug::DynamicLossScaler>>(MomentStorage::bf16, MasterStorage::fp32);
}

TEST_CASE("Optimizer reports where its state lives") {
    snug::MemoryTracker device;
    snug::AdamWConfig cfg;
    const std::vector<float> w(static_cast<std::size_t>(n), 1.0f);
    std::vector<snug::bfloat16> params(w.size(), snug::bfloat16(1.0f));
    snug::Optimizer<snug::bfloat16, Host> on_device(Host{}, device, n, groups, cfg, params.data(), &w);
    CHECK_FALSE(on_device.offloaded());
    for (const snug::StateBuffer& b : on_device.state_buffers()) CHECK_FALSE(b.on_host);
    cfg.offload = true;
    snug::MemoryTracker device2;
    snug::Optimizer<snug::bfloat16, Host> offloaded(Host{}, device2, n, groups, cfg, params.data(), &w);
    CHECK(offloaded.offloaded());
    CHECK(device2.current_total() == 0);
    // fp32 master (4 bytes) and two fp32 moments (8) a parameter, on the host.
    CHECK(offloaded.host_memory().current(MemoryCategory::master_weights) == 4 * std::size_t{n});
    CHECK(offloaded.host_memory().current(MemoryCategory::optimizer_state) == 8 * std::size_t{n});
    for (const snug::StateBuffer& b : offloaded.state_buffers()) CHECK(b.on_host);
    cfg.offload_chunk = 0;
    snug::MemoryTracker device3;
    CHECK_THROWS_WITH((snug::Optimizer<snug::bfloat16, Host>(Host{}, device3, n, groups, cfg, params.data(), &w)),
                      Catch::Matchers::Contains("offload_chunk = 0"));
}

TEST_CASE("ZeRO-1 offloaded: each shard's host update gives the device shard's bits, its state in the host ledger") {
    using snug::bfloat16;
    snug::test::offloaded_shards_match<float, Host>(Host{}, MomentStorage::fp32, MasterStorage::fp32, 2, 512);
    snug::test::offloaded_shards_match<bfloat16, Host>(Host{}, MomentStorage::int8, MasterStorage::none, 3, 512);
    snug::test::offloaded_shards_match<bfloat16, Host>(Host{}, MomentStorage::bf16, MasterStorage::fp32, 2, 300);
    snug::test::offloaded_shards_match<snug::half, Host>(Host{}, MomentStorage::fp32, MasterStorage::fp32, 3, 1 << 22);
}
