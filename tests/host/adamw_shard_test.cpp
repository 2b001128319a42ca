// AdamW over a shard of the parameters (ZeRO-1, optim/adamw.hpp): shards cut
// by AdamW::shard_cuts, each updated by its own AdamW, give the whole
// optimizer's weights and state bit for bit, for every storage; each shard's
// state buffers are the slices of the whole's that StateBuffer::offset says.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

#include "snug/core/half.hpp"
#include "snug/optim/adamw.hpp"
#include "support/awkward_groups.hpp"
#include "support/host_support.hpp"
using snug::Host;
using snug::MasterStorage;
using snug::MomentStorage;

namespace {

const auto& groups = snug::test::awkward_groups;
constexpr std::int64_t n = snug::test::awkward_parameters;
using snug::test::bytes_of;

template <class Act>
void shards_match_whole(MomentStorage moments, MasterStorage master, int count) {
    INFO("moments " << snug::moment_storage_name(moments) << ", master " << snug::master_storage_name(master)
                    << ", " << count << " shards");
    snug::AdamWConfig cfg;
    cfg.moments = moments;
    cfg.master = master;
    const std::vector<float> w0 = snug::test::random_grad(static_cast<std::size_t>(n), 3);
    snug::MemoryTracker whole_tracker;
    snug::AdamW<Act, Host> whole(Host{}, whole_tracker, n, groups, cfg, w0);
    const std::vector<std::int64_t> cuts = snug::AdamW<Act, Host>::shard_cuts(n, groups, count);
    REQUIRE(cuts.size() == static_cast<std::size_t>(count) + 1);
    std::vector<snug::MemoryTracker> trackers(static_cast<std::size_t>(count));
    std::vector<snug::AdamW<Act, Host>> shards;
    shards.reserve(trackers.size());
    for (int r = 0; r < count; ++r)
        shards.emplace_back(Host{}, trackers[r], n, groups, cfg, w0, snug::ParameterShard{cuts[r], cuts[r + 1]});
    std::vector<Act> p1(static_cast<std::size_t>(n)), p2(p1.size());
    for (std::size_t i = 0; i < p1.size(); ++i) p1[i] = p2[i] = Act(w0[i]);
    for (int s = 0; s < 3; ++s) {
        const std::vector<float> g = snug::test::random_grad(static_cast<std::size_t>(n), 10 + static_cast<std::uint32_t>(s));
        whole.step(Host{}, p1.data(), g.data(), 1e-2f, 0.5f);
        for (int r = 0; r < count; ++r) shards[r].step(Host{}, p2.data() + cuts[r], g.data() + cuts[r], 1e-2f, 0.5f);
    }
    CHECK(bytes_of(p1.data(), p1.size() * sizeof(Act)) == bytes_of(p2.data(), p2.size() * sizeof(Act)));
    // Every shard buffer is its slice of the whole's, and the slices tile it.
    const std::vector<snug::StateBuffer> all = whole.state_buffers();
    for (std::size_t k = 0; k < all.size(); ++k) {
        INFO("buffer " << all[k].name);
        const std::size_t size = snug::dtype_size(all[k].dtype);
        std::int64_t covered = 0;
        std::size_t state_bytes = 0;
        for (int r = 0; r < count; ++r) {
            const snug::StateBuffer b = shards[r].state_buffers()[k];
            CHECK(b.name == all[k].name);
            CHECK(b.whole() == all[k].count);
            CHECK(b.offset == covered);
            covered += b.count;
            CHECK(bytes_of(b.data, static_cast<std::size_t>(b.count) * size) ==
                  bytes_of(static_cast<const unsigned char*>(all[k].data) + b.offset * size,
                           static_cast<std::size_t>(b.count) * size));
            state_bytes += static_cast<std::size_t>(b.count) * size;
        }
        CHECK(covered == all[k].count);
        CHECK(state_bytes == static_cast<std::size_t>(all[k].count) * size);
    }
    // Each shard's tracker holds what state_bytes predicts for it, and the
    // shards together what the whole holds (the blocks of a cut group: whole).
    std::size_t sum = 0;
    for (int r = 0; r < count; ++r) {
        const auto [moment_bytes, master_bytes] =
            snug::AdamW<Act, Host>::state_bytes(n, groups, cfg, snug::ParameterShard{cuts[r], cuts[r + 1]});
        CHECK(trackers[r].current_total() == moment_bytes + master_bytes);
        sum += trackers[r].current_total();
        CHECK(shards[r].first() == cuts[r]);
        CHECK(shards[r].size() == cuts[r + 1] - cuts[r]);
        CHECK(shards[r].sharded() == (count > 1));
    }
    CHECK(sum == whole_tracker.current_total());
}

}  // namespace

TEST_CASE("AdamW in shards gives the whole optimizer's bits for every storage") {
    for (const int count : {1, 2, 3, 7}) {
        shards_match_whole<float>(MomentStorage::fp32, MasterStorage::fp32, count);
        shards_match_whole<float>(MomentStorage::int8, MasterStorage::fp32, count);
        shards_match_whole<snug::bfloat16>(MomentStorage::fp32, MasterStorage::fp32, count);
        shards_match_whole<snug::bfloat16>(MomentStorage::bf16, MasterStorage::none, count);
        shards_match_whole<snug::bfloat16>(MomentStorage::int8, MasterStorage::none, count);
        shards_match_whole<snug::half>(MomentStorage::bf16, MasterStorage::fp32, count);
    }
}

TEST_CASE("AdamW::shard_cuts: balanced, monotone, at whole quantisation blocks") {
    const std::vector<std::int64_t> cuts = snug::AdamW<float, Host>::shard_cuts(n, groups, 4);
    REQUIRE(cuts.size() == 5);
    CHECK(cuts.front() == 0);
    CHECK(cuts.back() == n);
    for (std::size_t r = 1; r < cuts.size(); ++r) {
        CHECK(cuts[r] >= cuts[r - 1]);
        // n / 4 = 836.75 each, give or take less than one block of 256.
        CHECK(std::abs(static_cast<double>(cuts[r] - cuts[r - 1]) - 836.75) < 2 * 256);
        // Each cut lies a whole number of blocks into its group.
        for (const snug::ParameterGroup& g : groups)
            if (cuts[r] > g.offset && cuts[r] < g.offset + g.count) CHECK((cuts[r] - g.offset) % 256 == 0);
    }
    // More shards than blocks: some shards are empty, the cuts still tile.
    const std::vector<std::int64_t> many = snug::AdamW<float, Host>::shard_cuts(n, groups, 64);
    CHECK(many.back() == n);
    for (std::size_t r = 1; r < many.size(); ++r) CHECK(many[r] >= many[r - 1]);
    using Cuts = snug::AdamW<float, Host>;
    CHECK_THROWS_AS(Cuts::shard_cuts(n, groups, 0), snug::ConfigError);
}

TEST_CASE("AdamW refuses a shard outside the parameters or inside an 8-bit block") {
    using Catch::Matchers::Contains;
    snug::AdamWConfig cfg;
    cfg.moments = MomentStorage::int8;
    snug::MemoryTracker tracker;
    const std::vector<float> w(static_cast<std::size_t>(n), 0.25f);
    using Opt = snug::AdamW<float, Host>;
    CHECK_THROWS_WITH(Opt(Host{}, tracker, n, groups, cfg, w, snug::ParameterShard{1037 + 100, n}),
                      Contains("cuts an 8-bit group (from 1037) inside a block of 256"));
    CHECK_THROWS_WITH(Opt(Host{}, tracker, n, groups, cfg, w, snug::ParameterShard{0, n + 1}),
                      Contains("is not within the 3347 parameters"));
    CHECK(tracker.current_total() == 0);  // refused before anything was allocated
    // fp32 moments may be cut anywhere.
    cfg.moments = MomentStorage::fp32;
    Opt anywhere(Host{}, tracker, n, groups, cfg, w, snug::ParameterShard{1037 + 100, 2000});
    CHECK(anywhere.size() == 2000 - 1137);
}
