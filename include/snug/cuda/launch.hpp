// The one launch point of every snug kernel:
//
//     snug::cuda::launch<kernel>(grid, block, shared_bytes, stream, args...);
//
// It checks the configuration against the device's limits (snug/cuda/limits.hpp)
// and the kernel's dynamic shared memory limit, launches (`<<<>>>` under nvcc,
// the SIMT emulator in the emulated backend), and throws snug::CudaError
// naming the kernel and its configuration when the launch is refused or the
// emulator reports a fault. The kernel is a template argument so that its name
// comes from the compiler (kernel_name<kernel>()); the arguments convert to
// the kernel's parameter types as in a call. Nothing else in snug, and nothing
// a user's kernel needs, writes `<<<>>>`.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "snug/core/error.hpp"
#include "snug/cuda/check.hpp"
#include "snug/cuda/launch_observer.hpp"
#include "snug/cuda/limits.hpp"
#include "snug/cuda/runtime.hpp"

namespace snug::cuda {

namespace detail {

// What follows "NAME = " in the compiler's __PRETTY_FUNCTION__ of a template
// (GCC and nvcc: "[with auto kernel = ns::k<float>; ...]"; Clang:
// "[kernel = &ns::k<float>]"), without a leading '&'.
constexpr std::string_view template_argument(std::string_view pretty, std::string_view name) {
    std::size_t at = pretty.find(name);
    while (at != std::string_view::npos) {
        std::size_t i = at + name.size();
        while (i < pretty.size() && pretty[i] == ' ') ++i;
        if (i < pretty.size() && pretty[i] == '=') {
            ++i;
            while (i < pretty.size() && pretty[i] == ' ') ++i;
            if (i < pretty.size() && pretty[i] == '&') ++i;
            int depth = 0;
            std::size_t end = i;
            for (; end < pretty.size(); ++end) {
                const char c = pretty[end];
                if (c == '<' || c == '(' || c == '[') ++depth;
                if (c == '>' || c == ')') --depth;
                if (c == ']' && depth-- == 0) break;
                if (c == ';' && depth == 0) break;
            }
            return pretty.substr(i, end - i);
        }
        at = pretty.find(name, at + 1);
    }
    return pretty;
}

template <class F>
struct KernelParams;
template <class... P>
struct KernelParams<void (*)(P...)> {
    using type = std::tuple<P...>;
};

#if defined(SNUG_CUDA_EMULATED)
// Runs the kernel body for the emulated thread that is current. The kernel is
// called by name, not through std::apply: GCC instantiates a function template
// named only as a template argument when it is called so (GCC PR 53164).
template <auto kernel, class Params, std::size_t... I>
void call(const Params& params, std::index_sequence<I...>) {
    kernel(std::get<I>(params)...);
}

template <auto kernel, class Params>
void invoke(const void* params) {
    call<kernel>(*static_cast<const Params*>(params), std::make_index_sequence<std::tuple_size_v<Params>>{});
}
#endif

inline std::string launch_config(dim3 grid, dim3 block, std::size_t shared_bytes) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "grid (%u, %u, %u), block (%u, %u, %u), %zu bytes of dynamic shared memory", grid.x,
                  grid.y, grid.z, block.x, block.y, block.z, shared_bytes);
    return buf;
}

// Throws CudaError when the device would refuse the configuration.
inline void check_launch(std::string_view kernel, dim3 grid, dim3 block, std::size_t shared_bytes,
                         std::size_t max_dynamic_shared) {
    std::string why;
    const unsigned g[3] = {grid.x, grid.y, grid.z}, b[3] = {block.x, block.y, block.z};
    const char* axis[3] = {"x", "y", "z"};
    const unsigned long long threads = 1ULL * block.x * block.y * block.z;
    for (int i = 0; i < 3 && why.empty(); ++i) {
        if (g[i] == 0 || b[i] == 0)
            why = std::string("a ") + (g[i] == 0 ? "grid" : "block") + " dimension (" + axis[i] + ") is 0";
        else if (g[i] > LaunchLimits::max_grid_dim[i])
            why = std::string("grid ") + axis[i] + " = " + std::to_string(g[i]) + " is more than the device's " +
                  std::to_string(LaunchLimits::max_grid_dim[i]);
        else if (b[i] > LaunchLimits::max_block_dim[i])
            why = std::string("block ") + axis[i] + " = " + std::to_string(b[i]) + " is more than the device's " +
                  std::to_string(LaunchLimits::max_block_dim[i]);
    }
    if (why.empty() && threads > LaunchLimits::max_threads_per_block)
        why = std::to_string(threads) + " threads per block are more than the device's " +
              std::to_string(LaunchLimits::max_threads_per_block);
    if (why.empty() && shared_bytes > max_dynamic_shared)
        why = std::to_string(shared_bytes) + " bytes of dynamic shared memory are more than the kernel's limit of " +
              std::to_string(max_dynamic_shared) +
              " (raise it with cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes))";
    if (!why.empty())
        throw CudaError("launch of " + std::string(kernel) + " (" + launch_config(grid, block, shared_bytes) +
                        "): " + why);
}

}  // namespace detail

// The kernel's name as the compiler spells it, e.g.
// "snug::cuda::detail::layernorm_forward_kernel<float>".
template <auto kernel>
std::string_view kernel_name() {
    static const std::string_view name = detail::template_argument(__PRETTY_FUNCTION__, "kernel");
    return name;
}

// A type's name as the compiler spells it (for messages).
template <class T>
std::string_view type_name() {
    static const std::string_view name = detail::template_argument(__PRETTY_FUNCTION__, "T");
    return name;
}

// The dynamic shared memory `kernel` may use: 48 KiB, or what
// cudaFuncSetAttribute raised it to.
template <class F>
std::size_t max_dynamic_shared(F* kernel) {
#if defined(SNUG_CUDA_EMULATED)
    return emulated::max_dynamic_shared(reinterpret_cast<const void*>(kernel));
#else
    cudaFuncAttributes attributes{};
    check(cudaFuncGetAttributes(&attributes, kernel));
    return static_cast<std::size_t>(attributes.maxDynamicSharedSizeBytes);
#endif
}

// Launches kernel<<<grid, block, shared_bytes, stream>>>(args...) after
// checking the configuration; throws CudaError naming the kernel when the
// configuration is refused, the launch fails or (emulated) the kernel faults.
template <auto kernel, class... Args>
void launch(dim3 grid, dim3 block, std::size_t shared_bytes, cudaStream_t stream, Args&&... args) {
    const std::string_view name = kernel_name<kernel>();
    const std::size_t max_dynamic =
        shared_bytes > LaunchLimits::default_shared_bytes ? max_dynamic_shared(kernel) : LaunchLimits::default_shared_bytes;
    detail::check_launch(name, grid, block, shared_bytes, max_dynamic);
    cudaError_t status = cudaSuccess;
#if defined(SNUG_CUDA_EMULATED)
    // (Emulated work runs in order as it is queued, whatever the stream.)
    using Params = typename detail::KernelParams<decltype(kernel)>::type;
    const Params params(std::forward<Args>(args)...);
    emulated::KernelLaunch job;
    job.kernel = name;
    job.entry = reinterpret_cast<const void*>(kernel);
    job.grid = grid;
    job.block = block;
    job.dynamic_shared = shared_bytes;
    job.max_dynamic_shared = max_dynamic;
    job.invoke = &detail::invoke<kernel, Params>;
    job.params = &params;
    observed(stream, [&] { status = emulated::launch_kernel(job); });
#else
    observed(stream, [&] {
        kernel<<<grid, block, shared_bytes, stream>>>(std::forward<Args>(args)...);
        status = cudaGetLastError();
    });
#endif
    if (status != cudaSuccess)
        throw CudaError("launch of " + std::string(name) + " (" + detail::launch_config(grid, block, shared_bytes) +
                        "): " + detail::describe(status));
}

}  // namespace snug::cuda
