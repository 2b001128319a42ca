// The entry points of the emulator's shared-memory checker. Built with Clang's
// -fsanitize-coverage=func,trace-loads,trace-stores (CMake: SNUG_EMULATED_CHECKS),
// every load and store of the program calls __sanitizer_cov_loadN /
// __sanitizer_cov_storeN(address) first; those a kernel thread makes go to
// Block::note_shared_access (simt.hpp), which reports reads of shared memory
// no thread wrote and races between barriers, naming both source lines.
//
// The hooks must override the weak defaults of Clang's coverage runtime, so
// they are strong symbols; to keep this header includable from every
// translation unit they are emitted in COMDAT groups (one copy survives the
// link), as jumps to the C++ functions below. x86-64 only (as the fast fiber
// switch); elsewhere, and under GCC, the checker is off and shared_checks is
// false.
#pragma once

#include <cstddef>
#include <cstdint>

#include "snug/cuda/emulated/simt.hpp"

#if defined(__has_feature)
#if __has_feature(coverage_sanitizer) && defined(__x86_64__)
#define SNUG_EMULATED_SHARED_CHECKS 1
#endif
#endif

namespace snug::cuda::emulated {

// Whether this build checks shared memory (uninitialised reads, races).
inline constexpr bool shared_checks =
#if defined(SNUG_EMULATED_SHARED_CHECKS)
    true;
#else
    false;
#endif

namespace detail {
// An atomic read-modify-write of [p, p + n) by the running thread: the
// checker's view of it (instrumentation sees no atomics).
SNUG_EMULATED_UNTRACED inline void note_atomic(const void* p, std::size_t n, const void* pc);
}  // namespace detail

}  // namespace snug::cuda::emulated

#if !defined(SNUG_EMULATED_SHARED_CHECKS)
inline void snug::cuda::emulated::detail::note_atomic(const void*, std::size_t, const void*) {}
#else

namespace snug::cuda::emulated::detail {

SNUG_EMULATED_UNTRACED inline void on_access(const void* p, std::size_t n, bool write, bool atomic,
                                             const void* pc) {
    if (in_emulator) return;  // the emulator's own work, the checker's included
    // Set before any call: in an unoptimised build (a downstream Debug build)
    // nothing is inlined, so current(), EmulatorScope and the checker's own
    // functions are instrumented calls whose loads come straight back here;
    // the line above must already turn them away.
    in_emulator = true;
    struct Leave {
        SNUG_EMULATED_UNTRACED ~Leave() { in_emulator = false; }
    } const leave;
    Worker* w = tls_worker;
    if (w == nullptr) return;
    Thread* t = w->current();
    if (t == nullptr) return;
    w->block.note_shared_access(*t, p, n, write, atomic, pc);
}

inline void note_atomic(const void* p, std::size_t n, const void* pc) { on_access(p, n, true, true, pc); }

}  // namespace snug::cuda::emulated::detail

extern "C" {
// __builtin_return_address(0) is the instrumented load or store: the hooks
// reach these by a jump, not a call.
#define SNUG_EMULATED_HOOK(kind, bytes, write)                                                                  \
    [[gnu::used]] SNUG_EMULATED_UNTRACED inline void snug_emulated_cov_##kind##bytes(const void* p) {    \
        snug::cuda::emulated::detail::on_access(p, bytes, write, false, __builtin_return_address(0));                  \
    }
SNUG_EMULATED_HOOK(load, 1, false)
SNUG_EMULATED_HOOK(load, 2, false)
SNUG_EMULATED_HOOK(load, 4, false)
SNUG_EMULATED_HOOK(load, 8, false)
SNUG_EMULATED_HOOK(load, 16, false)
SNUG_EMULATED_HOOK(store, 1, true)
SNUG_EMULATED_HOOK(store, 2, true)
SNUG_EMULATED_HOOK(store, 4, true)
SNUG_EMULATED_HOOK(store, 8, true)
SNUG_EMULATED_HOOK(store, 16, true)
#undef SNUG_EMULATED_HOOK
}

#define SNUG_EMULATED_TRAMPOLINE(name)                                                  \
    ".pushsection .text.__sanitizer_cov_" #name ",\"axG\",@progbits,__sanitizer_cov_" #name ",comdat\n" \
    ".globl __sanitizer_cov_" #name "\n"                                                \
    ".type __sanitizer_cov_" #name ",@function\n"                                       \
    "__sanitizer_cov_" #name ":\n"                                                      \
    "    jmp snug_emulated_cov_" #name "@PLT\n"                                         \
    ".size __sanitizer_cov_" #name ", .-__sanitizer_cov_" #name "\n"                    \
    ".popsection\n"
asm(SNUG_EMULATED_TRAMPOLINE(load1) SNUG_EMULATED_TRAMPOLINE(load2) SNUG_EMULATED_TRAMPOLINE(load4)
        SNUG_EMULATED_TRAMPOLINE(load8) SNUG_EMULATED_TRAMPOLINE(load16) SNUG_EMULATED_TRAMPOLINE(store1)
            SNUG_EMULATED_TRAMPOLINE(store2) SNUG_EMULATED_TRAMPOLINE(store4) SNUG_EMULATED_TRAMPOLINE(store8)
                SNUG_EMULATED_TRAMPOLINE(store16));
#undef SNUG_EMULATED_TRAMPOLINE

#endif
