// Shared memory that both backends can check: block_shared<S>() for a kernel's
// static shared memory (one object of type S per block; a struct holding the
// kernel's arrays, CUTLASS's SharedStorage habit) and dynamic_shared<T>() for
// the bytes the launch asks for (dynamic_shared_bytes, on the host, raises a
// kernel's limit where a launch needs more than 48 KiB). On the device they are a __shared__ object
// and the extern __shared__ array; in the emulated backend a fresh
// allocation per block, filled with 0xFF bytes, exactly sized (so
// AddressSanitizer sees an access past its end) and watched by the
// shared-memory checker.
//
// Every call of block_shared<S>() in one kernel returns the same object,
// on the device as in emulation: give two arrays two types (a struct holding
// both); the emulator reports a kernel that calls it for one S at two places.
#pragma once

#include <cstddef>
#include <source_location>

#include "snug/cuda/runtime.hpp"
#include "snug/cuda/check.hpp"
#include "snug/cuda/launch.hpp"  // type_name
#include "snug/cuda/limits.hpp"

namespace snug::cuda {

#if defined(SNUG_CUDA_EMULATED)

template <class S>
S& block_shared(std::source_location site = std::source_location::current()) {
    static constexpr char key = 0;  // one address per S: the allocation's key
    emulated::detail::Thread& t = emulated::detail::this_thread("block_shared");
    return *static_cast<S*>(
        emulated::detail::this_block().static_shared(t, &key, sizeof(S), alignof(S), type_name<S>(), site));
}

template <class T>
T* dynamic_shared() {
    emulated::detail::Thread& t = emulated::detail::this_thread("dynamic_shared");
    return static_cast<T*>(emulated::detail::this_block().dynamic_shared(t));
}

#else

template <class S>
__device__ S& block_shared() {
    alignas(alignof(S) < 16 ? 16 : alignof(S)) __shared__ unsigned char storage[sizeof(S)];
    return *reinterpret_cast<S*>(storage);
}

template <class T>
__device__ T* dynamic_shared() {
    alignas(16) extern __shared__ unsigned char snug_dynamic_shared_bytes[];
    return reinterpret_cast<T*>(snug_dynamic_shared_bytes);
}

#endif

namespace detail {

// `bytes` of dynamic shared memory for `kernel`, raising the kernel's limit
// past the default 48 KiB when they need it (host side, before the launch).
template <class Kernel>
std::size_t dynamic_shared_bytes(Kernel kernel, std::size_t bytes) {
    if (bytes > LaunchLimits::default_shared_bytes) {
        check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    }
    return bytes;
}

}  // namespace detail

}  // namespace snug::cuda
