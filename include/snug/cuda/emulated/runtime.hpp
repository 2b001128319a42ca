// The CUDA runtime API of the emulated backend: the part of
// cuda_runtime_api.h that snug and its users call, on host memory.
//
// - Device memory is plain host memory (aligned to 256 bytes like cudaMalloc's,
//   exactly the size asked for, so AddressSanitizer sees every access past an
//   end) and starts filled with 0xFF bytes (NaN in every float type), so that
//   reading what was never written shows. Copies and memsets check that their
//   device side lies inside one allocation, and fail with
//   cudaErrorInvalidValue otherwise.
// - Work runs when it is queued: every stream is in order because everything
//   is; events record the host's clock. Kernels run on the SIMT machine
//   (simt.hpp) of one emulated device with H200 limits.
// - Errors follow CUDA's rules: a failed call sets the calling thread's last
//   error (cudaGetLastError returns and clears it); a fault inside a kernel is
//   sticky (every later call returns cudaErrorLaunchFailure, and its
//   cudaGetErrorString names the kernel, block, thread and fault) until
//   cudaDeviceReset, which also frees all device memory, as CUDA's does.
// Enumerators carry CUDA 13's numbers.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <stdexcept>
#include <string>

#include "snug/cuda/emulated/simt.hpp"

#define CUDART_VERSION 13000

enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInsufficientDriver = 35,
    cudaErrorInvalidDeviceFunction = 98,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorLaunchFailure = 719,
    cudaErrorNotSupported = 801,
    cudaErrorUnknown = 999,
};
using cudaError_t = cudaError;

enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};

enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1,
    cudaDevAttrMaxBlockDimX = 2,
    cudaDevAttrMaxBlockDimY = 3,
    cudaDevAttrMaxBlockDimZ = 4,
    cudaDevAttrMaxGridDimX = 5,
    cudaDevAttrMaxGridDimY = 6,
    cudaDevAttrMaxGridDimZ = 7,
    cudaDevAttrMaxSharedMemoryPerBlock = 8,
    cudaDevAttrWarpSize = 10,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrL2CacheSize = 38,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};

enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
    cudaFuncAttributePreferredSharedMemoryCarveout = 9,
};

struct cudaFuncAttributes {
    std::size_t sharedSizeBytes = 0;
    std::size_t constSizeBytes = 0;
    std::size_t localSizeBytes = 0;
    int maxThreadsPerBlock = 0;
    int numRegs = 0;
    int ptxVersion = 0;
    int binaryVersion = 0;
    int cacheModeCA = 0;
    int maxDynamicSharedSizeBytes = 0;
    int preferredShmemCarveout = -1;
};

struct cudaDeviceProp {
    char name[256] = {};
    std::size_t totalGlobalMem = 0;
    std::size_t sharedMemPerBlock = 0;
    int warpSize = 0;
    int maxThreadsPerBlock = 0;
    int maxThreadsDim[3] = {};
    int maxGridSize[3] = {};
    int major = 0;
    int minor = 0;
    int multiProcessorCount = 0;
    int l2CacheSize = 0;
    std::size_t sharedMemPerBlockOptin = 0;
};

struct CUstream_st {
    unsigned flags = 0;
};
using cudaStream_t = CUstream_st*;
struct CUevent_st {
    unsigned flags = 0;
    bool recorded = false;
    std::chrono::steady_clock::time_point when{};
};
using cudaEvent_t = CUevent_st*;

inline constexpr unsigned cudaStreamDefault = 0x00;
inline constexpr unsigned cudaStreamNonBlocking = 0x01;
inline const cudaStream_t cudaStreamLegacy = reinterpret_cast<cudaStream_t>(0x1);
inline const cudaStream_t cudaStreamPerThread = reinterpret_cast<cudaStream_t>(0x2);
inline constexpr unsigned cudaEventDefault = 0x00;
inline constexpr unsigned cudaEventBlockingSync = 0x01;
inline constexpr unsigned cudaEventDisableTiming = 0x02;
inline constexpr unsigned cudaHostAllocDefault = 0x00;
inline constexpr unsigned cudaHostAllocPortable = 0x01;
inline constexpr unsigned cudaHostAllocMapped = 0x02;
inline constexpr unsigned cudaHostAllocWriteCombined = 0x04;

namespace snug::cuda::emulated {

// A launch recorder: while one is set (set_launch_recorder), launch_kernel
// hands each launch that passes its checks to it instead of running it, so the
// kernel never runs and its arguments are never read. For tools that want what
// the launchers launch at sizes too large to emulate
// (benchmarks/static/step_kernels.cu).
using LaunchRecorder = void (*)(const KernelLaunch& launch);

// The emulated device's limits that a tool or test may set to another card's
// (set_device_limits): its SM count and the shared memory a block may opt in
// to, as cudaDeviceGetAttribute and cudaGetDeviceProperties report them and
// cudaFuncSetAttribute enforces them. The defaults are an H200's
// (EmulatedDevice); {82, 99 KiB} is an RTX 3090 (sm_86), so launchers that
// size their launches by device_facts() choose as they would on one.
struct DeviceLimits {
    int multiprocessors = EmulatedDevice::multiprocessors;
    std::size_t shared_per_block_optin = EmulatedDevice::shared_per_block_optin;
};

namespace detail {

// Everything the emulated device holds: its memory, the kernels' attributes,
// the streams and events in existence, and a sticky error.
struct DeviceState {
    std::mutex mutex;
    std::map<std::uintptr_t, std::size_t> device;  // allocation start -> bytes
    std::map<std::uintptr_t, std::size_t> pinned;  // page-locked host allocations
    std::size_t allocated = 0;
    std::map<const void*, int> max_dynamic_shared;  // kernel -> raised limit
    std::set<cudaStream_t> streams;
    std::set<cudaEvent_t> events;
    cudaError_t sticky = cudaSuccess;
    std::string sticky_message;
    LaunchRecorder recorder = nullptr;
    DeviceLimits limits;
};

inline DeviceState& state() {
    static DeviceState s;
    return s;
}

inline thread_local cudaError_t last_error = cudaSuccess;

inline cudaError_t record(cudaError_t status) {
    if (status != cudaSuccess) last_error = status;
    return status;
}

// The sticky error, if any (callers hold the mutex).
inline cudaError_t sticky_locked() { return state().sticky; }

inline cudaError_t sticky() {
    std::lock_guard lock(state().mutex);
    return state().sticky;
}

inline LaunchRecorder launch_recorder() {
    std::lock_guard lock(state().mutex);
    return state().recorder;
}

inline void* allocate_aligned(std::size_t bytes) {
    return ::operator new(bytes, std::align_val_t{256}, std::nothrow);
}
inline void free_aligned(void* p) { ::operator delete(p, std::align_val_t{256}); }

// Whether [p, p + bytes) lies inside one device allocation (caller holds the mutex).
inline bool inside_device_locked(const void* p, std::size_t bytes) {
    const auto& device = state().device;
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = device.upper_bound(a);
    if (it == device.begin()) return false;
    --it;
    return a >= it->first && a - it->first <= it->second && bytes <= it->second - (a - it->first);
}

inline bool is_device_locked(const void* p) {
    const auto& device = state().device;
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = device.upper_bound(a);
    if (it == device.begin()) return false;
    --it;
    return a - it->first < std::max<std::size_t>(it->second, 1);
}

inline bool valid_stream_locked(cudaStream_t s) {
    return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread || state().streams.contains(s);
}

}  // namespace detail

// The limit on a kernel's dynamic shared memory: 48 KiB unless raised with
// cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize).
inline std::size_t max_dynamic_shared(const void* kernel) {
    std::lock_guard lock(detail::state().mutex);
    const auto& m = detail::state().max_dynamic_shared;
    const auto it = m.find(kernel);
    return it == m.end() ? EmulatedDevice::shared_per_block : static_cast<std::size_t>(it->second);
}

// The device's limits now (DeviceLimits).
inline DeviceLimits device_limits() {
    std::lock_guard lock(detail::state().mutex);
    return detail::state().limits;
}

// Sets the device's limits; DeviceLimits{} restores an H200's. The opt-in
// shared memory must lie between the 48 KiB every kernel gets and the 227 KiB
// the emulator allocates (else std::invalid_argument), the SM count be positive.
inline void set_device_limits(const DeviceLimits& limits) {
    if (limits.multiprocessors <= 0 || limits.shared_per_block_optin < EmulatedDevice::shared_per_block ||
        limits.shared_per_block_optin > EmulatedDevice::shared_per_block_optin)
        throw std::invalid_argument("set_device_limits: " + std::to_string(limits.multiprocessors) + " SMs and " +
                                    std::to_string(limits.shared_per_block_optin) +
                                    " bytes of opt-in shared memory per block; the SMs must be positive and the bytes "
                                    "within [49152, 232448]");
    std::lock_guard lock(detail::state().mutex);
    detail::state().limits = limits;
}

// Sets the launch recorder (LaunchRecorder); nullptr runs kernels again.
inline void set_launch_recorder(LaunchRecorder recorder) {
    std::lock_guard lock(detail::state().mutex);
    detail::state().recorder = recorder;
}

// Runs a kernel launch (snug::cuda::launch comes here), or hands it to the
// launch recorder if one is set. Returns the sticky error if one is set;
// cudaErrorInvalidValue for more dynamic shared memory than the kernel
// allows; cudaErrorLaunchFailure (sticky, with the fault's report as its
// cudaGetErrorString) when the kernel faults.
inline cudaError_t launch_kernel(const KernelLaunch& launch) {
    if (const cudaError_t s = detail::sticky(); s != cudaSuccess) return detail::record(s);
    if (launch.grid.x == 0 || launch.grid.y == 0 || launch.grid.z == 0 || launch.block.x == 0 ||
        launch.block.y == 0 || launch.block.z == 0)
        return detail::record(cudaErrorInvalidConfiguration);
    if (launch.dynamic_shared > launch.max_dynamic_shared) return detail::record(cudaErrorInvalidValue);
    if (const LaunchRecorder recorder = detail::launch_recorder()) {
        recorder(launch);
        return cudaSuccess;
    }
    if (std::optional<Fault> fault = run(launch)) {
        std::lock_guard lock(detail::state().mutex);
        detail::state().sticky = cudaErrorLaunchFailure;
        detail::state().sticky_message = "unspecified launch failure: " + fault->message;
        return detail::record(cudaErrorLaunchFailure);
    }
    return cudaSuccess;
}

}  // namespace snug::cuda::emulated

// ---- errors ---------------------------------------------------------------------------

inline const char* cudaGetErrorName(cudaError_t e) {
    switch (e) {
        case cudaSuccess: return "cudaSuccess";
        case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
        case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
        case cudaErrorInitializationError: return "cudaErrorInitializationError";
        case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
        case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
        case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
        case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
        case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
        case cudaErrorNoDevice: return "cudaErrorNoDevice";
        case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
        case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
        case cudaErrorNotReady: return "cudaErrorNotReady";
        case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
        case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
        case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
        case cudaErrorNotSupported: return "cudaErrorNotSupported";
        case cudaErrorUnknown: return "cudaErrorUnknown";
    }
    return "unrecognized error code";
}

inline const char* cudaGetErrorString(cudaError_t e) {
    using snug::cuda::emulated::detail::state;
    switch (e) {
        case cudaSuccess: return "no error";
        case cudaErrorInvalidValue: return "invalid argument";
        case cudaErrorMemoryAllocation: return "out of memory";
        case cudaErrorInitializationError: return "initialization error";
        case cudaErrorInvalidConfiguration: return "invalid configuration argument";
        case cudaErrorInvalidDevicePointer: return "invalid device pointer";
        case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
        case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
        case cudaErrorInvalidDeviceFunction: return "invalid device function";
        case cudaErrorNoDevice: return "no CUDA-capable device is detected";
        case cudaErrorInvalidDevice: return "invalid device ordinal";
        case cudaErrorInvalidResourceHandle: return "invalid resource handle";
        case cudaErrorNotReady: return "device not ready";
        case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
        case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
        case cudaErrorLaunchFailure: {
            std::lock_guard lock(state().mutex);
            if (state().sticky == cudaErrorLaunchFailure) return state().sticky_message.c_str();
            return "unspecified launch failure";
        }
        case cudaErrorNotSupported: return "operation not supported";
        case cudaErrorUnknown: return "unknown error";
    }
    return "unrecognized error code";
}

inline cudaError_t cudaGetLastError() {
    using namespace snug::cuda::emulated::detail;
    if (const cudaError_t s = sticky(); s != cudaSuccess) return s;
    const cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

inline cudaError_t cudaPeekAtLastError() {
    using namespace snug::cuda::emulated::detail;
    if (const cudaError_t s = sticky(); s != cudaSuccess) return s;
    return last_error;
}

// ---- the device -------------------------------------------------------------------------

inline cudaError_t cudaGetDeviceCount(int* count) {
    if (count == nullptr) return snug::cuda::emulated::detail::record(cudaErrorInvalidValue);
    *count = 1;
    return cudaSuccess;
}

inline cudaError_t cudaGetDevice(int* device) {
    if (device == nullptr) return snug::cuda::emulated::detail::record(cudaErrorInvalidValue);
    *device = 0;
    return cudaSuccess;
}

inline cudaError_t cudaSetDevice(int device) {
    return device == 0 ? cudaSuccess : snug::cuda::emulated::detail::record(cudaErrorInvalidDevice);
}

inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
    using snug::cuda::emulated::EmulatedDevice;
    using snug::cuda::emulated::detail::record;
    if (value == nullptr) return record(cudaErrorInvalidValue);
    if (device != 0) return record(cudaErrorInvalidDevice);
    switch (attr) {
        case cudaDevAttrMaxThreadsPerBlock: *value = EmulatedDevice::max_threads_per_block; break;
        case cudaDevAttrMaxBlockDimX: *value = EmulatedDevice::max_block_dim[0]; break;
        case cudaDevAttrMaxBlockDimY: *value = EmulatedDevice::max_block_dim[1]; break;
        case cudaDevAttrMaxBlockDimZ: *value = EmulatedDevice::max_block_dim[2]; break;
        case cudaDevAttrMaxGridDimX: *value = static_cast<int>(EmulatedDevice::max_grid_dim[0]); break;
        case cudaDevAttrMaxGridDimY: *value = EmulatedDevice::max_grid_dim[1]; break;
        case cudaDevAttrMaxGridDimZ: *value = EmulatedDevice::max_grid_dim[2]; break;
        case cudaDevAttrMaxSharedMemoryPerBlock: *value = EmulatedDevice::shared_per_block; break;
        case cudaDevAttrWarpSize: *value = EmulatedDevice::warp_size; break;
        case cudaDevAttrMultiProcessorCount: *value = snug::cuda::emulated::device_limits().multiprocessors; break;
        case cudaDevAttrL2CacheSize: *value = EmulatedDevice::l2_cache; break;
        case cudaDevAttrComputeCapabilityMajor: *value = EmulatedDevice::compute_major; break;
        case cudaDevAttrComputeCapabilityMinor: *value = EmulatedDevice::compute_minor; break;
        case cudaDevAttrMaxSharedMemoryPerBlockOptin:
            *value = static_cast<int>(snug::cuda::emulated::device_limits().shared_per_block_optin);
            break;
        default: return record(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
    using snug::cuda::emulated::EmulatedDevice;
    using snug::cuda::emulated::detail::record;
    if (prop == nullptr) return record(cudaErrorInvalidValue);
    if (device != 0) return record(cudaErrorInvalidDevice);
    *prop = cudaDeviceProp{};
    std::strncpy(prop->name, EmulatedDevice::name, sizeof(prop->name) - 1);
    prop->totalGlobalMem = EmulatedDevice::global_memory;
    prop->sharedMemPerBlock = EmulatedDevice::shared_per_block;
    const snug::cuda::emulated::DeviceLimits limits = snug::cuda::emulated::device_limits();
    prop->sharedMemPerBlockOptin = limits.shared_per_block_optin;
    prop->warpSize = EmulatedDevice::warp_size;
    prop->maxThreadsPerBlock = EmulatedDevice::max_threads_per_block;
    for (int i = 0; i < 3; ++i) {
        prop->maxThreadsDim[i] = static_cast<int>(EmulatedDevice::max_block_dim[i]);
        prop->maxGridSize[i] = static_cast<int>(EmulatedDevice::max_grid_dim[i]);
    }
    prop->major = EmulatedDevice::compute_major;
    prop->minor = EmulatedDevice::compute_minor;
    prop->multiProcessorCount = limits.multiprocessors;
    prop->l2CacheSize = static_cast<int>(EmulatedDevice::l2_cache);
    return cudaSuccess;
}

inline cudaError_t cudaDriverGetVersion(int* version) {
    if (version == nullptr) return snug::cuda::emulated::detail::record(cudaErrorInvalidValue);
    *version = CUDART_VERSION;
    return cudaSuccess;
}

inline cudaError_t cudaRuntimeGetVersion(int* version) {
    if (version == nullptr) return snug::cuda::emulated::detail::record(cudaErrorInvalidValue);
    *version = CUDART_VERSION;
    return cudaSuccess;
}

inline cudaError_t cudaDeviceSynchronize() {
    using namespace snug::cuda::emulated::detail;
    return record(sticky());
}

// Frees all device memory and forgets the kernels' attributes, the streams,
// the events and the sticky error, as destroying CUDA's primary context does.
inline cudaError_t cudaDeviceReset() {
    using namespace snug::cuda::emulated::detail;
    std::lock_guard lock(state().mutex);
    for (const auto& [start, bytes] : state().device) free_aligned(reinterpret_cast<void*>(start));
    state().device.clear();
    state().allocated = 0;
    state().max_dynamic_shared.clear();
    for (cudaStream_t s : state().streams) delete s;
    state().streams.clear();
    for (cudaEvent_t e : state().events) delete e;
    state().events.clear();
    state().sticky = cudaSuccess;
    state().sticky_message.clear();
    last_error = cudaSuccess;
    return cudaSuccess;
}

inline cudaError_t cudaMemGetInfo(std::size_t* free, std::size_t* total) {
    using namespace snug::cuda::emulated::detail;
    if (free == nullptr || total == nullptr) return record(cudaErrorInvalidValue);
    std::lock_guard lock(state().mutex);
    if (state().sticky != cudaSuccess) return record(state().sticky);
    *total = snug::cuda::emulated::EmulatedDevice::global_memory;
    *free = *total - state().allocated;
    return cudaSuccess;
}

// ---- memory -------------------------------------------------------------------------------

inline cudaError_t cudaMalloc(void** ptr, std::size_t bytes) {
    using namespace snug::cuda::emulated::detail;
    if (ptr == nullptr) return record(cudaErrorInvalidValue);
    *ptr = nullptr;
    std::lock_guard lock(state().mutex);
    if (state().sticky != cudaSuccess) return record(state().sticky);
    if (bytes == 0) return cudaSuccess;
    if (bytes > snug::cuda::emulated::EmulatedDevice::global_memory - state().allocated)
        return record(cudaErrorMemoryAllocation);
    void* p = allocate_aligned(bytes);
    if (p == nullptr) return record(cudaErrorMemoryAllocation);
    std::memset(p, 0xFF, bytes);
    state().device.emplace(reinterpret_cast<std::uintptr_t>(p), bytes);
    state().allocated += bytes;
    *ptr = p;
    return cudaSuccess;
}

template <class T>
cudaError_t cudaMalloc(T** ptr, std::size_t bytes) {
    return cudaMalloc(reinterpret_cast<void**>(ptr), bytes);
}

inline cudaError_t cudaFree(void* ptr) {
    using namespace snug::cuda::emulated::detail;
    if (ptr == nullptr) return cudaSuccess;
    std::lock_guard lock(state().mutex);
    if (state().sticky != cudaSuccess) return record(state().sticky);
    const auto it = state().device.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == state().device.end()) return record(cudaErrorInvalidValue);
    state().allocated -= it->second;
    state().device.erase(it);
    free_aligned(ptr);
    return cudaSuccess;
}

inline cudaError_t cudaMallocAsync(void** ptr, std::size_t bytes, cudaStream_t) { return cudaMalloc(ptr, bytes); }

template <class T>
cudaError_t cudaMallocAsync(T** ptr, std::size_t bytes, cudaStream_t stream) {
    return cudaMallocAsync(reinterpret_cast<void**>(ptr), bytes, stream);
}

inline cudaError_t cudaFreeAsync(void* ptr, cudaStream_t) { return cudaFree(ptr); }

inline cudaError_t cudaHostAlloc(void** ptr, std::size_t bytes, unsigned) {
    using namespace snug::cuda::emulated::detail;
    if (ptr == nullptr) return record(cudaErrorInvalidValue);
    *ptr = nullptr;
    if (bytes == 0) return cudaSuccess;
    void* p = allocate_aligned(bytes);
    if (p == nullptr) return record(cudaErrorMemoryAllocation);
    std::lock_guard lock(state().mutex);
    state().pinned.emplace(reinterpret_cast<std::uintptr_t>(p), bytes);
    *ptr = p;
    return cudaSuccess;
}

inline cudaError_t cudaMallocHost(void** ptr, std::size_t bytes) { return cudaHostAlloc(ptr, bytes, 0); }

template <class T>
cudaError_t cudaMallocHost(T** ptr, std::size_t bytes) {
    return cudaMallocHost(reinterpret_cast<void**>(ptr), bytes);
}

inline cudaError_t cudaFreeHost(void* ptr) {
    using namespace snug::cuda::emulated::detail;
    if (ptr == nullptr) return cudaSuccess;
    std::lock_guard lock(state().mutex);
    const auto it = state().pinned.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == state().pinned.end()) return record(cudaErrorInvalidValue);
    state().pinned.erase(it);
    free_aligned(ptr);
    return cudaSuccess;
}

inline cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
    using namespace snug::cuda::emulated::detail;
    std::lock_guard lock(state().mutex);
    if (state().sticky != cudaSuccess) return record(state().sticky);
    if (bytes == 0) return cudaSuccess;
    if (dst == nullptr || src == nullptr) return record(cudaErrorInvalidValue);
    bool dst_device = false, src_device = false;
    switch (kind) {
        case cudaMemcpyHostToHost: break;
        case cudaMemcpyHostToDevice: dst_device = true; break;
        case cudaMemcpyDeviceToHost: src_device = true; break;
        case cudaMemcpyDeviceToDevice: dst_device = src_device = true; break;
        case cudaMemcpyDefault:
            dst_device = is_device_locked(dst);
            src_device = is_device_locked(src);
            break;
        default: return record(cudaErrorInvalidMemcpyDirection);
    }
    if ((dst_device && !inside_device_locked(dst, bytes)) || (src_device && !inside_device_locked(src, bytes)))
        return record(cudaErrorInvalidValue);
    std::memmove(dst, src, bytes);
    return cudaSuccess;
}

inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind,
                                   cudaStream_t stream = nullptr) {
    using namespace snug::cuda::emulated::detail;
    {
        std::lock_guard lock(state().mutex);
        if (!valid_stream_locked(stream)) return record(cudaErrorInvalidResourceHandle);
    }
    return cudaMemcpy(dst, src, bytes, kind);
}

inline cudaError_t cudaMemset(void* dst, int value, std::size_t bytes) {
    using namespace snug::cuda::emulated::detail;
    std::lock_guard lock(state().mutex);
    if (state().sticky != cudaSuccess) return record(state().sticky);
    if (bytes == 0) return cudaSuccess;
    if (!inside_device_locked(dst, bytes)) return record(cudaErrorInvalidValue);
    std::memset(dst, value, bytes);
    return cudaSuccess;
}

inline cudaError_t cudaMemsetAsync(void* dst, int value, std::size_t bytes, cudaStream_t stream = nullptr) {
    using namespace snug::cuda::emulated::detail;
    {
        std::lock_guard lock(state().mutex);
        if (!valid_stream_locked(stream)) return record(cudaErrorInvalidResourceHandle);
    }
    return cudaMemset(dst, value, bytes);
}

// ---- streams and events ---------------------------------------------------------------------

inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
    using namespace snug::cuda::emulated::detail;
    if (stream == nullptr) return record(cudaErrorInvalidValue);
    std::lock_guard lock(state().mutex);
    if (state().sticky != cudaSuccess) return record(state().sticky);
    *stream = new CUstream_st{flags};
    state().streams.insert(*stream);
    return cudaSuccess;
}

inline cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

inline cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    using namespace snug::cuda::emulated::detail;
    std::lock_guard lock(state().mutex);
    if (state().streams.erase(stream) == 0) return record(cudaErrorInvalidResourceHandle);
    delete stream;
    return cudaSuccess;
}

inline cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    using namespace snug::cuda::emulated::detail;
    std::lock_guard lock(state().mutex);
    if (state().sticky != cudaSuccess) return record(state().sticky);
    return valid_stream_locked(stream) ? cudaSuccess : record(cudaErrorInvalidResourceHandle);
}

inline cudaError_t cudaStreamQuery(cudaStream_t stream) { return cudaStreamSynchronize(stream); }

inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
    using namespace snug::cuda::emulated::detail;
    if (event == nullptr) return record(cudaErrorInvalidValue);
    std::lock_guard lock(state().mutex);
    if (state().sticky != cudaSuccess) return record(state().sticky);
    *event = new CUevent_st{flags, false, {}};
    state().events.insert(*event);
    return cudaSuccess;
}

inline cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

inline cudaError_t cudaEventDestroy(cudaEvent_t event) {
    using namespace snug::cuda::emulated::detail;
    std::lock_guard lock(state().mutex);
    if (state().events.erase(event) == 0) return record(cudaErrorInvalidResourceHandle);
    delete event;
    return cudaSuccess;
}

inline cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr) {
    using namespace snug::cuda::emulated::detail;
    std::lock_guard lock(state().mutex);
    if (state().sticky != cudaSuccess) return record(state().sticky);
    if (!state().events.contains(event) || !valid_stream_locked(stream)) return record(cudaErrorInvalidResourceHandle);
    event->recorded = true;
    event->when = std::chrono::steady_clock::now();
    return cudaSuccess;
}

inline cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    using namespace snug::cuda::emulated::detail;
    std::lock_guard lock(state().mutex);
    if (state().sticky != cudaSuccess) return record(state().sticky);
    return state().events.contains(event) ? cudaSuccess : record(cudaErrorInvalidResourceHandle);
}

inline cudaError_t cudaEventQuery(cudaEvent_t event) { return cudaEventSynchronize(event); }

inline cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned = 0) {
    using namespace snug::cuda::emulated::detail;
    std::lock_guard lock(state().mutex);
    if (state().sticky != cudaSuccess) return record(state().sticky);
    if (!valid_stream_locked(stream) || !state().events.contains(event)) return record(cudaErrorInvalidResourceHandle);
    return cudaSuccess;
}

// Milliseconds between two recorded events.
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
    using namespace snug::cuda::emulated::detail;
    if (ms == nullptr) return record(cudaErrorInvalidValue);
    std::lock_guard lock(state().mutex);
    if (state().sticky != cudaSuccess) return record(state().sticky);
    if (!state().events.contains(start) || !state().events.contains(end)) return record(cudaErrorInvalidResourceHandle);
    if ((start->flags | end->flags) & cudaEventDisableTiming) return record(cudaErrorInvalidResourceHandle);
    if (!start->recorded || !end->recorded) return record(cudaErrorInvalidResourceHandle);
    *ms = std::chrono::duration<float, std::milli>(end->when - start->when).count();
    return cudaSuccess;
}

// ---- kernel attributes ------------------------------------------------------------------------

template <class F>
cudaError_t cudaFuncSetAttribute(F* kernel, cudaFuncAttribute attr, int value) {
    using namespace snug::cuda::emulated::detail;
    std::lock_guard lock(state().mutex);
    if (state().sticky != cudaSuccess) return record(state().sticky);
    if (kernel == nullptr) return record(cudaErrorInvalidDeviceFunction);
    if (attr == cudaFuncAttributePreferredSharedMemoryCarveout) return cudaSuccess;
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
        static_cast<std::size_t>(value) > state().limits.shared_per_block_optin)
        return record(cudaErrorInvalidValue);
    state().max_dynamic_shared[reinterpret_cast<const void*>(kernel)] = value;
    return cudaSuccess;
}

template <class F>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, F* kernel) {
    using namespace snug::cuda::emulated::detail;
    if (attr == nullptr || kernel == nullptr) return record(cudaErrorInvalidValue);
    *attr = cudaFuncAttributes{};
    attr->maxThreadsPerBlock = snug::cuda::emulated::EmulatedDevice::max_threads_per_block;
    attr->maxDynamicSharedSizeBytes =
        static_cast<int>(snug::cuda::emulated::max_dynamic_shared(reinterpret_cast<const void*>(kernel)));
    return cudaSuccess;
}
