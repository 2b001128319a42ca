// The kernels of a GPT-2 124M bf16 training step, for a static report that
// needs no GPU (issue 36): tools/kernel_report.py compiles this file twice.
//
//   1. nvcc -cubin -arch=sm_XX (86, 89, 90): launch_step_kernels calls every
//      kernel launcher of include/snug/cuda/*.cuh (for linear.cuh, the bias
//      kernels' launchers around its cuBLASLt GEMMs), so nvcc instantiates
//      every kernel those launchers can launch, and the cubin holds them with
//      the registers, spills and static shared memory ptxas gave them.
//   2. The host compiler against the emulated backend (SNUG_CUDA_EMULATED),
//      with main() below: it runs launch_step_kernels with a launch recorder
//      set (snug/cuda/emulated/runtime.hpp), so each launcher decides its
//      launches exactly as it would on a GPU, and none runs. For each launch
//      it prints the launcher call, the kernel's mangled name (its symbol in
//      the cubin), threads per block and dynamic shared bytes. Launchers that
//      size their launches by the card (device_facts: SMs, opt-in shared
//      memory) see the emulated device's limits, an H200's unless the two
//      arguments give others (`step_kernels SMS OPTIN_BYTES`): the tool runs
//      it once per architecture with that architecture's.
//
// The report joins the two by mangled name; a kernel compiled in (1) but
// never launched at these sizes (a capacity or dtype another shape picks) is
// left out of it.
//
// Shapes: B 16, T 1024, C 768, 12 heads of 64, vocabulary 50257 padded to
// 50304, 124,475,904 parameters; flash attention also at head size 128
// (6 heads). Everything at bf16, the step's activation type, except what
// takes only fp32 (gradients, the optimizer's fp32 moments, reductions); the
// flash SIMT kernels are what the fp32 step launches. The Llama kernels
// (RMSNorm, SwiGLU, RoPE) run at the same B, T and C. Pointers are one fixed
// 256-byte-aligned address that nothing dereferences, so the launchers pick
// their 16-byte vector paths, as with the step's real allocations.
//
// Run it through the tool, which writes the table:
//     python3 tools/kernel_report.py [OUTPUT_DIR]
#include "snug/cuda/adamw.cuh"
#include "snug/cuda/attention.cuh"
#include "snug/cuda/blas.hpp"
#include "snug/cuda/cross_entropy.cuh"
#include "snug/cuda/elementwise.cuh"
#include "snug/cuda/encoder.cuh"
#include "snug/cuda/flash_attention.cuh"
#include "snug/cuda/gelu.cuh"
#include "snug/cuda/layernorm.cuh"
#include "snug/cuda/linear.cuh"
#include "snug/cuda/norms.cuh"
#include "snug/cuda/rmsnorm.cuh"
#include "snug/cuda/rope.cuh"
#include "snug/cuda/swiglu.cuh"
#include "snug/cuda/unscale.cuh"

#include <cstdint>

namespace step_kernels {

using snug::bfloat16;
namespace cuda = snug::cuda;

constexpr int B = 16, T = 1024, C = 768, NH = 12, V = 50257, Vp = 50304;
constexpr std::int64_t N = std::int64_t{B} * T;      // rows of activations
constexpr std::int64_t parameters = 124'475'904;     // GPT-2 124M with Vp rows of wte

// The address every tensor argument gets: aligned like cudaMalloc's, never read.
template <class X>
X* nowhere() {
    return reinterpret_cast<X*>(std::uintptr_t{1} << 32);
}

// Calls every launcher once per configuration of the step; note(call) names
// the launcher call before it runs (what the report's "call" column shows).
// dev.blas must be set (the step has one: it holds the partial sums of the
// bias gradients and of the norms' backward, and the norms' ticket counter).
void launch_step_kernels(const cuda::Device& dev, void (*note)(const char* call)) {
    bfloat16* x = nowhere<bfloat16>();
    float* f = nowhere<float>();
    const std::int32_t* tokens = nowhere<std::int32_t>();

    note("encoder_forward");
    cuda::encoder_forward(dev, x, tokens, x, x, B, T, C);
    note("encoder_backward");
    cuda::encoder_backward(dev, f, f, x, tokens, B, T, C);

    note("layernorm_forward");
    cuda::layernorm_forward(dev, x, f, f, x, x, x, N, C);
    note("residual_layernorm_forward");
    cuda::residual_layernorm_forward(dev, x, f, f, x, x, x, x, N, C);
    note("layernorm_backward");
    cuda::layernorm_backward(dev, x, f, f, x, x, x, f, f, N, C);

    // linear_forward / linear_backward around their GEMMs: the bias broadcast
    // (when cuBLASLt's epilogue does not add it) and the bias gradient.
    note("linear_forward (bias broadcast)");
    cuda::detail::broadcast_rows(dev, x, x, N, 3 * C);
    note("linear_backward (bias gradient)");
    cuda::detail::bias_grad_accumulate(dev, *dev.blas, f, x, N, 3 * C);

    note("flash_attention_forward hs 64");
    cuda::flash_attention_forward(dev, x, f, x, B, T, C, NH);
    note("flash_attention_backward hs 64");
    cuda::flash_attention_backward(dev, x, f, x, x, x, f, B, T, C, NH);
    note("flash_attention_forward hs 128");
    cuda::flash_attention_forward(dev, x, f, x, B, T, C, NH / 2);
    note("flash_attention_backward hs 128");
    cuda::flash_attention_backward(dev, x, f, x, x, x, f, B, T, C, NH / 2);
    note("flash_attention_forward fp32 hs 64");
    cuda::flash_attention_forward(dev, f, f, f, B, T, C, NH);
    note("flash_attention_backward fp32 hs 64");
    cuda::flash_attention_backward(dev, f, f, f, f, f, f, B, T, C, NH);
    note("attention_forward");
    cuda::attention_forward(dev, x, x, x, B, T, C, NH);
    note("attention_backward");
    cuda::attention_backward(dev, x, x, x, x, x, B, T, C, NH);

    note("gelu_forward");
    cuda::gelu_forward(dev, x, x, N * 4 * C);
    note("gelu_backward");
    cuda::gelu_backward(dev, x, x, x, N * 4 * C);
    note("add_inplace");
    cuda::add_inplace(dev, x, x, N * C);
    note("residual_forward");
    cuda::residual_forward(dev, x, x, x, N * C);
    note("scale_inplace fp32");
    cuda::scale_inplace(dev, f, parameters, 0.5f);
    note("cast fp32 <- bf16");
    cuda::cast(dev, f, x, parameters);

    note("softmax_cross_entropy");
    cuda::softmax_cross_entropy(dev, f, x, tokens, N, V, Vp, 1.0f / static_cast<float>(N));
    note("accumulate_sum");
    cuda::accumulate_sum(dev, nowhere<double>(), f, N);
    note("sum_squares");
    cuda::sum_squares(dev, f, f, parameters);
    note("unscale_and_check");
    cuda::unscale_and_check(dev, f, parameters, 1.0f / 65536.0f, f);

    note("adamw_update fp32 master, fp32 moments");
    cuda::adamw_update(dev, f, x, f, f, f, parameters, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.0f);
    note("adamw_update fp32 master, bf16 moments");
    cuda::adamw_update(dev, f, x, f, x, x, parameters, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.0f);
    note("adamw_update bf16 weights, bf16 moments");
    cuda::adamw_update(dev, x, nullptr, f, x, x, parameters, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.0f);
    note("adamw_update_8bit fp32 master");
    const snug::ops::BlockwiseMoments moments{nowhere<std::uint8_t>(), f, nowhere<std::uint8_t>(), f};
    cuda::adamw_update_8bit(dev, f, x, f, moments, parameters, 6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.0f);

    note("rmsnorm_forward");
    cuda::rmsnorm_forward(dev, x, f, x, x, N, C);
    note("rmsnorm_backward");
    cuda::rmsnorm_backward(dev, x, f, x, x, x, f, N, C);
    note("swiglu_forward");
    cuda::swiglu_forward(dev, x, x, N, 4 * C);
    note("swiglu_backward");
    cuda::swiglu_backward(dev, x, x, x, N, 4 * C);
    note("rope_forward");
    cuda::rope_forward(dev, x, x, B, T, NH, C / NH);
    note("rope_backward");
    cuda::rope_backward(dev, x, x, B, T, NH, C / NH);
}

}  // namespace step_kernels

#if defined(SNUG_CUDA_EMULATED)

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "snug/core/memory.hpp"

namespace {

const char* current_call = "";

void note(const char* call) { current_call = call; }

// One line per launch, tab-separated: call, mangled name, threads per block,
// dynamic shared bytes. The mangled name is the kernel's symbol in this
// executable (linked with -rdynamic), the same as nvcc's.
void print_launch(const snug::cuda::emulated::KernelLaunch& launch) {
    Dl_info info{};
    if (dladdr(launch.entry, &info) == 0 || info.dli_sname == nullptr) {
        std::fprintf(stderr, "no symbol for %.*s (link with -rdynamic)\n", static_cast<int>(launch.kernel.size()),
                     launch.kernel.data());
        std::exit(1);
    }
    const unsigned threads = launch.block.x * launch.block.y * launch.block.z;
    std::printf("%s\t%s\t%u\t%zu\n", current_call, info.dli_sname, threads, launch.dynamic_shared);
}

}  // namespace

// Arguments: none (an H200's limits), or the SM count and the bytes of
// shared memory a block may opt in to of the card to record launches for.
int main(int argc, char** argv) {
    try {
        if (argc == 3) {
            snug::cuda::emulated::set_device_limits(
                {std::atoi(argv[1]), static_cast<std::size_t>(std::strtoull(argv[2], nullptr, 10))});
        } else if (argc != 1) {
            std::fprintf(stderr, "usage: %s [SMS OPTIN_BYTES]\n", argv[0]);
            return 2;
        }
        snug::MemoryTracker tracker;
        snug::cuda::Blas blas(tracker);
        snug::cuda::Device dev;
        dev.blas = &blas;
        snug::cuda::emulated::set_launch_recorder(print_launch);
        step_kernels::launch_step_kernels(dev, note);
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "step_kernels: %s\n", e.what());
        return 1;
    }
}

#endif
