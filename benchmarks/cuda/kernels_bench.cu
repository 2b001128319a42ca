// CUDA kernel microbenchmarks, each beside its roofline. Usage:
//   kernels_bench [results.csv]
// Every row states the work its kernel must do at its shape — the fewest
// bytes it must move and the FLOPs it must compute — and from them the H200's
// lower bound on its time: max(bytes / 4.3 TB/s, FLOPs / peak), with the
// peaks measured on an H200 (copy 4.3 TB/s; cuBLASLt bf16/fp16 ~790 TFLOP/s)
// or, for fp32 (no tensor cores), NVIDIA's stated 67 TFLOP/s. Without a GPU
// it prints that table alone (what each kernel must reach) and exits 77.
// On a GPU, first the two ceilings, measured on this card: device-to-device copy
// bandwidth (cudaMemcpy, bytes read + written) and cuBLASLt GEMM throughput per
// input type at 8192^3 (through snug::cuda::Blas). Then each snug kernel at
// GPT-2 124M shapes (B 16, T 1024, C 768, 12 heads, vocabulary 50257 padded to
// 50304, 124 M parameters): memory-bound kernels as achieved GB/s against the
// copy bandwidth (the fewest bytes the kernel must move: each input read once,
// each output written once), matrix-bound ones as TFLOP/s against the GEMM
// peak of their type.
//
// Timing: CUDA events around each launch, after warm-up; the median of many
// runs; inputs rotated among enough copies that one pass over them is several
// times the L2 cache, filled with random values (never zeros).
// No GPU: says so and exits 77 (CTest's skip code).
#include <snug/snug.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using snug::bfloat16;
using snug::half;
using snug::cuda::check;

constexpr int warmup_runs = 5;
constexpr int timed_runs = 30;

// False without a GPU: buffers stay unallocated, nothing is filled, launched
// or timed, and each row prints only its work and the H200 bound.
bool measuring = true;

// ---- random fill on the device (splitmix64 of the index, uniform in [lo, hi)) ----
__device__ inline float uniform_at(std::uint64_t i, std::uint64_t seed, float lo, float hi) {
    std::uint64_t z = i + seed * 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
    return lo + (hi - lo) * u;
}

template <class T>
__global__ void fill_kernel(T* p, std::int64_t n, std::uint64_t seed, float lo, float hi) {
    for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
         i += std::int64_t{gridDim.x} * blockDim.x)
        p[i] = T(uniform_at(static_cast<std::uint64_t>(i), seed, lo, hi));
}

__global__ void fill_targets_kernel(std::int32_t* p, std::int64_t n, std::uint64_t seed, int V) {
    for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
         i += std::int64_t{gridDim.x} * blockDim.x)
        p[i] = static_cast<std::int32_t>(uniform_at(static_cast<std::uint64_t>(i), seed, 0.0f, 1.0f) * V) % V;
}

template <class T>
void fill(T* p, std::int64_t n, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
    if (measuring) snug::cuda::launch<fill_kernel<T>>(1024, 256, 0, nullptr, p, n, seed, lo, hi);
}

// Device memory owned plainly (not through the tracker: the benchmark is the
// only user, and its sizes are fixed).
template <class T>
struct DeviceArray {
    T* p = nullptr;
    std::int64_t n = 0;
    explicit DeviceArray(std::int64_t count) : n(count) {
        if (measuring) check(cudaMalloc(&p, static_cast<std::size_t>(count) * sizeof(T)));
    }
    DeviceArray(const DeviceArray&) = delete;
    DeviceArray& operator=(const DeviceArray&) = delete;
    DeviceArray(DeviceArray&& o) noexcept : p(o.p), n(o.n) { o.p = nullptr; }
    ~DeviceArray() {
        if (p != nullptr) (void)cudaFree(p);
    }
    T* operator+(std::int64_t i) const { return p + i; }
};

// The median time in ms of fn(r), r = 0, 1, 2, ... the rotation index, each
// run bracketed by events on the default stream.
double median_ms(const std::function<void(int)>& fn, int rotation) {
    cudaEvent_t start, stop;
    check(cudaEventCreate(&start));
    check(cudaEventCreate(&stop));
    int r = 0;
    for (int i = 0; i < warmup_runs; ++i) fn(r++ % rotation);
    check(cudaDeviceSynchronize());
    std::vector<double> ms;
    for (int i = 0; i < timed_runs; ++i) {
        const int k = r++ % rotation;
        check(cudaEventRecord(start));
        fn(k);
        check(cudaEventRecord(stop));
        check(cudaEventSynchronize(stop));
        float t = 0.0f;
        check(cudaEventElapsedTime(&t, start, stop));
        ms.push_back(t);
    }
    check(cudaEventDestroy(start));
    check(cudaEventDestroy(stop));
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

// How many copies of a working set of `bytes` make one pass at least three
// times the L2 cache (at most 16).
int rotation_for(double bytes, double l2_bytes) {
    const double want = 3.0 * l2_bytes;
    return static_cast<int>(std::clamp(std::ceil(want / std::max(bytes, 1.0)), 1.0, 16.0));
}

// What a kernel must do at its shape, and the H200's lower bound on its time.
struct Work {
    double bytes = 0;  // the fewest bytes moved: each input read once, each output written once
    double flops = 0;  // the FLOPs the algorithm needs (0: not counted, memory-bound)
};

// The H200 figures the bound uses (see the top of the file).
constexpr double h200_copy_bytes_per_s = 4.3e12;
constexpr double h200_tensor_flops = 790e12;  // bf16 / fp16, cuBLASLt at 8192^3
constexpr double h200_fp32_flops = 67e12;     // no tensor cores (NVIDIA's figure)

double h200_bound_us(const Work& w, const std::string& dtype) {
    const double peak = dtype == "fp32" ? h200_fp32_flops : h200_tensor_flops;
    return std::max(w.bytes / h200_copy_bytes_per_s, w.flops / peak) * 1e6;
}

struct Row {
    std::string kernel, dtype, shape;
    Work work;
    double ms = 0;        // measured (0 without a GPU)
    double achieved = 0;  // GB/s or TFLOP/s
    std::string unit;
    double ceiling = 0;   // the measured ceiling in the same unit
};

std::vector<Row> rows;

void print_header() {
    std::printf("%-30s %-6s %-34s %9s %9s %10s %10s %10s %-7s %8s\n", "kernel", "dtype", "shape", "MB moved",
                "GFLOP", "H200 us", "median us", "achieved", "unit", "of ceil");
}

void record(Row r) {
    std::printf("%-30s %-6s %-34s %9.1f %9.1f %10.1f", r.kernel.c_str(), r.dtype.c_str(), r.shape.c_str(),
                r.work.bytes * 1e-6, r.work.flops * 1e-9, h200_bound_us(r.work, r.dtype));
    if (r.ms > 0)
        std::printf(" %10.3f %10.1f %-7s %7.1f%%", r.ms * 1e3, r.achieved, r.unit.c_str(),
                    r.ceiling > 0 ? 100.0 * r.achieved / r.ceiling : 0.0);
    std::printf("\n");
    std::fflush(stdout);
    rows.push_back(std::move(r));
}

// A memory-bound row: timed over `rotation` sets of buffers, as GB/s.
void memory_row(const char* kernel, const char* dtype, const std::string& shape, Work work, double copy_gbs,
                const std::function<void(int)>& fn, int rotation) {
    Row r{kernel, dtype, shape, work, 0.0, 0.0, "", 0.0};
    if (measuring) {
        r.ms = median_ms(fn, rotation);
        r.achieved = work.bytes / (r.ms * 1e-3) * 1e-9;
        r.unit = "GB/s";
        r.ceiling = copy_gbs;
    }
    record(std::move(r));
}

// A matrix-bound row: timed once per run on the same buffers, as TFLOP/s.
void flop_row(const char* kernel, const char* dtype, const std::string& shape, Work work, double gemm_tflops,
              const std::function<void(int)>& fn) {
    Row r{kernel, dtype, shape, work, 0.0, 0.0, "", 0.0};
    if (measuring) {
        r.ms = median_ms(fn, 1);
        r.achieved = work.flops / (r.ms * 1e-3) * 1e-12;
        r.unit = "TFLOP/s";
        r.ceiling = gemm_tflops;
    }
    record(std::move(r));
}

template <class T>
const char* type_name() {
    if constexpr (std::is_same_v<T, float>) return "fp32";
    else if constexpr (std::is_same_v<T, half>) return "fp16";
    else return "bf16";
}

// GPT-2 124M shapes.
constexpr int B = 16, T = 1024, C = 768, NH = 12, V = 50257, Vp = 50304;
constexpr std::int64_t N = std::int64_t{B} * T;
constexpr std::int64_t params = 124'475'904;  // GPT-2 124M with the padded vocabulary

struct Ceilings {
    double copy_gbs = 0;
    double gemm_fp32 = 0, gemm_tf32 = 0, gemm_bf16 = 0, gemm_fp16 = 0;
    double gemm(const char* dtype) const {
        const std::string d = dtype;
        return d == "fp32" ? gemm_fp32 : d == "fp16" ? gemm_fp16 : gemm_bf16;
    }
};

double copy_bandwidth() {
    const std::int64_t bytes = std::int64_t{2} << 30;  // 2 GiB each way
    DeviceArray<std::byte> a(bytes), b(bytes);
    check(cudaMemset(a.p, 1, static_cast<std::size_t>(bytes)));
    const double ms = median_ms([&](int) { check(cudaMemcpyAsync(b.p, a.p, static_cast<std::size_t>(bytes),
                                                                 cudaMemcpyDeviceToDevice)); }, 1);
    const double gbs = 2.0 * static_cast<double>(bytes) / (ms * 1e-3) * 1e-9;
    record({"cudaMemcpy D2D", "byte", "2 GiB", {2.0 * double(bytes), 0.0}, ms, gbs, "GB/s", gbs});
    return gbs;
}

template <class Tin, class Tout>
double gemm_peak(snug::cuda::Blas& blas, bool tf32, const char* label) {
    constexpr std::int64_t n = 8192;
    DeviceArray<Tin> a(n * n), b(n * n);
    DeviceArray<Tout> c(n * n);
    fill(a.p, a.n, 1);
    fill(b.p, b.n, 2);
    blas.set_tf32(tf32);
    const double ms = median_ms([&](int) {
        blas.matmul<Tin, Tout>(nullptr, snug::cuda::Op::N, snug::cuda::Op::N, n, n, n, 1.0f, a.p, n, b.p, n, 0.0f,
                               c.p, n);
    }, 1);
    blas.set_tf32(false);
    const double tflops = 2.0 * double(n) * double(n) * double(n) / (ms * 1e-3) * 1e-12;
    const double bytes = 3.0 * double(n) * double(n) * sizeof(Tin);
    record({"cuBLASLt GEMM", label, "8192^3 NN", {bytes, 2.0 * double(n) * double(n) * double(n)}, ms, tflops,
            "TFLOP/s", tflops});
    return tflops;
}

template <class Tp>
void kernels(const snug::cuda::Device& dev, const Ceilings& ceil, double l2) {
    const char* dt = type_name<Tp>();
    const double A = sizeof(Tp);
    const std::string rows_shape = "N " + std::to_string(N) + " C " + std::to_string(C);

    {  // LayerNorm
        const double set = 2.0 * double(N * C) * A;
        const int R = rotation_for(set, l2);
        DeviceArray<Tp> inp(R * N * C), out(R * N * C), dout(R * N * C), dinp(R * N * C), w(C), b(C);
        DeviceArray<float> mean(R * N), rstd(R * N), dw(C), db(C);
        fill(inp.p, inp.n, 3);
        fill(dout.p, dout.n, 4);
        fill(dinp.p, dinp.n, 5);
        fill(w.p, C, 6, 0.5f, 1.5f);
        fill(b.p, C, 7);
        if (measuring) {
            check(cudaMemset(dw.p, 0, C * sizeof(float)));
            check(cudaMemset(db.p, 0, C * sizeof(float)));
        }
        memory_row("layernorm_forward", dt, rows_shape, {set + 8.0 * N}, ceil.copy_gbs, [&](int r) {
            snug::cuda::layernorm_forward(dev, out + r * N * C, mean + r * N, rstd + r * N, inp + r * N * C, w.p, b.p,
                                          N, C);
        }, R);
        // A block's second residual add and its ln2: res read and written, x
        // read, out written; fused, and as the two kernels it replaces (one
        // more pass over res).
        memory_row("residual_layernorm_forward", dt, rows_shape, {4.0 * double(N * C) * A + 8.0 * N}, ceil.copy_gbs,
                   [&](int r) {
            snug::cuda::residual_layernorm_forward(dev, out + r * N * C, mean + r * N, rstd + r * N, dinp + r * N * C,
                                                   inp + r * N * C, w.p, b.p, N, C);
        }, R);
        memory_row("add_inplace+layernorm_forward", dt, rows_shape, {4.0 * double(N * C) * A + 8.0 * N},
                   ceil.copy_gbs, [&](int r) {
            snug::cuda::add_inplace(dev, dinp + r * N * C, inp + r * N * C, N * C);
            snug::cuda::layernorm_forward(dev, out + r * N * C, mean + r * N, rstd + r * N, dinp + r * N * C, w.p, b.p,
                                          N, C);
        }, R);
        fill(dinp.p, dinp.n, 5);
        // dout, inp read; dinp read and written (it accumulates); mean, rstd read.
        memory_row("layernorm_backward", dt, rows_shape, {4.0 * double(N * C) * A + 8.0 * N}, ceil.copy_gbs,
                   [&](int r) {
            snug::cuda::layernorm_backward(dev, dinp + r * N * C, dw.p, db.p, dout + r * N * C, inp + r * N * C, w.p,
                                           mean + r * N, rstd + r * N, N, C);
        }, R);
        // Llama's norm at the same shape: no mean, no bias.
        memory_row("rmsnorm_forward", dt, rows_shape, {set + 4.0 * N}, ceil.copy_gbs, [&](int r) {
            snug::cuda::rmsnorm_forward(dev, out + r * N * C, rstd + r * N, inp + r * N * C, w.p, N, C);
        }, R);
        memory_row("rmsnorm_backward", dt, rows_shape, {4.0 * double(N * C) * A + 4.0 * N}, ceil.copy_gbs,
                   [&](int r) {
            snug::cuda::rmsnorm_backward(dev, dinp + r * N * C, dw.p, dout + r * N * C, inp + r * N * C, w.p,
                                         rstd + r * N, N, C);
        }, R);
    }
    {  // GELU on the MLP's hidden activations (N, 4C)
        const std::int64_t n = N * 4 * C;
        const double set = 2.0 * double(n) * A;
        const int R = rotation_for(set, l2);
        DeviceArray<Tp> inp(R * n), out(R * n), dout(R * n);
        fill(inp.p, inp.n, 8, -4.0f, 4.0f);
        fill(dout.p, dout.n, 9);
        const std::string shape = "n " + std::to_string(n);
        memory_row("gelu_forward", dt, shape, {set}, ceil.copy_gbs,
                   [&](int r) { snug::cuda::gelu_forward(dev, out + r * n, inp + r * n, n); }, R);
        memory_row("gelu_backward", dt, shape, {3.0 * double(n) * A}, ceil.copy_gbs,
                   [&](int r) { snug::cuda::gelu_backward(dev, out + r * n, inp + r * n, dout + r * n, n); }, R);
    }
    // Attention: causal matrix-product FLOPs (forward 2 products, backward 4
    // + the recomputed scores: 2.5x, each T^2 hs / 2 per head).
    const double att_fwd = 2.0 * double(B) * double(T) * double(T) * double(C);
    const std::string att_shape = "B 16 T 1024 C 768 NH 12";
    const std::int64_t qkv_n = N * 3 * C, att_n = std::int64_t{B} * NH * T * T;
    {  // Materialised: the (B, NH, T, T) probabilities written and read dominate its bytes.
        DeviceArray<Tp> qkv(qkv_n), out(N * C), att(att_n), scratch(att_n), dout(N * C), dqkv(qkv_n);
        fill(qkv.p, qkv_n, 10);
        fill(dout.p, N * C, 11);
        flop_row("attention_forward", dt, att_shape, {double(att_n + qkv_n + N * C) * A, att_fwd}, ceil.gemm(dt),
                 [&](int) { snug::cuda::attention_forward(dev, out.p, att.p, qkv.p, B, T, C, NH); });
        flop_row("attention_backward", dt, att_shape, {double(2 * att_n + 2 * qkv_n + N * C) * A, 2.5 * att_fwd},
                 ceil.gemm(dt), [&](int) {
            snug::cuda::attention_backward(dev, dqkv.p, scratch.p, dout.p, qkv.p, att.p, B, T, C, NH);
        });
    }
    {  // Flash attention at the same shape (B NH = 192, hs 64): qkv in, out
       // and one fp32 log-sum-exp per row out; what the forward keeps for the
       // backward beside the materialised kernel's.
        const std::int64_t stat_n = snug::ops::flash_stat_elems(B, T, NH);
        DeviceArray<Tp> qkv(qkv_n), out(N * C), dout(N * C), dqkv(qkv_n);
        DeviceArray<float> lse(stat_n), rows(stat_n);
        fill(qkv.p, qkv_n, 10);
        fill(dout.p, N * C, 11);
        flop_row("flash_attention_forward", dt, att_shape, {double(qkv_n + N * C) * A + 4.0 * double(stat_n), att_fwd},
                 ceil.gemm(dt), [&](int) {
            snug::cuda::flash_attention_forward(dev, out.p, lse.p, qkv.p, B, T, C, NH);
        });
        flop_row("flash_attention_backward", dt, att_shape,
                 {double(2 * qkv_n + 2 * N * C) * A + 8.0 * double(stat_n), 2.5 * att_fwd}, ceil.gemm(dt), [&](int) {
            snug::cuda::flash_attention_backward(dev, dqkv.p, rows.p, dout.p, qkv.p, out.p, lse.p, B, T, C, NH);
        });
        // The same contract on cuDNN's fused SDPA, where this program has it (examples/cudnn_engine.cpp).
        if constexpr (!std::is_same_v<Tp, float>) {
            snug::cuda::FusedAttention* engine = snug::cuda::registered_fused_attention();
            const snug::FusedAttentionShape shape{snug::dtype_of<Tp>, B, T, C, NH};
            if (engine != nullptr && measuring && engine->refusal(shape).empty()) {
                snug::cuda::Device fused_dev = dev;
                fused_dev.fused = engine;
                DeviceArray<std::byte> fwd_ws(std::max<std::int64_t>(
                    1, static_cast<std::int64_t>(engine->workspace_bytes(shape, snug::AttentionPass::forward))));
                DeviceArray<std::byte> bwd_ws(std::max<std::int64_t>(
                    1, static_cast<std::int64_t>(engine->workspace_bytes(shape, snug::AttentionPass::backward))));
                flop_row("cudnn_attention_forward", dt, att_shape,
                         {double(qkv_n + N * C) * A + 4.0 * double(stat_n), att_fwd}, ceil.gemm(dt), [&](int) {
                    snug::cuda::fused_attention_forward(fused_dev, fwd_ws.p, out.p, lse.p, qkv.p, B, T, C, NH);
                });
                flop_row("cudnn_attention_backward", dt, att_shape,
                         {double(2 * qkv_n + 2 * N * C) * A + 8.0 * double(stat_n), 2.5 * att_fwd}, ceil.gemm(dt),
                         [&](int) {
                    snug::cuda::fused_attention_backward(fused_dev, bwd_ws.p, dqkv.p, dout.p, qkv.p, out.p, lse.p, B,
                                                         T, C, NH);
                });
            } else if (engine == nullptr) {
                std::printf("cudnn_attention_forward/backward: not in this build (no cuDNN)\n");
            } else if (measuring) {
                std::printf("cudnn_attention_forward/backward: cuDNN refuses %s: %s\n", att_shape.c_str(),
                            engine->refusal(shape).c_str());
            }
        }
        const double kept_flash = double(N * C) * A + double(stat_n) * sizeof(float);
        const double kept_materialized = double(N * C + att_n) * A;
        std::printf("attention activations kept per layer at %s, %s: flash %.1f MiB, materialised %.1f MiB\n",
                    att_shape.c_str(), dt, kept_flash / 1048576.0, kept_materialized / 1048576.0);
    }
    {  // Fused softmax cross-entropy over the logits, in place into dlogits
        DeviceArray<Tp> logits(N * Vp);
        DeviceArray<float> losses(N);
        DeviceArray<std::int32_t> targets(N);
        fill(logits.p, logits.n, 12, -4.0f, 4.0f);
        if (measuring) snug::cuda::launch<fill_targets_kernel>(256, 256, 0, nullptr, targets.p, N, 13, V);
        memory_row("softmax_cross_entropy", dt, "N 16384 V 50257 Vp 50304", {2.0 * double(N * Vp) * A + 8.0 * N},
                   ceil.copy_gbs, [&](int) {
            snug::cuda::softmax_cross_entropy(dev, losses.p, logits.p, targets.p, N, V, Vp, 1.0f / float(N));
        }, 1);
    }
    {  // AdamW over every parameter: master, m, v read and written, grad read, working copy written
        DeviceArray<float> master(params), grad(params), m(params), v(params);
        DeviceArray<Tp> working(params);
        fill(master.p, params, 14);
        fill(grad.p, params, 15, -1e-2f, 1e-2f);
        fill(m.p, params, 16, -1e-3f, 1e-3f);
        fill(v.p, params, 17, 0.0f, 1e-6f);
        int step = 0;
        const double working_bytes = std::is_same_v<Tp, float> ? 0.0 : A;
        memory_row("adamw_update", dt, "n 124M", {double(params) * (7.0 * 4.0 + working_bytes)}, ceil.copy_gbs,
                   [&](int) {
            ++step;
            if constexpr (std::is_same_v<Tp, float>)
                snug::cuda::adamw_update(dev, master.p, nullptr, grad.p, m.p, v.p, params, 1e-4f, 0.9f, 0.95f, 1e-8f,
                                         0.1f, step, 1.0f);
            else
                snug::cuda::adamw_update(dev, master.p, working.p, grad.p, m.p, v.p, params, 1e-4f, 0.9f, 0.95f,
                                         1e-8f, 0.1f, step, 1.0f);
        }, 1);
    }
    if constexpr (std::is_same_v<Tp, snug::bfloat16>) {
        // Lean AdamW: bf16 weights without a master and bf16 moments, each read
        // and written and rounded stochastically (one Philox block per element); grad read.
        DeviceArray<snug::bfloat16> weights(params), m(params), v(params);
        DeviceArray<float> grad(params);
        fill(weights.p, params, 14);
        fill(grad.p, params, 15, -1e-2f, 1e-2f);
        fill(m.p, params, 16, -1e-3f, 1e-3f);
        fill(v.p, params, 17, 0.0f, 1e-6f);
        int step = 0;
        memory_row("adamw_update (bf16 state, no master)", dt, "n 124M", {double(params) * (3.0 * 2.0 * 2.0 + 4.0)},
                   ceil.copy_gbs, [&](int) {
            ++step;
            snug::cuda::adamw_update(dev, weights.p, nullptr, grad.p, m.p, v.p, params, 1e-4f, 0.9f, 0.95f, 1e-8f,
                                     0.1f, step, 1.0f, snug::ops::AdamWRounding{7, 0});
        }, 1);
    }
    if constexpr (std::is_same_v<Tp, snug::bfloat16>) {
        // AdamW with 8-bit moments: bf16 weights without a master, a code byte
        // each for m and v and an fp32 absmax per 256 for each, all read and
        // written; grad read (every parameter quantised: the bound for a model
        // whose weight matrices dominate, as GPT-2's do).
        const std::int64_t blocks = snug::ops::moment_blocks(params);
        DeviceArray<snug::bfloat16> weights(params);
        DeviceArray<float> grad(params), m_absmax(blocks), v_absmax(blocks);
        DeviceArray<std::uint8_t> m(params), v(params);
        fill(weights.p, params, 14);
        fill(grad.p, params, 15, -1e-2f, 1e-2f);
        fill(m_absmax.p, blocks, 16, 1e-3f, 2e-3f);
        fill(v_absmax.p, blocks, 17, 1e-7f, 1e-6f);
        if (measuring) {
            check(cudaMemset(m.p, 0x5A, static_cast<std::size_t>(params)));
            check(cudaMemset(v.p, 0xC3, static_cast<std::size_t>(params)));
        }
        int step = 0;
        memory_row("adamw_update_8bit (8-bit moments, no master)", dt, "n 124M",
                   {double(params) * (2.0 * 2.0 + 2.0 * 2.0 * 1.0 + 4.0) + double(blocks) * 2.0 * 2.0 * 4.0},
                   ceil.copy_gbs, [&](int) {
            ++step;
            snug::cuda::adamw_update_8bit(dev, weights.p, nullptr, grad.p,
                                          snug::ops::BlockwiseMoments{m.p, m_absmax.p, v.p, v_absmax.p}, params, 1e-4f,
                                          0.9f, 0.95f, 1e-8f, 0.1f, step, 1.0f, snug::ops::AdamWRounding{7, 0});
        }, 1);
    }
    {  // Linear layers of one block, forward and backward through Blas (the MLP's first, N x 768 -> 3072)
        const int OC = 4 * C;
        DeviceArray<Tp> inp(N * C), w(std::int64_t{OC} * C), bias(OC), out(N * OC), dout(N * OC), dinp(N * C);
        DeviceArray<float> dw(std::int64_t{OC} * C), db(OC);
        fill(inp.p, inp.n, 18);
        fill(w.p, w.n, 19, -0.05f, 0.05f);
        fill(bias.p, OC, 20);
        fill(dout.p, dout.n, 21);
        if (measuring) {
            check(cudaMemset(dw.p, 0, dw.n * sizeof(float)));
            check(cudaMemset(db.p, 0, OC * sizeof(float)));
        }
        const double flops = 2.0 * double(N) * C * OC;
        const double weight_bytes = double(OC) * C * A;
        const std::string shape = "N 16384 C 768 OC 3072";
        flop_row("linear_forward", dt, shape, {double(N * C + N * OC) * A + weight_bytes, flops}, ceil.gemm(dt),
                 [&](int) { snug::cuda::linear_forward(dev, out.p, inp.p, w.p, bias.p, N, C, OC); });
        // dout, inp and the weight read, dinp written, the fp32 dW read and written.
        flop_row("linear_backward", dt, shape,
                 {double(N * OC + 2 * N * C) * A + weight_bytes + 8.0 * double(OC) * C, 2.0 * flops}, ceil.gemm(dt),
                 [&](int) { snug::cuda::linear_backward(dev, dinp.p, dw.p, db.p, dout.p, inp.p, w.p, N, C, OC); });
    }
}

void unscale(const snug::cuda::Device& dev, const Ceilings& ceil) {
    DeviceArray<float> grads(params), flag(1);
    fill(grads.p, params, 22);
    if (measuring) check(cudaMemset(flag.p, 0, sizeof(float)));
    float inv = 0.5f;
    memory_row("unscale_and_check", "fp32", "n 124M", {8.0 * double(params)}, ceil.copy_gbs, [&](int) {
        snug::cuda::unscale_and_check(dev, grads.p, params, inv, flag.p);
        inv = 1.0f / inv;  // values neither grow nor shrink
    }, 1);
    if (!measuring) return;
    float found = 0.0f;
    check(cudaMemcpy(&found, flag.p, sizeof(float), cudaMemcpyDeviceToHost));
    if (found != 0.0f) std::printf("WARNING: unscale_and_check flagged finite data\n");
}

void write_csv(const char* csv_path) {
    std::ofstream csv(csv_path);
    csv << "kernel,dtype,shape,bytes,flops,h200_bound_us,median_ms,achieved,unit,ceiling,fraction\n";
    for (const Row& r : rows)
        csv << '"' << r.kernel << "\"," << r.dtype << ",\"" << r.shape << "\"," << r.work.bytes << ','
            << r.work.flops << ',' << h200_bound_us(r.work, r.dtype) << ',' << r.ms << ',' << r.achieved << ','
            << r.unit << ',' << r.ceiling << ',' << (r.ceiling > 0 ? r.achieved / r.ceiling : 0.0) << '\n';
    std::printf("wrote %s\n", csv_path);
}

int run(const char* csv_path) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        measuring = false;
        std::printf("kernels_bench: no CUDA device present: nothing measured; the work of each kernel and the "
                    "H200's bound on its time:\n");
        print_header();
        const snug::cuda::Device dev;
        const Ceilings none;
        kernels<bfloat16>(dev, none, 0.0);
        kernels<float>(dev, none, 0.0);
        unscale(dev, none);
        if (csv_path != nullptr) write_csv(csv_path);
        std::printf("(exit 77 = skipped)\n");
        return 77;
    }
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, 0));
    const double l2 = static_cast<double>(prop.l2CacheSize);
    std::printf("device: %s, %d SMs, L2 %.0f MiB, %.1f GiB; warm-up %d, median of %d runs\n", prop.name,
                prop.multiProcessorCount, l2 / (1 << 20), static_cast<double>(prop.totalGlobalMem) / (1 << 30),
                warmup_runs, timed_runs);
    print_header();

    snug::MemoryTracker tracker;
    snug::cuda::Blas blas(tracker);
    snug::cuda::Device dev;
    dev.blas = &blas;

    Ceilings ceil;
    ceil.copy_gbs = copy_bandwidth();
    ceil.gemm_fp32 = gemm_peak<float, float>(blas, false, "fp32");
    ceil.gemm_tf32 = gemm_peak<float, float>(blas, true, "tf32");
    ceil.gemm_bf16 = gemm_peak<bfloat16, bfloat16>(blas, false, "bf16");
    ceil.gemm_fp16 = gemm_peak<half, half>(blas, false, "fp16");
    // Kernels in fp32 compare with the plain fp32 GEMM (Blas's default: tf32 off).

    kernels<bfloat16>(dev, ceil, l2);
    kernels<float>(dev, ceil, l2);
    unscale(dev, ceil);
    if (csv_path != nullptr) write_csv(csv_path);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(argc > 1 ? argv[1] : nullptr);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "kernels_bench: %s\n", e.what());
        return 1;
    }
}
