// The entry points of the emulator's shared-memory checker. Built with Clang's
// -fsanitize-coverage=func,trace-loads,trace-stores (CMake: SNUG_EMULATED_CHECKS),
// every load and store of the program calls __sanitizer_cov_loadN /
// __sanitizer_cov_storeN(address) first; those a kernel thread makes go to
// Block::note_shared_access (simt.hpp), which reports reads of shared memory
// no thread wrote and races between barriers, naming both source lines.
//
// Copies of memory (issue 39, hole 1): Clang compiles a struct assignment of
// 16 bytes or more (`s.rows[t] = in_row;`), std::memcpy / memmove / memset
// and zeroing a struct to the llvm.memcpy / memmove / memset intrinsics,
// which trace-loads,trace-stores does not see, and LLVM 19's
// SanitizerCoverage has no option that does. AddressSanitizer replaces every
// such intrinsic by a call to __asan_memcpy / __asan_memmove / __asan_memset,
// and -mllvm=-asan-memory-access-callback-prefix=snug_asan_ renames those
// calls to snug_asan_memcpy / ..., defined below: each tells the checker
// (source read, destination written, at the copy's line) and goes on to
// ASan's own function. So the checker needs ASan: snug_enable_emulated_checks
// (cmake/snugEmulatedChecks.cmake) adds both flags, a build that instruments
// loads and stores without ASan stops at the #error below, and one with ASan
// but without the prefix stops at start-up (detail::copies_reach_checker).
// The other alternatives fail: the copies cannot be turned back into loads
// and stores by any flag (the intrinsic is what the front end emits for an
// aggregate copy, and the backend expands it after all instrumentation),
// -fno-builtin does not touch them, a pass plugin needs LLVM's headers, and
// refusing struct copies of shared memory at compile time cannot be done from
// C++ (block_shared hands out a plain reference). The prefix also renames
// ASan's out-of-line checks, used in functions of more than 7000 accesses
// (-asan-instrumentation-with-call-threshold): they are defined below too,
// each a tail call of ASan's (the -asan-force-experiment variants are not).
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
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "snug/cuda/emulated/simt.hpp"

#if defined(__has_feature)
#if __has_feature(coverage_sanitizer) && defined(__x86_64__)
#define SNUG_EMULATED_SHARED_CHECKS 1
#if !__has_feature(address_sanitizer)
#error "snug's shared-memory checker sees struct copies (memcpy, memmove, memset) only through AddressSanitizer: \
compile with -fsanitize=address -mllvm=-asan-memory-access-callback-prefix=snug_asan_ too \
(CMake: snug_enable_emulated_checks, or -DSNUG_EMULATED_CHECKS=ON, adds them)"
#endif
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

// Copies the running thread makes through the snug_asan_ hooks below, on this
// OS thread (kernel or not): how copies_reach_checker sees that they arrive.
inline thread_local std::uint64_t copies_seen = 0;

// A copy of n bytes from src (nullptr: a memset) to dst, made by the call
// that returns to `ret`: the read, then the write, as the copy makes them.
// The code address named is one byte before `ret`, inside the call
// instruction, so that the symbolizer names the copy's own line (as
// sanitizers' stack traces do).
SNUG_EMULATED_UNTRACED inline void on_copy(void* dst, const void* src, std::size_t n, const void* ret) {
    ++copies_seen;
    if (n == 0) return;
    const void* pc = static_cast<const char*>(ret) - 1;
    if (src != nullptr) on_access(src, n, false, false, pc);
    on_access(dst, n, true, false, pc);
}

// Whether a copy compiled here reaches the checker; checked once at start-up,
// so that a build with ASan but without the callback prefix (where every
// struct copy would be invisible again) says so rather than report false
// uninitialised reads.
SNUG_EMULATED_UNTRACED inline bool copies_reach_checker() {
    static unsigned char from[32], to[32];
    volatile std::size_t n = sizeof from;  // not a constant: stays a memcpy at any optimisation level
    const std::uint64_t before = copies_seen;
    std::memcpy(to, from, n);
    // The hook call replaces the memcpy after optimisation: until then the
    // compiler holds that a memcpy leaves copies_seen alone, so re-read it.
    asm volatile("" ::: "memory");
    return copies_seen != before;
}

[[gnu::used]] inline const bool copies_checked = [] {
    if (!copies_reach_checker()) {
        std::fprintf(stderr,
                     "snug emulated CUDA: this build instruments loads and stores for the shared-memory checker but "
                     "not copies (struct assignments, memcpy): compile with "
                     "-mllvm=-asan-memory-access-callback-prefix=snug_asan_ as well (snug_enable_emulated_checks "
                     "does)\n");
        std::abort();
    }
    return true;
}();

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

// AddressSanitizer's runtime: what the snug_asan_ hooks go on to.
void* __asan_memcpy(void* dst, const void* src, std::size_t n);
void* __asan_memmove(void* dst, const void* src, std::size_t n);
void* __asan_memset(void* dst, int c, std::size_t n);

// Copies, renamed from ASan's by -asan-memory-access-callback-prefix.
[[gnu::used]] SNUG_EMULATED_UNTRACED inline void* snug_asan_memcpy(void* dst, const void* src, std::size_t n) {
    snug::cuda::emulated::detail::on_copy(dst, src, n, __builtin_return_address(0));
    [[clang::musttail]] return __asan_memcpy(dst, src, n);
}
[[gnu::used]] SNUG_EMULATED_UNTRACED inline void* snug_asan_memmove(void* dst, const void* src, std::size_t n) {
    snug::cuda::emulated::detail::on_copy(dst, src, n, __builtin_return_address(0));
    [[clang::musttail]] return __asan_memmove(dst, src, n);
}
[[gnu::used]] SNUG_EMULATED_UNTRACED inline void* snug_asan_memset(void* dst, int c, std::size_t n) {
    snug::cuda::emulated::detail::on_copy(dst, nullptr, n, __builtin_return_address(0));
    [[clang::musttail]] return __asan_memset(dst, c, n);
}

// ASan's out-of-line checks under the same prefix: straight on to ASan's.
#define SNUG_EMULATED_ASAN_CHECK(name)                                                                       \
    void __asan_##name(std::uintptr_t p);                                                                    \
    [[gnu::used]] SNUG_EMULATED_UNTRACED inline void snug_asan_##name(std::uintptr_t p) {                    \
        [[clang::musttail]] return __asan_##name(p);                                                          \
    }
#define SNUG_EMULATED_ASAN_CHECK_N(name)                                                                     \
    void __asan_##name(std::uintptr_t p, std::uintptr_t n);                                                  \
    [[gnu::used]] SNUG_EMULATED_UNTRACED inline void snug_asan_##name(std::uintptr_t p, std::uintptr_t n) {  \
        [[clang::musttail]] return __asan_##name(p, n);                                                       \
    }
#define SNUG_EMULATED_ASAN_CHECKS(suffix)                                                                    \
    SNUG_EMULATED_ASAN_CHECK(load1##suffix) SNUG_EMULATED_ASAN_CHECK(load2##suffix)                          \
    SNUG_EMULATED_ASAN_CHECK(load4##suffix) SNUG_EMULATED_ASAN_CHECK(load8##suffix)                          \
    SNUG_EMULATED_ASAN_CHECK(load16##suffix) SNUG_EMULATED_ASAN_CHECK_N(loadN##suffix)                       \
    SNUG_EMULATED_ASAN_CHECK(store1##suffix) SNUG_EMULATED_ASAN_CHECK(store2##suffix)                        \
    SNUG_EMULATED_ASAN_CHECK(store4##suffix) SNUG_EMULATED_ASAN_CHECK(store8##suffix)                        \
    SNUG_EMULATED_ASAN_CHECK(store16##suffix) SNUG_EMULATED_ASAN_CHECK_N(storeN##suffix)
SNUG_EMULATED_ASAN_CHECKS()
SNUG_EMULATED_ASAN_CHECKS(_noabort)
#undef SNUG_EMULATED_ASAN_CHECKS
#undef SNUG_EMULATED_ASAN_CHECK_N
#undef SNUG_EMULATED_ASAN_CHECK
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
