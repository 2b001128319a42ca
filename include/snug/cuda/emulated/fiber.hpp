// Fibers for the SIMT emulator: one stack and one saved register context per
// emulated CUDA thread, and the switch from one context to another (fiber to
// fiber, or to and from the worker thread that runs them). A fiber runs until
// it switches away itself (at a barrier, a warp collective, or when its kernel
// returns); nothing preempts it.
//
// x86-64 (System V) switches with a few instructions written here (the
// callee-saved registers and the stack pointer, about 25 ns); elsewhere POSIX
// ucontext serves (correct, but a signal-mask system call per switch makes it
// about 40 times slower). AddressSanitizer and ThreadSanitizer are told of
// every switch, so they check fiber stacks as they check thread stacks.
#pragma once

#include <pthread.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SNUG_EMULATED_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define SNUG_EMULATED_TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define SNUG_EMULATED_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define SNUG_EMULATED_TSAN 1
#endif
#if defined(SNUG_EMULATED_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if defined(SNUG_EMULATED_TSAN)
#include <sanitizer/tsan_interface.h>
#endif

#include "snug/core/error.hpp"

#if defined(__x86_64__)
// snug_emulated_fiber_swap(save, load): pushes the callee-saved registers,
// stores the stack pointer to *save, switches to the stack `load` and pops the
// registers saved there; returns on the new stack. snug_emulated_fiber_start
// is where a new fiber's first switch "returns" to: it calls entry(arg) with
// the two values a fresh stack holds in r13 and r12. Each sits in a COMDAT
// section, so every translation unit may include this header.
extern "C" void snug_emulated_fiber_swap(void** save, void* load);
extern "C" void snug_emulated_fiber_start();
asm(R"(
    .pushsection .text.snug_emulated_fiber_swap,"axG",@progbits,snug_emulated_fiber_swap,comdat
    .globl snug_emulated_fiber_swap
    .hidden snug_emulated_fiber_swap
    .type snug_emulated_fiber_swap,@function
    .p2align 4
snug_emulated_fiber_swap:
    .cfi_startproc
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .cfi_endproc
    .size snug_emulated_fiber_swap, .-snug_emulated_fiber_swap
    .popsection

    .pushsection .text.snug_emulated_fiber_start,"axG",@progbits,snug_emulated_fiber_start,comdat
    .globl snug_emulated_fiber_start
    .hidden snug_emulated_fiber_start
    .type snug_emulated_fiber_start,@function
    .p2align 4
snug_emulated_fiber_start:
    .cfi_startproc
    .cfi_undefined rip
    movq %r12, %rdi
    callq *%r13
    ud2
    .cfi_endproc
    .size snug_emulated_fiber_start, .-snug_emulated_fiber_start
    .popsection
)");
#endif

namespace snug::cuda::emulated::detail {

// A place execution can be switched to and from: a fiber, or the stack of the
// OS thread that runs fibers (Context::of_this_thread()).
class Context {
public:
    Context() = default;
    Context(const Context&) = delete;
    Context& operator=(const Context&) = delete;

    // The calling OS thread's own stack, to switch back to from its fibers.
    static void of_this_thread(Context& c) {
        pthread_attr_t attr;
        if (pthread_getattr_np(pthread_self(), &attr) == 0) {
            void* lo = nullptr;
            std::size_t size = 0;
            if (pthread_attr_getstack(&attr, &lo, &size) == 0) {
                c.stack_lo_ = static_cast<unsigned char*>(lo);
                c.stack_size_ = size;
            }
            pthread_attr_destroy(&attr);
        }
#if defined(SNUG_EMULATED_TSAN)
        c.tsan_fiber_ = __tsan_get_current_fiber();
#endif
    }

    // Suspends `from` (the context running now) and runs `to`; returns when
    // something switches back to `from`.
    static void switch_to(Context& from, Context& to) {
#if defined(SNUG_EMULATED_ASAN)
        void* fake_stack = nullptr;
        __sanitizer_start_switch_fiber(&fake_stack, to.stack_lo_, to.stack_size_);
#endif
#if defined(SNUG_EMULATED_TSAN)
        __tsan_switch_to_fiber(to.tsan_fiber_, 0);
#endif
#if defined(__x86_64__)
        snug_emulated_fiber_swap(&from.sp_, to.sp_);
#else
        swapcontext(&from.uc_, &to.uc_);
#endif
#if defined(SNUG_EMULATED_ASAN)
        __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
    }

protected:
    unsigned char* stack_lo_ = nullptr;
    std::size_t stack_size_ = 0;
#if defined(__x86_64__)
    void* sp_ = nullptr;
#else
    ucontext_t uc_{};
#endif
#if defined(SNUG_EMULATED_TSAN)
    void* tsan_fiber_ = nullptr;
#endif
};

// A fiber: a stack of its own (with an inaccessible guard page below it) on
// which entry(arg) runs once something switches to it. entry must never
// return (it switches away forever instead).
class Fiber : public Context {
public:
    using Entry = void (*)(void*);

    static constexpr std::size_t guard_bytes = 4096;

    Fiber(std::size_t stack_bytes, Entry entry, void* arg) : entry_(entry), arg_(arg) {
        size_ = (stack_bytes + guard_bytes - 1) / guard_bytes * guard_bytes + guard_bytes;
        void* p = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED)
            throw Error("emulated CUDA: cannot map a fiber stack of " + std::to_string(size_) +
                        " bytes: " + std::strerror(errno));
        memory_ = static_cast<unsigned char*>(p);
        (void)mprotect(memory_, guard_bytes, PROT_NONE);  // an overflow faults instead of corrupting
        stack_lo_ = memory_ + guard_bytes;
        stack_size_ = size_ - guard_bytes;
#if defined(SNUG_EMULATED_TSAN)
        tsan_fiber_ = __tsan_create_fiber(0);
#endif
        reset();
    }

    ~Fiber() {
#if defined(SNUG_EMULATED_TSAN)
        __tsan_destroy_fiber(tsan_fiber_);
#endif
        munmap(memory_, size_);
    }

    // Makes the next switch to this fiber start entry(arg) from the top of a
    // clean stack: what a fiber abandoned in the middle of its work needs.
    void reset() {
#if defined(SNUG_EMULATED_ASAN)
        // Frames abandoned mid-function leave their red zones poisoned.
        __asan_unpoison_memory_region(stack_lo_, stack_size_);
#endif
#if defined(__x86_64__)
        auto top = reinterpret_cast<std::uintptr_t>(stack_lo_ + stack_size_) & ~std::uintptr_t{15};
        auto* p = reinterpret_cast<std::uint64_t*>(top);
        // `ret` pops the start address, leaving the stack 16-byte aligned for
        // start's `call`, as the System V ABI wants before a call.
        *--p = 0;
        *--p = 0;
        *--p = reinterpret_cast<std::uint64_t>(&snug_emulated_fiber_start);  // popped by `ret`
        *--p = 0;                                                            // rbp
        *--p = 0;                                                            // rbx
        *--p = reinterpret_cast<std::uint64_t>(this);                        // r12: start's argument
        *--p = reinterpret_cast<std::uint64_t>(&Fiber::start);               // r13: start's function
        *--p = 0;                                                            // r14
        *--p = 0;                                                            // r15
        sp_ = p;
#else
        getcontext(&uc_);
        uc_.uc_stack.ss_sp = stack_lo_;
        uc_.uc_stack.ss_size = stack_size_;
        uc_.uc_link = nullptr;
        const auto bits = reinterpret_cast<std::uintptr_t>(this);
        makecontext(&uc_, reinterpret_cast<void (*)()>(&Fiber::start_ucontext), 2, static_cast<unsigned>(bits >> 32),
                    static_cast<unsigned>(bits & 0xFFFF'FFFFU));
#endif
    }

private:
    static void start(void* self) {
#if defined(SNUG_EMULATED_ASAN)
        __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
        auto* f = static_cast<Fiber*>(self);
        f->entry_(f->arg_);
        __builtin_trap();  // entry never returns
    }
#if !defined(__x86_64__)
    static void start_ucontext(unsigned hi, unsigned lo) {
        start(reinterpret_cast<void*>(static_cast<std::uintptr_t>(hi) << 32 | lo));
    }
#endif

    Entry entry_;
    void* arg_;
    unsigned char* memory_ = nullptr;
    std::size_t size_ = 0;
};

}  // namespace snug::cuda::emulated::detail
