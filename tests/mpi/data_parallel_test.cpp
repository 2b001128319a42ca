// Data parallel over MPI, run as 2 ranks (ctest: mpirun -np 2): the ranks'
// collectives (dist/mpi.hpp) and TrainStep over them (N ranks of micro-batch
// B against one process of micro-batch N·B, which every rank also runs).
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "mpi/ranks_fixture.hpp"
#include "snug/core/half.hpp"
#include "snug/dist/communicator.hpp"
#include "snug/nn/gpt.hpp"
#include "snug/train/planner.hpp"
#include "snug/train/train_step.hpp"
#include "support/host_run.hpp"

using snug::Host;
using snug::test::ranks;

namespace {

// Rank r's input: fresh random values in [-1, 1], never zero (seeded by r,
// so every rank can compute every other rank's input).
template <class T>
std::vector<T> input_of(int r, std::int64_t n) {
    std::mt19937 gen(1000 + static_cast<unsigned>(r));
    std::uniform_real_distribution<double> u(0.05, 1.0);
    std::vector<T> v(static_cast<std::size_t>(n));
    for (auto& x : v) x = static_cast<T>(u(gen) * ((gen() & 1) ? 1.0 : -1.0));
    return v;
}

template <class T>
void check_sum(std::int64_t n) {
    INFO("n = " << n << ", " << (sizeof(T) == 4 ? "float" : "double"));
    const int N = ranks().size();
    std::vector<T> data = input_of<T>(ranks().rank(), n);
    ranks().all_reduce_sum(data.data(), n, "test sum");
    std::int64_t wrong = 0;
    double worst = 0.0;
    std::vector<std::vector<T>> inputs;
    for (int r = 0; r < N; ++r) inputs.push_back(input_of<T>(r, n));
    for (std::int64_t i = 0; i < n; ++i) {
        double exact = 0.0;
        for (int r = 0; r < N; ++r) exact += static_cast<double>(inputs[r][i]);
        if (N == 2) {
            // Two addends: one rounding, whatever the order.
            if (data[i] != static_cast<T>(inputs[0][i] + inputs[1][i])) ++wrong;
        } else {
            worst = std::max(worst, std::fabs(static_cast<double>(data[i]) - exact));
        }
    }
    CHECK(wrong == 0);
    // N - 1 roundings of values below N in magnitude.
    CHECK(worst <= N * N * static_cast<double>(std::numeric_limits<T>::epsilon()));
    // Every rank holds the same bits.
    CHECK(ranks().all_equal(snug::dist::fingerprint(data.data(), data.size() * sizeof(T)), "test check"));
}

}  // namespace

TEST_CASE("MpiRanks: sums are exact for two ranks and the same bits on every rank") {
    REQUIRE(ranks().size() >= 2);
    // Fewer values than ranks, odd counts (uneven parts), and a vector of 4 MiB.
    for (std::int64_t n : {std::int64_t{1}, std::int64_t{3}, std::int64_t{1001}, (std::int64_t{1} << 20) + 7}) {
        check_sum<float>(n);
        check_sum<double>(n);
    }
    std::vector<float> none;
    ranks().all_reduce_sum(none.data(), 0, "empty sum");  // nothing to sum: returns
    CHECK(ranks().sum(0.5 + ranks().rank(), "scalar") == 0.5 * ranks().size() +
                                                            ranks().size() * (ranks().size() - 1) / 2.0);
}

TEST_CASE("MpiRanks: broadcast and local rank") {
    const int N = ranks().size();
    for (int root = 0; root < N; ++root) {
        std::vector<unsigned char> bytes(300, static_cast<unsigned char>(0xa5));  // poison
        if (ranks().rank() == root)
            for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 7 + root);
        ranks().broadcast(bytes.data(), bytes.size(), root, "test broadcast");
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < bytes.size(); ++i) wrong += bytes[i] != static_cast<unsigned char>(i * 7 + root);
        CHECK(wrong == 0);
    }
    // One machine here (ctest's mpirun): the local rank is the rank.
    CHECK(ranks().local_rank() == ranks().rank());
}

TEST_CASE("MpiRanks: all_equal and any") {
    CHECK(ranks().all_equal(42, "equal values"));
    CHECK_FALSE(ranks().all_equal(static_cast<std::uint64_t>(ranks().rank()), "different values"));
    // Only the top bit differs: min and max must both be compared.
    CHECK_FALSE(ranks().all_equal(ranks().rank() == 0 ? 0ULL : 1ULL << 63, "top bit"));
    CHECK(ranks().any(ranks().rank() == ranks().size() - 1, "one rank says yes"));
    CHECK_FALSE(ranks().any(false, "nobody says yes"));
}

TEST_CASE("MpiRanks::wait_until returns when its condition holds, answers the others, and times out naming its wait") {
    int calls = 0;
    ranks().wait_until([&] { return ++calls == 1000; }, "test wait");
    CHECK(calls == 1000);
    // Rank 0 waits 1 s for what never comes, times out and asks the others;
    // they, still waiting (for 2.5 s) in wait_until, answer it.
    const double timeout = ranks().timeout();
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    if (ranks().rank() == 0) {
        ranks().set_timeout(1.0);
        std::string message = "no timeout";
        try {
            ranks().wait_until([] { return false; }, "test wait that never ends");
        } catch (const snug::dist::RankTimeout& e) {
            message = e.what();
        }
        CHECK_THAT(message, Catch::Contains("rank 0 of " + std::to_string(ranks().size()) +
                                            " waited 1 s in the test wait that never ends (after collective ") &&
                                Catch::Contains("every rank answers"));
    } else {
        ranks().wait_until([&] { return clock::now() - start > std::chrono::milliseconds(2500); }, "test wait");
        CHECK(clock::now() - start > std::chrono::milliseconds(2500));
    }
    ranks().set_timeout(timeout);
    // And the ranks go on together afterwards.
    CHECK(ranks().all_equal(7, "collective after the timeout"));
}

namespace {

struct Trace {
    std::vector<float> losses, norms;
    std::vector<float> working;    // the working weights at the end, widened
    std::size_t state = 0;         // the tracker's optimizer state + master weights bytes
    std::vector<float> gradients;  // after the first update: the mean gradient (fp32; fp16: unscaled)
    std::vector<float> weights;    // fp32: the master copy (or the fp32 parameters)
    std::size_t peak = 0;        // the tracker's peak bytes
};

// Three updates (accumulation 2) of a d2-shaped GPT on micro-batches of B
// rows; with `comm`, each rank trains on its rows of the global batch of
// N·B (rows rank·B ...), as train/run.hpp slices it.
template <class Precision>
Trace train(int B, snug::dist::Communicator<Host>* comm, snug::TrainConfig tc = {}) {
    using Act = typename Precision::compute_type;
    using Model = snug::GPT<Act, Host>;
    constexpr int T = 16, accum = 2;
    const snug::GPTConfig c = snug::GPTConfig::preset("d2").with_vocab(64).with_context(T);
    snug::test::HostRun run;
    Model model(c, run.tracker);
    const auto w0 = snug::gpt_initial_weights(c, 21);
    model.load_weights(run.ctx.device, w0);
    snug::TrainStep<Model, Precision, snug::accumulate::Steps, snug::checkpoint::None> step(
        model, run.tracker, run.ctx.device, w0, tc, Precision{}, snug::accumulate::Steps(accum));
    if (comm) step.data_parallel(*comm);
    const int rank = comm ? comm->rank() : 0;
    const int global_rows = comm ? comm->size() * B : B;
    Trace t;
    std::mt19937 gen(7);
    for (int s = 0; s < 3; ++s) {
        // The global batch: every rank draws all of it, then keeps its rows.
        std::vector<std::int32_t> tokens, targets;
        for (int m = 0; m < accum; ++m) {
            std::vector<std::int32_t> all(static_cast<std::size_t>(global_rows) * T), next(all.size());
            for (std::size_t i = 0; i < all.size(); ++i) {
                all[i] = static_cast<std::int32_t>(gen() % 64);
                next[i] = static_cast<std::int32_t>(gen() % 64);
            }
            tokens.insert(tokens.end(), all.begin() + rank * B * T, all.begin() + (rank + 1) * B * T);
            targets.insert(targets.end(), next.begin() + rank * B * T, next.begin() + (rank + 1) * B * T);
        }
        const snug::MicroBatch mbs[] = {{tokens.data(), targets.data()},
                                        {tokens.data() + B * T, targets.data() + B * T}};
        const snug::StepResult r = step.step(run.ctx, mbs, B, T, 3e-3f);
        REQUIRE_FALSE(r.skipped);
        CHECK(r.tokens == std::int64_t{accum} * global_rows * T);
        t.losses.push_back(r.loss);
        if (s == 0) t.gradients.assign(model.gradients(), model.gradients() + model.num_parameters());
        t.norms.push_back(r.grad_norm);
    }
    const std::int64_t P = model.num_parameters();
    if (!step.sharded()) {
        t.weights.resize(static_cast<std::size_t>(P));
        if constexpr (std::is_same_v<Act, float>)
            std::copy_n(model.parameters(), P, t.weights.begin());
        else if (step.optimizer().master() != nullptr)
            std::copy_n(step.optimizer().master(), P, t.weights.begin());
    }
    for (std::int64_t i = 0; i < P; ++i) t.working.push_back(static_cast<float>(model.parameters()[i]));
    t.peak = run.tracker.peak_total();
    t.state = run.tracker.peak(snug::MemoryCategory::optimizer_state) +
              run.tracker.peak(snug::MemoryCategory::master_weights);
    return t;
}

// The first update's gradients, relative to their largest component (see
// the tolerances below the namespace).
template <class Act>
constexpr double gradient_tolerance() {
    if constexpr (std::is_same_v<Act, float>) return 2e-6;
    // Two ulps of the 16-bit type at the scale of the largest gradient.
    const int mantissa_bits = std::is_same_v<Act, snug::bfloat16> ? 7 : 10;
    return 2.0 / static_cast<double>(1 << mantissa_bits);
}

template <class Precision>
void matches_one_process(double loss_tolerance, double mean_weight_tolerance) {
    INFO(Precision::name);
    const int N = ranks().size(), B = 2;
    snug::dist::Communicator<Host> comm(ranks());
    const Trace parallel = train<Precision>(B, &comm);
    const Trace one = train<Precision>(N * B, nullptr);
    for (std::size_t s = 0; s < one.losses.size(); ++s) {
        INFO("update " << s + 1);
        CHECK(std::fabs(parallel.losses[s] - one.losses[s]) <= loss_tolerance * std::fabs(one.losses[s]));
        CHECK(std::fabs(parallel.norms[s] - one.norms[s]) <= loss_tolerance * std::fabs(one.norms[s]));
    }
    double g_max = 0.0, g_diff = 0.0;
    for (std::size_t i = 0; i < one.gradients.size(); ++i) {
        g_max = std::max(g_max, static_cast<double>(std::fabs(one.gradients[i])));
        g_diff = std::max(g_diff, static_cast<double>(std::fabs(parallel.gradients[i] - one.gradients[i])));
    }
    double worst = 0.0, mean = 0.0;
    for (std::size_t i = 0; i < one.weights.size(); ++i) {
        const double d = std::fabs(parallel.weights[i] - one.weights[i]);
        worst = std::max(worst, d);
        mean += d / static_cast<double>(one.weights.size());
    }
    CHECK(g_diff <= gradient_tolerance<typename Precision::compute_type>() * g_max);
    CHECK(mean <= mean_weight_tolerance);
    CHECK(worst <= 2 * 3e-3 * 3);
    // The ranks hold the same weights and saw the same (summed) losses, bit for bit.
    CHECK(ranks().all_equal(snug::dist::fingerprint(parallel.weights.data(), parallel.weights.size() * 4), "weights"));
    CHECK(ranks().all_equal(snug::dist::fingerprint(parallel.losses.data(), parallel.losses.size() * 4), "losses"));
    // Data parallel costs no device memory on the host backend: a rank holds
    // exactly what one process of micro-batch B holds.
    const Trace alone = train<Precision>(B, nullptr);
    CHECK(parallel.peak == alone.peak);
}

}  // namespace

// Tolerances. The ranks add the same per-sequence gradients in another order
// (each rank's B rows, then across ranks) than one process does, and the
// host GEMM computes each micro-batch's products with kernels chosen for its
// shape (B rows or N B) and for this CPU: fp32 results differ in their last
// bits (fp32: the mean gradient of the first update, measured at most 2.2e-7
// of the largest component; bound 2e-6). With 16-bit activations each such
// result is then rounded to 16 bits, and one that lies near a rounding
// boundary rounds to neighbouring 16-bit values in the two runs: that
// activation, and every gradient computed from it, moves by one ulp of the
// 16-bit type at its scale. Which activations flip depends on the CPU's GEMM
// kernels (OpenBLAS's Haswell kernels flip one in fp16 here, its Sandybridge
// and SkylakeX kernels none), so the bound is the rounding's, not a
// measurement: two 16-bit ulps of the largest component (fp16 2^-9, bf16
// 2^-6; measured fp16 3.6e-4 with Haswell kernels). AdamW's first updates
// move a weight by about lr · sign(g), so where a component is near zero that
// last bit may flip the sign: a few weights may differ by up to 2 lr per
// update (the bound 2 · 3e-3 · 3), the mean difference stays tiny (measured
// fp32 4.7e-9, bound 1e-7; bf16 6.1e-6 and fp16 1.8e-6, where a master's last
// bit can round a 16-bit working weight to its neighbour: bound 1e-4).
// Losses: fp32 within 1e-5 relative, 16-bit within 2e-3 (that rounding's).
TEST_CASE("TrainStep over N ranks of micro-batch B matches one process of micro-batch N B") {
    matches_one_process<snug::precision::Fp32>(1e-5, 1e-7);
    matches_one_process<snug::precision::Bf16>(2e-3, 1e-4);
    matches_one_process<snug::precision::Fp16<snug::DynamicLossScaler>>(2e-3, 1e-4);
}

namespace {

// ZeRO-1 against plain data parallel on the same ranks: the same updates
// but for the clipping factor, whose norm is summed in another order (each
// rank's shard, then across ranks: a last-bit difference, so the weights
// agree to 1e-6 on average and losses to 1e-5); each rank keeps exactly its
// shard's state.
template <class Precision>
void zero1_matches_data_parallel(snug::MomentStorage moments, snug::MasterStorage master,
                                 std::size_t bytes_per_parameter) {
    INFO(Precision::name << ", moments " << snug::moment_storage_name(moments) << ", master "
                         << snug::master_storage_name(master));
    const int N = ranks().size();
    snug::dist::Communicator<Host> comm(ranks());
    snug::TrainConfig tc;
    tc.adamw.moments = moments;
    tc.adamw.master = master;
    const Trace plain = train<Precision>(2, &comm, tc);
    tc.shards = N;
    tc.shard = ranks().rank();
    const Trace zero = train<Precision>(2, &comm, tc);
    for (std::size_t s = 0; s < plain.losses.size(); ++s) {
        INFO("update " << s + 1);
        CHECK(std::fabs(zero.losses[s] - plain.losses[s]) <= 1e-5 * std::fabs(plain.losses[s]));
        CHECK(std::fabs(zero.norms[s] - plain.norms[s]) <= 1e-5 * std::fabs(plain.norms[s]));
    }
    double mean = 0.0;
    for (std::size_t i = 0; i < plain.working.size(); ++i)
        mean += std::fabs(zero.working[i] - plain.working[i]) / static_cast<double>(plain.working.size());
    CHECK(mean <= 1e-6);
    // Every rank gathered the same weights.
    CHECK(ranks().all_equal(snug::dist::fingerprint(zero.working.data(), zero.working.size() * 4), "gathered"));
    // The state: this rank's shard only; the shards add up to the whole, and
    // the peak falls by exactly the state not kept. With fp32 moments (and
    // fp32 master for 16-bit weights) that is bytes_per_parameter for each
    // parameter of the shard: per rank (2 + 4) Ψ of weights and gradients
    // plus 12 Ψ / N of state for bf16, instead of 18 Ψ.
    CHECK(ranks().sum(static_cast<double>(zero.state), "state bytes") == static_cast<double>(plain.state));
    CHECK(plain.peak - zero.peak == plain.state - zero.state);
    if (bytes_per_parameter > 0) {
        using Act = typename Precision::compute_type;
        const snug::GPTConfig c = snug::GPTConfig::preset("d2").with_vocab(64).with_context(16);
        snug::MemoryTracker t;
        snug::GPT<Act, Host> model(c, t);
        const auto cuts =
            snug::AdamW<Act, Host>::shard_cuts(model.num_parameters(), model.parameter_groups(), N);
        const std::int64_t mine = cuts[ranks().rank() + 1] - cuts[ranks().rank()];
        CHECK(zero.state == bytes_per_parameter * static_cast<std::size_t>(mine));
        CHECK(plain.state == bytes_per_parameter * static_cast<std::size_t>(model.num_parameters()));
        // Balanced: no shard more than one 8-bit block (256) from P / N.
        CHECK(std::fabs(static_cast<double>(mine) - static_cast<double>(model.num_parameters()) / N) <= 256);
    }
    // The planner (one process, on snug::Meter) predicts the state of the
    // rank with the largest shard: the largest any rank's tracker counted.
    std::vector<std::int64_t> states(static_cast<std::size_t>(N)), cuts(states.size() + 1);
    states[ranks().rank()] = static_cast<std::int64_t>(zero.state);
    for (int r = 0; r <= N; ++r) cuts[r] = 8 * r;
    ranks().all_gather(states.data(), cuts, "state bytes of every rank");
    snug::MemoryPlanInput in;
    in.model = snug::GPTConfig::preset("d2").with_vocab(64).with_context(16);
    in.precision = snug::parse_precision_kind(Precision::name);
    in.micro_batch = 2;
    in.seq = 16;
    in.accumulation = 2;
    in.moments = moments;
    in.master = master;
    in.zero_ranks = N;
    const snug::MemoryPlan plan = snug::predict_memory(in);
    CHECK(plan.peak[static_cast<std::size_t>(snug::MemoryCategory::optimizer_state)] +
              plan.peak[static_cast<std::size_t>(snug::MemoryCategory::master_weights)] ==
          static_cast<std::size_t>(*std::max_element(states.begin(), states.end())));
}

}  // namespace

TEST_CASE("ZeRO-1: each rank keeps its shard of the optimizer state and trains as plain data parallel") {
    using snug::MasterStorage;
    using snug::MomentStorage;
    zero1_matches_data_parallel<snug::precision::Fp32>(MomentStorage::fp32, MasterStorage::fp32, 8);
    zero1_matches_data_parallel<snug::precision::Bf16>(MomentStorage::fp32, MasterStorage::fp32, 12);
    zero1_matches_data_parallel<snug::precision::Fp16<snug::DynamicLossScaler>>(MomentStorage::fp32,
                                                                               MasterStorage::fp32, 12);
    zero1_matches_data_parallel<snug::precision::Bf16>(MomentStorage::bf16, MasterStorage::none, 4);
    zero1_matches_data_parallel<snug::precision::Bf16>(MomentStorage::int8, MasterStorage::none, 0);
}

namespace {

// A Communicator that says it overlaps the backward, as NCCL's does; its
// sums are the blocking ones, so the results must be bit for bit those of
// summing after the backward. It logs every start_sums call's ranges and
// every finish_sums.
struct LoggingCommunicator : snug::dist::Communicator<Host> {
    using Communicator::Communicator;
    bool overlaps_backward() const override { return true; }
    void start_sums(const Host& dev, float* data, std::span<const snug::ParameterRange> ranges,
                    std::span<const std::int64_t> cuts, const char* what) override {
        calls.emplace_back(ranges.begin(), ranges.end());
        Communicator::start_sums(dev, data, ranges, cuts, what);
    }
    void finish_sums(const Host&, const char*) override { calls.emplace_back(); }  // empty: a finish
    std::vector<std::vector<snug::ParameterRange>> calls;
};

template <class Precision>
void overlap_matches_summing_after(int shards) {
    INFO(Precision::name << ", " << shards << " shard(s)");
    snug::TrainConfig tc;
    if (shards > 1) {
        tc.shards = shards;
        tc.shard = ranks().rank();
    }
    snug::dist::Communicator<Host> plain_comm(ranks());
    LoggingCommunicator logging(ranks());
    const Trace plain = train<Precision>(2, &plain_comm, tc);
    const Trace overlapped = train<Precision>(2, &logging, tc);
    CHECK(overlapped.losses == plain.losses);
    CHECK(overlapped.norms == plain.norms);
    CHECK(overlapped.working == plain.working);

    // Each update: block 1's ranges, block 0's (started in the backward,
    // last block first), then the rest, then the finish; together every
    // parameter exactly once.
    using Act = typename Precision::compute_type;
    const snug::GPTConfig c = snug::GPTConfig::preset("d2").with_vocab(64).with_context(16);
    snug::MemoryTracker t;
    const snug::GPT<Act, Host> model(c, t);
    const std::vector<snug::ParameterTensor> tensors = snug::gpt_named_tensors(c);
    REQUIRE(logging.calls.size() == 3 * 4);
    for (int s = 0; s < 3; ++s) {
        INFO("update " << s + 1);
        const auto* call = &logging.calls[static_cast<std::size_t>(4 * s)];
        CHECK(call[0] == model.block_parameters(1));
        CHECK(call[1] == model.block_parameters(0));
        CHECK(call[3].empty());
        // Block 1's ranges are its 12 tensors, one range each (llm.c's order).
        std::vector<snug::ParameterRange> h1;
        for (const snug::ParameterTensor& x : tensors)
            if (x.name.rfind("h.1.", 0) == 0) h1.push_back({x.offset, x.count()});
        CHECK(h1.size() == 12);
        CHECK(call[0] == h1);
        std::vector<snug::ParameterRange> all;
        for (int k = 0; k < 3; ++k) all.insert(all.end(), call[k].begin(), call[k].end());
        std::sort(all.begin(), all.end(), [](auto x, auto y) { return x.offset < y.offset; });
        std::int64_t at = 0;
        for (const snug::ParameterRange& r : all) {
            CHECK(r.offset == at);
            at = r.offset + r.count;
        }
        CHECK(at == model.num_parameters());
    }
}

}  // namespace

TEST_CASE("Gradient sums that overlap the backward start block by block, last block first, with the same bits") {
    overlap_matches_summing_after<snug::precision::Fp32>(1);
    overlap_matches_summing_after<snug::precision::Bf16>(1);
    overlap_matches_summing_after<snug::precision::Fp16<snug::DynamicLossScaler>>(1);
    overlap_matches_summing_after<snug::precision::Fp32>(ranks().size());
    overlap_matches_summing_after<snug::precision::Bf16>(ranks().size());
}

// ZeRO-1 with each rank's shard of the optimizer offloaded to the host: the
// same updates, bit for bit, as the shards on the device, and no optimizer
// state left in the device's ledger.
TEST_CASE("ZeRO-1 offloaded: each rank's shard updated on the host, as on the device") {
    snug::dist::Communicator<Host> comm(ranks());
    for (const snug::MomentStorage moments : {snug::MomentStorage::fp32, snug::MomentStorage::int8}) {
        INFO("moments " << snug::moment_storage_name(moments));
        snug::TrainConfig tc;
        tc.shards = ranks().size();
        tc.shard = ranks().rank();
        tc.adamw.moments = moments;
        tc.adamw.master = moments == snug::MomentStorage::int8 ? snug::MasterStorage::none : snug::MasterStorage::fp32;
        const Trace on_device = train<snug::precision::Bf16>(2, &comm, tc);
        tc.adamw.offload = true;
        tc.adamw.offload_chunk = 300;
        const Trace offloaded = train<snug::precision::Bf16>(2, &comm, tc);
        CHECK(offloaded.losses == on_device.losses);
        CHECK(offloaded.norms == on_device.norms);
        CHECK(offloaded.working == on_device.working);
        CHECK(on_device.state > 0);
        CHECK(offloaded.state == 0);
        CHECK(on_device.peak - offloaded.peak == on_device.state);
    }
}

TEST_CASE("ZeRO-1 refuses a communicator of another size or rank") {
    using Catch::Matchers::Contains;
    snug::dist::Communicator<Host> comm(ranks());
    snug::TrainConfig tc;
    tc.shards = ranks().size() + 1;
    tc.shard = ranks().rank();
    using Model = snug::GPT<float, Host>;
    const snug::GPTConfig c = snug::GPTConfig::preset("d2").with_vocab(64).with_context(16);
    snug::test::HostRun run;
    Model model(c, run.tracker);
    model.load_weights(run.ctx.device, snug::gpt_initial_weights(c, 21));
    snug::TrainStep<Model, snug::precision::Fp32, snug::accumulate::None, snug::checkpoint::None> step(
        model, run.tracker, run.ctx.device, tc);
    CHECK_THROWS_WITH(step.data_parallel(comm), Contains("sharded for rank") && Contains("but the communicator is rank"));
    tc.shard = tc.shards;
    using Step = decltype(step);
    CHECK_THROWS_WITH(Step(model, run.tracker, run.ctx.device, tc), Contains("need 0 <= shard < shards"));
}

namespace staged {

// A device whose memory is host memory but which is not snug::Host, so the
// Communicator stages it through host memory window by window, as it does a
// GPU's without NCCL; it remembers its largest copy (bytes) each way.
struct Device {
    static constexpr const char* name = "staged (test)";
    static void* allocate(std::size_t n) { return ::operator new(n); }
    static void deallocate(void* p) noexcept { ::operator delete(p); }
    void synchronize() const {}
    mutable std::int64_t largest_copy = 0;
};
template <class T>
void download(const Device& d, std::type_identity_t<T>* dst, const T* src, std::int64_t n) {
    d.largest_copy = std::max(d.largest_copy, n * static_cast<std::int64_t>(sizeof(T)));
    std::copy_n(src, n, dst);
}
template <class T>
void upload(const Device& d, T* dst, const std::type_identity_t<T>* src, std::int64_t n) {
    d.largest_copy = std::max(d.largest_copy, n * static_cast<std::int64_t>(sizeof(T)));
    std::copy_n(src, n, dst);
}

}  // namespace staged

TEST_CASE("Communicator stages a device's memory in windows of its bucket: sums, reduce-scatter, all-gather") {
    REQUIRE(ranks().size() == 2);  // the exact sums below are of two addends
    const int me = ranks().rank();
    constexpr std::int64_t bucket = 5, n = 23;  // windows of 5 values (20 bytes): 4 whole, 1 of 3
    staged::Device dev;
    snug::dist::Communicator<staged::Device> comm(ranks(), bucket);
    const std::vector<float> in0 = input_of<float>(0, n), in1 = input_of<float>(1, n);
    auto sum = [&](std::int64_t i) { return in0[static_cast<std::size_t>(i)] + in1[static_cast<std::size_t>(i)]; };

    std::vector<float> data = input_of<float>(me, n);
    comm.all_reduce_sum(dev, data.data(), n, "test all-reduce");
    std::int64_t wrong = 0;
    for (std::int64_t i = 0; i < n; ++i) wrong += data[static_cast<std::size_t>(i)] != sum(i);
    CHECK(wrong == 0);

    // Even, uneven (a cut inside a window), and one rank's part empty.
    for (const std::vector<std::int64_t>& cuts : {std::vector<std::int64_t>{0, 10, n}, std::vector<std::int64_t>{0, 7, n},
                                                  std::vector<std::int64_t>{0, 0, n}, std::vector<std::int64_t>{0, n, n}}) {
        INFO("cuts 0, " << cuts[1] << ", " << n);
        const std::int64_t a = cuts[me], b = cuts[me + 1];
        data = input_of<float>(me, n);
        comm.reduce_scatter_sum(dev, data.data(), cuts, "test reduce-scatter");
        wrong = 0;
        for (std::int64_t i = a; i < b; ++i) wrong += data[static_cast<std::size_t>(i)] != sum(i);
        CHECK(wrong == 0);

        // Doubles: 8-byte values, so some straddle two 20-byte windows.
        const std::vector<double> d0 = input_of<double>(0, n), d1 = input_of<double>(1, n);
        std::vector<double> gathered(static_cast<std::size_t>(n), std::nan(""));  // poison
        const std::vector<double>& mine = me == 0 ? d0 : d1;
        std::copy(mine.begin() + a, mine.begin() + b, gathered.begin() + a);
        comm.all_gather(dev, gathered.data(), cuts, "test all-gather");
        wrong = 0;
        for (std::int64_t i = 0; i < n; ++i) {
            const auto k = static_cast<std::size_t>(i);
            wrong += gathered[k] != (i < cuts[1] ? d0[k] : d1[k]);
        }
        CHECK(wrong == 0);
    }
    // Never more than a bucket of floats in host memory at once.
    CHECK(dev.largest_copy > 0);
    CHECK(dev.largest_copy <= bucket * std::int64_t{sizeof(float)});
}
