// Asynchronous copies from global to shared memory (cp.async, sm_80 and
// later): a thread issues copies of 4, 8 or 16 bytes that land in shared
// memory while it goes on computing, commits them as a group, and waits for
// all but the newest N groups before it reads them. Kernels use this to load
// the next tile while the tensor cores work on the current one.
//
//   cp_async<16>(dst, src, valid);  // dst in shared memory, both aligned to the size;
//                                   // valid == false fills dst with zeros and reads nothing
//   cp_async_commit();              // the copies issued since the last commit form a group
//   cp_async_wait<N>();             // all but the newest N committed groups have landed
//
// A wait covers only the calling thread's copies: a barrier after it makes
// them visible to the block. The device body is inline PTX; the emulated body
// reads the source at issue and writes shared memory only at the wait (so
// reading a tile before waiting for it reads stale bytes, as on a GPU), and
// reports a destination outside the block's shared memory or a misaligned
// address.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <source_location>
#include <string>

#include "snug/cuda/runtime.hpp"

namespace snug::cuda {

#if defined(SNUG_CUDA_EMULATED)

template <int Bytes>
SNUG_EMULATED_UNTRACED void cp_async(void* dst, const void* src, bool valid,
                                     std::source_location site = std::source_location::current()) {
    static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "cp.async copies 4, 8 or 16 bytes");
    using namespace emulated::detail;
    Thread& t = this_thread("cp.async");
    Block& block = this_block();
    const auto misaligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % Bytes != 0; };
    if (misaligned(dst) || (valid && misaligned(src)))
        block.fail(t, "cp.async of " + std::to_string(Bytes) + " bytes at " + str(site) +
                          ": an address not aligned to " + std::to_string(Bytes) + " bytes");
    if (!block.is_shared(dst, Bytes))
        block.fail(t, "cp.async at " + str(site) + ": the destination is not " + std::to_string(Bytes) +
                          " bytes of this block's shared memory");
    AsyncCopy copy;
    copy.dst = dst;
    copy.bytes = Bytes;
    copy.site = site;
    if (valid) std::memcpy(copy.data, src, Bytes);
    t.async_copies.push_back(copy);
}

SNUG_EMULATED_UNTRACED inline void cp_async_commit() {
    using namespace emulated::detail;
    Thread& t = this_thread("cp.async.commit_group");
    for (AsyncCopy& c : t.async_copies)
        if (c.group < 0) c.group = t.async_groups;
    ++t.async_groups;
}

template <int N>
SNUG_EMULATED_UNTRACED void cp_async_wait() {
    static_assert(N >= 0, "cp.async.wait_group takes the number of groups left in flight");
    using namespace emulated::detail;
    Thread& t = this_thread("cp.async.wait_group");
    Block& block = this_block();
    const int landed_below = t.async_groups - N;  // groups older than this have landed
    std::size_t kept = 0;
    for (std::size_t i = 0; i < t.async_copies.size(); ++i) {
        AsyncCopy& c = t.async_copies[i];
        if (c.group >= 0 && c.group < landed_below) {
            if constexpr (emulated::shared_checks)
                block.note_shared_access(t, c.dst, c.bytes, true, false, __builtin_return_address(0));
            // The copy is the emulator's, noted above at the wait's caller
            // (the checker sees memcpy whatever SNUG_EMULATED_UNTRACED says).
            const EmulatorScope emulator;
            std::memcpy(c.dst, c.data, c.bytes);
        } else {
            t.async_copies[kept++] = c;
        }
    }
    t.async_copies.resize(kept);
}

#else

template <int Bytes>
__device__ __forceinline__ void cp_async(void* dst, const void* src, bool valid) {
    static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "cp.async copies 4, 8 or 16 bytes");
    const auto address = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    const int src_bytes = valid ? Bytes : 0;  // 0: zero-fill, nothing read
    if constexpr (Bytes == 16) {  // .cg: through L2 only (the tile is read once per block)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(src), "r"(src_bytes)
                     : "memory");
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(address), "l"(src), "n"(Bytes),
                     "r"(src_bytes)
                     : "memory");
    }
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
    static_assert(N >= 0, "cp.async.wait_group takes the number of groups left in flight");
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

#endif

}  // namespace snug::cuda
