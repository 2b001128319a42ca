// CUDA training-step benchmark: tokens/s, MFU, HFU and peak memory of one
// TrainStep of GPT-2 124M at T = 1024, micro-batch 16, per rung of the ladder
// (fp32; bf16; fp16 with the dynamic loss scaler; bf16 with 8 and 32
// micro-batches accumulated, the optimizer on the device and offloaded to the
// host; bf16 with 8-bit moments and no master; bf16 with every block fully
// checkpointed), and GPT-2 350M under a 12 GiB MemoryTracker budget
// (checkpoint::Budget picks the plan). Usage:
//   step_bench [results.csv]
//
// MFU = model FLOPs (GPTConfig::flops_per_token: 6 x matmul parameters +
// 12 L C T per token, no recomputation) per second over the bf16 dense peak,
// given twice: against the cuBLASLt bf16 GEMM rate measured here (8192^3) and
// against the H200's nominal 989 TFLOP/s. HFU adds the forward FLOPs that
// recomputation runs again: 2 x block parameters + 4 C T per token for each
// fully checkpointed block (selective recomputation redoes no matrix product,
// and is counted as 0).
// Memory: the tracker's peak (everything snug allocates) and the driver's
// used memory, sampled after each update, over what was used before the rung.
// A rung that does not fit prints the OutOfMemory breakdown as its result.
// Launch gaps: one more update with every kernel, matmul and fused attention
// call timed by a CUDA event pair (KernelTimer); the device's busy time
// against the median update's says what the gaps between them cost (the
// event records add a little of their own).
// No GPU: says so and exits 77.
#include <snug/snug.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace {

using snug::Cuda;
using snug::cuda::check;

constexpr double nominal_bf16_tflops = 989.0;  // H200 SXM dense bf16, datasheet
constexpr int warmup_updates = 2;
constexpr int timed_updates = 6;

struct Result {
    std::string rung, model;
    int B = 0, T = 0, micro = 1;
    double ms = 0, tokens_per_s = 0, mfu_measured = 0, mfu_nominal = 0, hfu_measured = 0;
    double kernel_ms = 0;  // one update's device work, summed piece by piece (KernelTimer)
    double tracker_peak_gib = 0, driver_peak_gib = 0;
    std::string plan, note;
    bool out_of_memory = false;
};

std::vector<Result> results;
double measured_bf16_tflops = 0;

double gib(std::size_t bytes) { return static_cast<double>(bytes) / double(1ULL << 30); }

// Times each piece of device work an update queues (every kernel, matmul and
// fused attention call: snug::cuda::LaunchObserver) with a CUDA event pair
// around it; their sum against the update's whole time is what the launch
// gaps cost (the device idle between pieces, waiting for the host).
class KernelTimer : public snug::cuda::LaunchObserver {
public:
    ~KernelTimer() override {
        for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
    }
    void before(cudaStream_t stream) override { check(cudaEventRecord(next(), stream)); }
    void after(cudaStream_t stream) override { check(cudaEventRecord(next(), stream)); }
    // The summed ms of the pairs recorded so far (waits for them), and forgets them.
    double take_ms() {
        check(cudaDeviceSynchronize());
        double total = 0;
        for (std::size_t i = 0; i + 1 < used_; i += 2) {
            float t = 0;
            check(cudaEventElapsedTime(&t, events_[i], events_[i + 1]));
            total += t;
        }
        used_ = 0;
        return total;
    }

private:
    cudaEvent_t next() {
        if (used_ == events_.size()) {
            cudaEvent_t e = nullptr;
            check(cudaEventCreate(&e));
            events_.push_back(e);
        }
        return events_[used_++];
    }
    std::vector<cudaEvent_t> events_;
    std::size_t used_ = 0;
};

double measure_bf16_peak() {
    constexpr std::int64_t n = 8192;
    snug::MemoryTracker tracker;
    snug::cuda::Blas blas(tracker);
    constexpr auto temporaries = snug::MemoryCategory::temporaries;
    snug::Buffer<snug::bfloat16, Cuda> a(tracker, temporaries, n * n, "A"), b(tracker, temporaries, n * n, "B"),
        c(tracker, temporaries, n * n, "C");
    // Random operands (never zeros): a fixed pattern of small values from the host.
    std::vector<snug::bfloat16> host(static_cast<std::size_t>(n * n));
    snug::Generator g(3);
    for (auto& x : host) x = snug::bfloat16(g.normal());
    snug::cuda::copy_to_device(a.data(), std::span<const snug::bfloat16>(host));
    snug::cuda::copy_to_device(b.data(), std::span<const snug::bfloat16>(host));
    cudaEvent_t start, stop;
    check(cudaEventCreate(&start));
    check(cudaEventCreate(&stop));
    std::vector<float> ms;
    for (int i = 0; i < 13; ++i) {
        check(cudaEventRecord(start));
        blas.matmul<snug::bfloat16, snug::bfloat16>(nullptr, snug::cuda::Op::N, snug::cuda::Op::T, n, n, n, 1.0f,
                                                    a.data(), n, b.data(), n, 0.0f, c.data(), n);
        check(cudaEventRecord(stop));
        check(cudaEventSynchronize(stop));
        float t = 0;
        check(cudaEventElapsedTime(&t, start, stop));
        if (i >= 3) ms.push_back(t);  // three warm-up products
    }
    check(cudaEventDestroy(start));
    check(cudaEventDestroy(stop));
    std::sort(ms.begin(), ms.end());
    return 2.0 * double(n) * n * n / (ms[ms.size() / 2] * 1e-3) * 1e-12;
}

// Tokens and next-token targets for `count` micro-batches of (B, T), random ids.
struct DeviceTokens {
    snug::Buffer<std::int32_t, Cuda> tokens, targets;
    DeviceTokens(snug::MemoryTracker& tracker, std::int64_t n, int vocab)
        : tokens(tracker, snug::MemoryCategory::temporaries, static_cast<std::size_t>(n), "benchmark tokens"),
          targets(tracker, snug::MemoryCategory::temporaries, static_cast<std::size_t>(n), "benchmark targets") {
        snug::Generator g(11);
        std::vector<std::int32_t> ids(static_cast<std::size_t>(n) + 1);
        for (auto& t : ids) t = static_cast<std::int32_t>(g.below(static_cast<std::uint32_t>(vocab)));
        snug::cuda::copy_to_device(tokens.data(), std::span<const std::int32_t>(ids.data(), ids.size() - 1));
        snug::cuda::copy_to_device(targets.data(), std::span<const std::int32_t>(ids.data() + 1, ids.size() - 1));
    }
};

template <class Precision, class Accumulation, class Checkpoint>
void rung(const char* name, const char* model_name, const snug::GPTConfig& config, int B, int T,
          std::optional<std::size_t> budget, Accumulation accumulation, Checkpoint checkpoint,
          snug::TrainConfig train_config = {}) {
    using Model = snug::GPT<typename Precision::compute_type, Cuda>;
    using Step = snug::TrainStep<Model, Precision, Accumulation, Checkpoint>;
    Result r;
    r.rung = name;
    r.model = model_name;
    r.B = B;
    r.T = T;
    r.micro = accumulation.steps();
    check(cudaDeviceSynchronize());
    const std::size_t driver_before = snug::cuda::driver_memory().used;
    std::size_t driver_peak = driver_before;
    std::size_t tracker_peak = 0;
    try {
        snug::MemoryTracker tracker(budget);
        snug::cuda::Blas blas(tracker);
        snug::ActivationArena<Cuda> activations(tracker);
        snug::ActivationArena<Cuda> scratch(tracker, snug::ActivationArena<Cuda>::default_chunk_bytes,
                                            snug::MemoryCategory::temporaries);
        snug::Context<Cuda> ctx{Cuda{}, activations, scratch};
        ctx.device.blas = &blas;
        ctx.device.fused = snug::cuda::registered_fused_attention();  // for the cuDNN attention rungs
        Model model(config, tracker);
        const std::vector<float> weights = snug::gpt_initial_weights(config, 1);
        model.load_weights(ctx.device, weights);
        Step step(model, tracker, ctx.device, weights, train_config, {}, accumulation, checkpoint);
        const int n = r.micro;
        DeviceTokens data(tracker, std::int64_t{n} * B * T, config.vocab_size);
        std::vector<snug::MicroBatch> micro;
        for (int i = 0; i < n; ++i)
            micro.push_back(
                {data.tokens.data() + std::int64_t{i} * B * T, data.targets.data() + std::int64_t{i} * B * T});

        cudaEvent_t start, stop;
        check(cudaEventCreate(&start));
        check(cudaEventCreate(&stop));
        std::vector<float> ms;
        for (int i = 0; i < warmup_updates + timed_updates; ++i) {
            check(cudaEventRecord(start));
            const snug::StepResult s = step.step(ctx, micro, B, T, 1e-4f);
            check(cudaEventRecord(stop));
            check(cudaEventSynchronize(stop));
            float t = 0;
            check(cudaEventElapsedTime(&t, start, stop));
            if (i >= warmup_updates) ms.push_back(t);
            driver_peak = std::max(driver_peak, snug::cuda::driver_memory().used);
            if (s.skipped) r.note = "some updates skipped (loss scale search)";
        }
        // One more update with every piece of its work timed.
        KernelTimer timer;
        snug::cuda::launch_observer() = &timer;
        (void)step.step(ctx, micro, B, T, 1e-4f);
        snug::cuda::launch_observer() = nullptr;
        r.kernel_ms = timer.take_ms();
        check(cudaEventDestroy(start));
        check(cudaEventDestroy(stop));
        std::sort(ms.begin(), ms.end());
        r.ms = ms[ms.size() / 2];

        const double tokens = double(n) * B * T;
        r.tokens_per_s = tokens / (r.ms * 1e-3);
        const double model_flops = tokens * config.flops_per_token(T);
        double recompute = 0;
        for (snug::Recompute m : step.recompute_plan()) {
            r.plan += m == snug::Recompute::full ? 'F' : m == snug::Recompute::selective ? 'S' : '-';
            if (m == snug::Recompute::full)
                recompute += tokens * (2.0 * double(config.block_parameters()) + 4.0 * config.channels * double(T));
        }
        const double seconds = r.ms * 1e-3;
        r.mfu_measured = model_flops / seconds * 1e-12 / measured_bf16_tflops;
        r.mfu_nominal = model_flops / seconds * 1e-12 / nominal_bf16_tflops;
        r.hfu_measured = (model_flops + recompute) / seconds * 1e-12 / measured_bf16_tflops;
        tracker_peak = tracker.peak_total();
    } catch (const snug::OutOfMemory& e) {
        r.out_of_memory = true;
        r.note = std::string("OUT OF MEMORY (a result, not a crash):\n") + e.what();
    }
    r.tracker_peak_gib = gib(tracker_peak);
    r.driver_peak_gib = gib(driver_peak - driver_before);
    std::printf("%-22s %-5s B %2d x %d  %9.1f ms %10.0f tok/s  MFU %5.1f%% (nominal %5.1f%%)  HFU %5.1f%%  "
                "tracker %6.2f GiB  driver %6.2f GiB  plan %s\n",
                r.rung.c_str(), r.model.c_str(), r.B, r.micro, r.ms, r.tokens_per_s, 100 * r.mfu_measured,
                100 * r.mfu_nominal, 100 * r.hfu_measured, r.tracker_peak_gib, r.driver_peak_gib,
                r.plan.empty() ? "?" : r.plan.c_str());
    if (r.kernel_ms > 0)
        std::printf("  device work %.1f ms of the %.1f ms update: launch gaps %.1f%%\n", r.kernel_ms, r.ms,
                    100.0 * (1.0 - r.kernel_ms / r.ms));
    if (!r.note.empty()) std::printf("  %s\n", r.note.c_str());
    std::fflush(stdout);
    results.push_back(std::move(r));
}

int run(const char* csv_path) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        std::printf("step_bench: no CUDA device present: nothing measured (exit 77 = skipped)\n");
        return 77;
    }
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, 0));
    measured_bf16_tflops = measure_bf16_peak();
    std::printf("device: %s; bf16 GEMM peak measured %.1f TFLOP/s (8192^3 through cuBLASLt), nominal %.0f\n",
                prop.name, measured_bf16_tflops, nominal_bf16_tflops);
    std::printf("MFU and HFU below are against the MEASURED bf16 peak; '(nominal)' against %.0f TFLOP/s\n",
                nominal_bf16_tflops);

    namespace P = snug::precision;
    namespace A = snug::accumulate;
    namespace K = snug::checkpoint;
    constexpr int T = 1024, B = 16;
    const snug::GPTConfig gpt2 = snug::GPTConfig::preset("124M").with_context(T);
    rung<P::Fp32>("fp32", "124M", gpt2, B, T, std::nullopt, A::None{}, K::None{});
    rung<P::Bf16>("bf16", "124M", gpt2, B, T, std::nullopt, A::None{}, K::None{});
    // Attention on cuDNN's fused SDPA, where this program has it (examples/cudnn_engine.cpp).
    snug::GPTConfig gpt2_cudnn = gpt2;
    gpt2_cudnn.attention = snug::AttentionKind::cudnn;
    if (snug::cuda::registered_fused_attention() != nullptr) {
        rung<P::Bf16>("bf16 (cuDNN attention)", "124M", gpt2_cudnn, B, T, std::nullopt, A::None{}, K::None{});
        rung<P::Bf16>("bf16+full-ckpt (cuDNN attention)", "124M", gpt2_cudnn, B, T, std::nullopt, A::None{},
                      K::Full{});
    } else {
        std::printf("no cuDNN in this build: the cuDNN attention rungs are not run\n");
    }
    rung<P::Fp16<snug::DynamicLossScaler>>("fp16+scaler", "124M", gpt2, B, T, std::nullopt, A::None{}, K::None{});
    snug::TrainConfig offload, lean;
    offload.adamw.offload = true;
    lean.adamw.moments = snug::MomentStorage::int8;
    lean.adamw.master = snug::MasterStorage::none;
    for (const int n : {8, 32}) {
        const std::string name = "bf16+accumulate(" + std::to_string(n) + ")";
        rung<P::Bf16>(name.c_str(), "124M", gpt2, B, T, std::nullopt, A::Steps(n), K::None{});
        rung<P::Bf16>((name + "+offload").c_str(), "124M", gpt2, B, T, std::nullopt, A::Steps(n), K::None{}, offload);
    }
    rung<P::Bf16>("bf16+8-bit state", "124M", gpt2, B, T, std::nullopt, A::None{}, K::None{}, lean);
    rung<P::Bf16>("bf16+full-ckpt", "124M", gpt2, B, T, std::nullopt, A::None{}, K::Full{});

    // 350M under 12 GiB: the activation budget is what is left after the
    // weights (bf16), their fp32 gradients, the optimizer's fp32 master copy
    // and two moments, and 1 GiB for workspaces and temporaries.
    const snug::GPTConfig medium = snug::GPTConfig::preset("350M").with_context(T);
    const std::size_t total = std::size_t{12} << 30;
    const auto P_count = static_cast<std::size_t>(snug::GPTLayout(medium).total());
    const std::size_t fixed = P_count * (2 + 4 + 12) + (std::size_t{1} << 30);
    rung<P::Bf16>("bf16+budget 12GiB", "350M", medium, B, T, total, A::None{},
                  K::Budget(total > fixed ? total - fixed : 0));

    if (csv_path != nullptr) {
        std::ofstream csv(csv_path);
        csv << "rung,model,B,T,micro_batches,median_ms,tokens_per_s,mfu_measured_peak,mfu_nominal_989,"
               "hfu_measured_peak,tracker_peak_gib,driver_peak_gib,plan,bf16_peak_tflops,status,device_work_ms,"
               "launch_gap_fraction\n";
        for (const Result& r : results)
            csv << '"' << r.rung << "\"," << r.model << ',' << r.B << ',' << r.T << ',' << r.micro << ',' << r.ms << ','
                << r.tokens_per_s << ',' << r.mfu_measured << ',' << r.mfu_nominal << ',' << r.hfu_measured << ','
                << r.tracker_peak_gib << ',' << r.driver_peak_gib << ',' << r.plan << ',' << measured_bf16_tflops << ','
                << (r.out_of_memory ? "out-of-memory" : "ok") << ',' << r.kernel_ms << ','
                << (r.ms > 0 && r.kernel_ms > 0 ? 1.0 - r.kernel_ms / r.ms : 0.0) << '\n';
        std::printf("wrote %s\n", csv_path);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(argc > 1 ? argv[1] : nullptr);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "step_bench: %s\n", e.what());
        return 1;
    }
}
