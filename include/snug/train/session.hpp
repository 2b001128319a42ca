// The session: everything a model and a TrainStep are built against, wired in
// one place — the MemoryTracker (and its budget), the two activation arenas
// (activations; backward's temporaries), the cuBLASLt handle on CUDA, and
// the Context the layers get. Also which device a program runs on
// (choose_device) and the one switch from that run-time choice to a device
// type (visit_device), so that no program spells out #if SNUG_CUDA_BACKEND.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "snug/core/arena.hpp"
#include "snug/core/config.hpp"  // SNUG_CUDA_BACKEND, which the #if below read
#include "snug/core/device.hpp"
#include "snug/core/error.hpp"
#include "snug/core/memory_tracker.hpp"
#include "snug/nn/attention_kind.hpp"
#include "snug/nn/context.hpp"
#include "snug/train/device_info.hpp"
#include "snug/train/memory_plan.hpp"

#if defined(SNUG_CUDA_BACKEND)
#include "snug/cuda/blas.hpp"
#include "snug/cuda/check.hpp"
#include "snug/cuda/device.hpp"
#include "snug/cuda/fused_attention.hpp"
#include "snug/cuda/memory.hpp"
#endif

namespace snug {

// "cuda", "host" or "auto" (the GPU when this build has CUDA and one exists).
// "cuda" without a usable GPU throws NoCudaDevice; any other name ConfigError.
inline DeviceInfo choose_device(std::string_view wanted) {
    if (wanted != "cuda" && wanted != "host" && wanted != "auto")
        throw ConfigError("device '" + std::string(wanted) + "': expected cuda, host or auto");
    DeviceInfo device;
#if defined(SNUG_CUDA_BACKEND)
    if (wanted == "cuda") {
        cuda::require_device();
        device.cuda = true;
    } else if (wanted == "auto") {
        device.cuda = cuda::device_count() > 0;
    }
    if (device.cuda) {
        cudaDeviceProp prop{};
        cuda::check(cudaGetDeviceProperties(&prop, 0));
        device.name = prop.name;
        device.description = "cuda (" + device.name + ")";
    } else {
        device.description = wanted == "host" ? "host (as asked)" : "host (auto: no CUDA device found)";
    }
#else
    if (wanted == "cuda")
        throw NoCudaDevice("--device cuda: this program was built without CUDA (no nvcc at build time); "
                           "use --device host or auto");
    device.description = wanted == "host" ? "host (as asked)" : "host (auto: this build has no CUDA)";
#endif
    return device;
}

// Calls f.template operator()<Dev>() with snug::Cuda when `device` chose the
// GPU, else snug::Host.
template <class F>
auto visit_device([[maybe_unused]] const DeviceInfo& device, F&& f) {
#if defined(SNUG_CUDA_BACKEND)
    if (device.cuda) return f.template operator()<Cuda>();
#endif
    return f.template operator()<Host>();
}

// What the chosen device adds to a memory plan: on the GPU, cuBLASLt's
// workspace and the card's reservations (planner.hpp's cuda_reservation);
// nothing on the host.
inline PlanTarget plan_target([[maybe_unused]] const DeviceInfo& device) {
#if defined(SNUG_CUDA_BACKEND)
    if (device.cuda)
        return {cuda::Blas::workspace_bytes_for_current_device(), cuda_reservation, cuda::registered_fused_attention()};
#endif
    return {};
}

// The attention a run asks for (--attention), as the kind its model computes
// with: auto is cudnn where the run is on the GPU and this program registered
// cuDNN's engine (cuda/cudnn_attention.hpp), flash otherwise; cudnn where
// neither holds is refused, naming why. (A cudnn model takes the flash
// kernels for any call cuDNN does not take: fp32, or a shape it refuses;
// train() reports which path the training shape takes.)
inline AttentionKind resolve_attention(AttentionKind wanted, [[maybe_unused]] const DeviceInfo& device) {
    if (wanted != AttentionKind::automatic && wanted != AttentionKind::cudnn) return wanted;
    std::string why;
#if defined(SNUG_CUDA_BACKEND)
    if (!device.cuda)
        why = "cuDNN runs on the CUDA backend, and this run is on the host";
    else if (cuda::registered_fused_attention() == nullptr)
        why = "this program was built without cuDNN (CMake found no cuDNN 9 with its frontend: SNUG_WITH_CUDNN)";
#else
    why = "this program was built without CUDA";
#endif
    if (why.empty()) return AttentionKind::cudnn;
    if (wanted == AttentionKind::automatic) return AttentionKind::flash;
    throw ConfigError("--attention cudnn: " + why + "; use --attention auto or flash");
}

// The tracker, the arenas, the cuBLASLt context on CUDA, the Context layers get.
//   Dev: snug::Host or snug::Cuda
template <class Dev>
struct Session {
    MemoryTracker tracker;
#if defined(SNUG_CUDA_BACKEND)
    std::optional<cuda::Blas> blas;
#endif
    ActivationArena<Dev> activations;
    ActivationArena<Dev> scratch;
    Context<Dev> ctx;

    // budget: the tracker's byte limit (nullopt: none); over it, OutOfMemory.
    explicit Session(std::optional<std::size_t> budget)
        : tracker(budget),
          activations(tracker),
          scratch(tracker, ActivationArena<Dev>::default_chunk_bytes, MemoryCategory::temporaries),
          ctx{Dev{}, activations, scratch} {
#if defined(SNUG_CUDA_BACKEND)
        if constexpr (std::is_same_v<Dev, Cuda>) {
            driver_baseline = driver_used_bytes();  // the context exists; nothing of this session yet
            blas.emplace(tracker);
            ctx.device.blas = &*blas;
            ctx.device.fused = cuda::registered_fused_attention();
        }
#endif
    }

    // The device memory the driver reports in use (CUDA; 0 on the host).
    static std::size_t driver_used_bytes() {
#if defined(SNUG_CUDA_BACKEND)
        if constexpr (std::is_same_v<Dev, Cuda>) {
            cuda::check(cudaFree(nullptr));  // creates the context if it does not exist yet
            std::size_t free_bytes = 0, total_bytes = 0;
            cuda::check(cudaMemGetInfo(&free_bytes, &total_bytes));
            return total_bytes - free_bytes;
        }
#endif
        return 0;
    }
    // What the driver has given this session so far (CUDA; 0 on the host):
    // sampled after each update, and the arenas keep their chunks, so the
    // highest sample is the session's high-water mark as the driver sees it
    // (tracked bytes, arena chunk slack, cuBLASLt's own allocations).
    std::size_t driver_used_by_session() const {
        const std::size_t used = driver_used_bytes();
        return used > driver_baseline ? used - driver_baseline : 0;
    }
    std::size_t driver_baseline = 0;

    // The backend's own long-lived bytes (cuBLASLt's workspace on CUDA; none on the host).
    std::size_t backend_workspace() const {
#if defined(SNUG_CUDA_BACKEND)
        if constexpr (std::is_same_v<Dev, Cuda>) return blas->workspace_bytes();
#endif
        return 0;
    }
    // What this session's device adds to a memory plan (see plan_target).
    PlanTarget plan_target() const {
        if constexpr (std::is_same_v<Dev, Host>)
            return {};
        else
            return {backend_workspace(), cuda_reservation, ctx.device.fused};
    }
};

}  // namespace snug
