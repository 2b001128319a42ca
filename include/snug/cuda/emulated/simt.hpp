// The SIMT machine of the emulated CUDA backend: how a kernel launch runs on
// the CPU, and the faults it catches.
//
// A launch runs its blocks on worker threads (the launching thread and a pool,
// one per core); a worker runs one block at a time, each CUDA thread of it on
// a fiber of its own (fiber.hpp), starting with thread 0 and switching at
// barriers, at warp collectives and when a thread's kernel returns. Threads of
// a block therefore interleave at every synchronisation point, as on a GPU,
// and blocks run concurrently with each other.
//
// A warp is 32 consecutive threads of a block (linear index x + y Dx + z Dx Dy).
// Warp collectives (__shfl_*_sync, votes, __syncwarp, and snug's tensor-core
// fragments) follow sm_70+ semantics: they complete once every lane named in
// the mask has arrived with the same mask and operation, whatever its call site.
// Block barriers complete once every thread of the block has arrived; a
// thread that exits while others wait at one, or a barrier reached after
// some thread exited, is a fault (below).
//
// Faults, each reported with the kernel, block and thread, abort the launch
// and leave a sticky error (cudaErrorLaunchFailure; cudaDeviceReset clears it):
//   - a barrier reached at different call sites, or not by every thread
//     (the others wait elsewhere, have exited, or the block can make no
//     progress);
//   - a warp collective whose mask leaves out the calling lane, names a lane
//     that exited or never arrives, or whose lanes disagree on the operation;
//   - a shuffle reading a lane outside its mask, or a width that is not a
//     power of two up to 32;
//   - shared memory over the device's limits, or one block_shared<S>() type
//     claimed at two places of a kernel (on the device they share one object);
//   - with the shared-memory checker (shared_check.hpp): a read of shared
//     memory no thread wrote, and races between barriers (by loads and
//     stores, and by copies: struct assignments, memcpy, memset).
// Shared memory from block_shared / dynamic_shared is a fresh allocation per
// block, filled with 0xFF bytes (NaN in every float type), so that a kernel
// reading what it never wrote computes NaN, and AddressSanitizer sees any
// access beyond its end.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <source_location>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "snug/cuda/emulated/fiber.hpp"
#include "snug/cuda/emulated/types.hpp"
#include "snug/cuda/limits.hpp"

// SNUG_EMULATED_UNTRACED keeps a function's loads and stores out of the
// shared-memory checker's instrumentation (shared_check.hpp): for the
// emulator's own accesses made on a thread's behalf. Its copies (memcpy,
// memset, struct assignments) still reach the checker, through
// AddressSanitizer's hooks: make those inside an EmulatorScope. Only Clang
// instruments; elsewhere it is empty.
#if defined(__clang__)
#define SNUG_EMULATED_UNTRACED [[clang::no_sanitize("coverage")]]
#else
#define SNUG_EMULATED_UNTRACED
#endif

namespace snug::cuda::emulated {

// The emulated device: H200-like limits, so that launches a Hopper GPU would
// refuse are refused here too.
struct EmulatedDevice {
    static constexpr const char* name = "snug emulated GPU (H200 limits)";
    static constexpr int compute_major = 9;
    static constexpr int compute_minor = 0;
    static constexpr int multiprocessors = 132;
    static constexpr int warp_size = 32;
    static constexpr unsigned max_threads_per_block = LaunchLimits::max_threads_per_block;
    static constexpr const unsigned (&max_block_dim)[3] = LaunchLimits::max_block_dim;
    static constexpr const unsigned (&max_grid_dim)[3] = LaunchLimits::max_grid_dim;
    // Shared memory a block may use without (and with) opting in through
    // cudaFuncAttributeMaxDynamicSharedMemorySize; static shared memory alone
    // is limited to the first figure.
    static constexpr std::size_t shared_per_block = LaunchLimits::default_shared_bytes;
    static constexpr std::size_t shared_per_block_optin = std::size_t{227} << 10;
    static constexpr std::size_t global_memory = std::size_t{143771} << 20;  // what an H200 reports
    static constexpr std::size_t l2_cache = std::size_t{50} << 20;
};

// Built-in variables. Set by the worker before it resumes a fiber, so each
// emulated thread reads its own; one worker never moves a block's fibers to
// another OS thread.
inline thread_local uint3 threadIdx{0, 0, 0};
inline thread_local uint3 blockIdx{0, 0, 0};
inline thread_local dim3 blockDim{1, 1, 1};
inline thread_local dim3 gridDim{1, 1, 1};

// One kernel launch as the emulator receives it (from snug::cuda::launch).
struct KernelLaunch {
    std::string_view kernel;                 // the kernel's name, for messages
    const void* entry = nullptr;             // the kernel function (its attributes)
    dim3 grid, block;
    std::size_t dynamic_shared = 0;          // bytes
    std::size_t max_dynamic_shared = 0;      // the kernel's limit (48 KiB unless raised)
    void (*invoke)(const void* params) = nullptr;  // runs the kernel body for the current thread
    const void* params = nullptr;
};

// The first fault of a launch: the block it happened in (linear index) and
// the whole report.
struct Fault {
    std::uint64_t block = 0;
    std::string message;
};

namespace detail {

inline std::string str(uint3 v) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "(%u, %u, %u)", v.x, v.y, v.z);
    return buf;
}

inline std::string str(const std::source_location& s) {
    std::string file = s.file_name();
    if (auto slash = file.find_last_of('/'); slash != std::string::npos) file.erase(0, slash + 1);
    return file + ":" + std::to_string(s.line()) + ":" + std::to_string(s.column());
}

inline std::string hex(unsigned v) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "0x%08x", v);
    return buf;
}

inline bool same_site(const std::source_location& a, const std::source_location& b) {
    return a.line() == b.line() && a.column() == b.column() &&
           (a.file_name() == b.file_name() || std::strcmp(a.file_name(), b.file_name()) == 0);
}

enum class Wait : std::uint8_t { ready, running, barrier, collective, exited };

enum class BarrierKind : std::uint8_t { sync, count, all, any };

// Why a barrier that some of a block's threads skip by exiting is a fault.
inline constexpr const char* partial_barrier_rule =
    "a barrier must be reached by every thread of the block (CUDA allows __syncthreads() in conditional code only "
    "where the condition is the same across the whole block)";

inline const char* barrier_name(BarrierKind k) {
    switch (k) {
        case BarrierKind::sync: return "__syncthreads";
        case BarrierKind::count: return "__syncthreads_count";
        case BarrierKind::all: return "__syncthreads_and";
        case BarrierKind::any: return "__syncthreads_or";
    }
    return "barrier";
}

class Block;
struct Thread;

// Completes a warp collective: called once every lane of `mask` has arrived,
// with the warp's 32 threads (nullptr past the end of the block); writes each
// lane's `result` (or what its `out` points to).
using CollectiveFn = void (*)(Block& block, Thread* const* lanes, unsigned mask);

// What a lane brings to a warp collective.
struct CollectiveCall {
    CollectiveFn complete = nullptr;
    const char* name = "";      // e.g. "__shfl_xor_sync", for messages
    unsigned mask = 0;
    std::uint64_t value = 0;    // the lane's operand, bit for bit
    int arg = 0;                // source lane, delta or lane mask
    int width = 32;             // shuffle segment width
    const void* in = nullptr;   // larger operands (fragments)
    void* out = nullptr;
};

// A cp.async (cuda/async_copy.hpp) a thread issued and has not waited for:
// the bytes it read (zeros for a zero-fill), where they land in shared
// memory, and its commit group (-1 until committed). They land only at the
// thread's cp.async.wait_group, so code that reads a tile before waiting for
// it reads stale bytes here, as it may on a GPU.
struct AsyncCopy {
    void* dst = nullptr;
    std::size_t bytes = 0;
    unsigned char data[16] = {};
    int group = -1;
    std::source_location site;  // where it was issued (the checker names it)
};

// An emulated CUDA thread.
struct Thread {
    uint3 idx{0, 0, 0};
    unsigned linear = 0, warp = 0, lane = 0;
    Wait wait = Wait::ready;
    std::source_location site;  // where it waits
    BarrierKind barrier = BarrierKind::sync;
    int predicate = 0;
    CollectiveCall call;
    std::uint64_t result = 0;
    std::vector<AsyncCopy> async_copies;  // in flight, oldest first
    int async_groups = 0;                 // cp.async groups committed so far
};

// A collective some lanes of a warp wait in.
struct PendingCollective {
    unsigned mask = 0;
    unsigned arrived = 0;
    CollectiveFn complete = nullptr;
};

struct Warp {
    unsigned live = 0;              // lanes that have not exited
    std::uint32_t generation = 0;   // collectives completed so far
    std::vector<unsigned> masks;    // the lanes of each completed collective, by generation (for the checker)
    std::vector<PendingCollective> pending;

    // Whether a collective completed since generation g named both lanes a
    // and b: only then does it order what one did before it against what the
    // other does after (the lanes of __syncwarp(0x0000ffff) are not ordered
    // against those of __syncwarp(0xffff0000)).
    bool synced_since(std::uint32_t g, unsigned a, unsigned b) const {
        const unsigned both = (1U << a) | (1U << b);
        for (std::uint32_t k = g; k < generation; ++k)
            if ((masks[k] & both) == both) return true;
        return false;
    }
};

// Shared memory of one block: what block_shared<S>() (keyed by S) and the
// launch's dynamic size asked for.
struct SharedAllocation;

// What the shared-memory checker (shared_check.hpp) knows of one byte: the
// last write, and the reads since it, each with the thread, the barrier
// interval (Block::barrier_epoch) and its warp's collective count
// (Warp::generation), and the code address that made it.
struct ShadowByte {
    static constexpr std::uint16_t none = 0xFFFF;
    static constexpr std::uint16_t many = 0xFFFE;
    std::uint16_t writer = none;
    std::uint16_t reader = none;       // one thread, or many
    std::uint16_t reader_warp = none;  // their warp, or many
    bool write_atomic = false;
    std::uint32_t write_epoch = 0, write_gen = 0;
    std::uint32_t read_epoch = 0, read_gen = 0;
    const void* write_pc = nullptr;
    const void* read_pc = nullptr;
};

struct SharedAllocation {
    const void* key = nullptr;  // nullptr: the dynamic allocation
    std::string_view type;
    std::source_location site;  // where block_shared was first called (per thread: see Block::static_shared)
    unsigned char* data = nullptr;
    std::size_t bytes = 0;
    std::vector<ShadowByte> shadow;  // the checker's, made on its first access

    bool contains(const void* p, std::size_t n) const {
        const auto a = reinterpret_cast<std::uintptr_t>(p), lo = reinterpret_cast<std::uintptr_t>(data);
        return a >= lo && a - lo <= bytes && n <= bytes - (a - lo);
    }
    std::string name() const {
        return key == nullptr ? std::string("dynamic shared memory")
                              : "block_shared<" + std::string(type) + "> (" + str(site) + ")";
    }
};

class Worker;

// Thrown inside a fiber by Block::fail; caught where the fiber runs the kernel.
struct KernelFault {};

// True while the emulator works on a thread's behalf (its bookkeeping, or
// the shared-memory checker itself): the checker ignores the loads and
// stores made meanwhile.
inline thread_local bool in_emulator = false;

// Sets in_emulator for a scope (nests).
class EmulatorScope {
public:
    EmulatorScope() : was_(in_emulator) { in_emulator = true; }
    ~EmulatorScope() { in_emulator = was_; }
    EmulatorScope(const EmulatorScope&) = delete;
    EmulatorScope& operator=(const EmulatorScope&) = delete;

private:
    bool was_;
};

// One block in flight on a worker.
class Block {
public:
    const KernelLaunch* launch = nullptr;
    std::uint64_t linear = 0;
    uint3 idx{0, 0, 0};
    std::vector<Thread> threads;
    std::vector<Warp> warps;
    std::vector<unsigned> ready;  // FIFO: ready[head..]
    std::size_t head = 0;
    unsigned live = 0;
    unsigned barrier_arrived = 0;
    BarrierKind barrier_kind = BarrierKind::sync;
    std::source_location barrier_site;
    std::uint32_t barrier_epoch = 0;  // barriers completed so far
    std::vector<SharedAllocation> shared;
    std::size_t static_shared_bytes = 0;
    std::optional<std::string> fault;  // the first fault, with its thread
    Worker* worker = nullptr;

    Block() = default;
    Block(const Block&) = delete;
    Block& operator=(const Block&) = delete;
    ~Block() { release_shared(); }

    void release_shared() {
        for (SharedAllocation& a : shared) ::operator delete[](a.data, std::align_val_t{16});
        shared.clear();
        static_shared_bytes = 0;
    }

    // Records a fault of thread t (the first one wins) and stops the block.
    [[noreturn]] void fail(Thread& t, std::string message);

    // The report a fault carries: "kernel K, block (..), thread (..): message".
    std::string where(const Thread& t) const {
        return "kernel " + std::string(launch->kernel) + ", block " + str(idx) + ", thread " + str(t.idx) +
               " (warp " + std::to_string(t.warp) + ", lane " + std::to_string(t.lane) + ")";
    }

    void make_ready(Thread& t) {
        t.wait = Wait::ready;
        ready.push_back(t.linear);
    }

    // __syncthreads and its reductions, from thread t's fiber.
    int barrier(Thread& t, BarrierKind kind, int predicate, const std::source_location& site);

    // A warp collective from lane t; returns t.result once it completes.
    std::uint64_t collective(Thread& t, const CollectiveCall& call, const std::source_location& site);

    // Thread t's kernel returned.
    void exit(Thread& t);

    // Shared memory: block_shared<S>() and dynamic_shared<T>().
    void* static_shared(Thread& t, const void* key, std::size_t bytes, std::size_t align, std::string_view type,
                        const std::source_location& site);
    void* dynamic_shared(Thread& t);

    // Whether [p, p + n) lies inside one of this block's shared allocations.
    bool is_shared(const void* p, std::size_t n) const {
        for (const SharedAllocation& a : shared)
            if (a.contains(p, n)) return true;
        return false;
    }

    // The shared-memory checker: thread t reads or writes [p, p + n) from the
    // code at pc. Faults (through fail) on a read of bytes no thread wrote, and
    // on a race: two threads' accesses to one byte, one of them a write, with no
    // barrier between them (nor, within a warp, a warp collective); two
    // atomics do not race. Bytes outside shared memory are not its concern.
    void note_shared_access(Thread& t, const void* p, std::size_t n, bool write, bool atomic, const void* pc);
    void note_shared_read(Thread& t, const void* p, std::size_t n) {
        note_shared_access(t, p, n, false, false, __builtin_return_address(0));
    }

    // Called by the worker when no thread is ready but some are alive: the
    // block can make no progress; says why.
    std::string diagnose_stall();

private:
    void complete_barrier();
    void yield(Thread& t);
    std::string waits_at(const Thread& t) const {
        switch (t.wait) {
            case Wait::barrier: return std::string("waits at ") + barrier_name(t.barrier) + " (" + str(t.site) + ")";
            case Wait::collective: return std::string("waits at ") + t.call.name + " (" + str(t.site) + ", mask " +
                                          hex(t.call.mask) + ")";
            case Wait::exited: return "has exited";
            default: return "is running";
        }
    }
};

// The per-OS-thread state of the emulator: the fibers (one per thread of the
// largest block so far), the block they run, and this thread's own stack to
// come back to.
class Worker {
public:
    // 256 KiB of address space per fiber; only the pages a thread touches are
    // ever backed by memory.
    static constexpr std::size_t stack_bytes = std::size_t{256} << 10;

    Block block;

    Worker() {
        block.worker = this;
        Context::of_this_thread(home_);
    }

    // Runs block `linear` of `launch` to the end or to its first fault.
    std::optional<std::string> run(const KernelLaunch& launch, std::uint64_t linear);

    Thread* current() const { return current_; }

    // From the fiber of `from`, which has just blocked, exited or faulted:
    // runs the next ready thread (straight from fiber to fiber), or goes
    // back to the worker's own stack when none is ready or the block failed.
    // Returns when `from` runs again.
    void dispatch(Thread& from) {
        Thread* next = block.fault ? nullptr : next_ready();
        if (next == &from) {
            from.wait = Wait::running;
            return;
        }
        // in_emulator belongs to the running thread: each fiber keeps its own
        // across a switch (a fresh one starts without).
        const bool was_in_emulator = in_emulator;
        in_emulator = false;
        Context& here = *slots_[from.linear]->fiber;
        if (next == nullptr) {
            Context::switch_to(here, home_);
        } else {
            enter(*next);
            Context::switch_to(here, *slots_[next->linear]->fiber);
        }
        in_emulator = was_in_emulator;
    }

private:
    struct Slot {
        Worker* worker = nullptr;
        unsigned index = 0;
        std::unique_ptr<Fiber> fiber;
    };

    static void fiber_main(void* arg) {
        auto* slot = static_cast<Slot*>(arg);
        Worker& w = *slot->worker;
        for (;;) {
            Thread& t = w.block.threads[slot->index];
            try {
                w.block.launch->invoke(w.block.launch->params);
                w.block.exit(t);
            } catch (const KernelFault&) {
                // block.fault holds the report; dispatch goes back to the worker.
            }
            w.dispatch(t);
        }
    }

    Thread* next_ready() {
        Block& b = block;
        if (b.head == b.ready.size()) return nullptr;
        Thread* t = &b.threads[b.ready[b.head++]];
        if (b.head == b.ready.size()) {
            b.ready.clear();
            b.head = 0;
        }
        return t;
    }

    // Makes t the running thread (its built-in variables too).
    void enter(Thread& t) {
        t.wait = Wait::running;
        current_ = &t;
        threadIdx = t.idx;
    }

    void ensure_fibers(unsigned n) {
        while (slots_.size() < n) {
            auto slot = std::make_unique<Slot>();
            slot->worker = this;
            slot->index = static_cast<unsigned>(slots_.size());
            slot->fiber = std::make_unique<Fiber>(stack_bytes, &Worker::fiber_main, slot.get());
            slots_.push_back(std::move(slot));
        }
    }

    std::vector<std::unique_ptr<Slot>> slots_;
    Context home_;
    Thread* current_ = nullptr;
};

inline thread_local Worker* tls_worker = nullptr;


inline Worker& this_worker() {
    thread_local Worker worker;
    tls_worker = &worker;
    return worker;
}

// The thread whose fiber is running on this OS thread. Device-side functions
// (barriers, shuffles, shared memory) are only meaningful inside a kernel.
inline Thread& this_thread(const char* what) {
    Thread* t = tls_worker != nullptr ? tls_worker->current() : nullptr;
    if (t == nullptr) {
        std::fprintf(stderr, "snug emulated CUDA: %s called outside a kernel\n", what);
        std::abort();
    }
    return *t;
}

inline Block& this_block() { return tls_worker->block; }

// ---- Block ----------------------------------------------------------------------

inline void Block::yield(Thread& t) { worker->dispatch(t); }

inline void Block::fail(Thread& t, std::string message) {
    if (!fault) fault = where(t) + ": " + std::move(message);
    // Unwinds the running fiber (t's, or that of the lane completing a
    // collective t is part of) to Worker::fiber_main, destroying what its
    // frames hold; the worker then abandons the block.
    throw KernelFault{};
}

inline void Block::complete_barrier() {
    int count = 0;
    for (Thread& w : threads)
        if (w.wait == Wait::barrier) count += w.predicate != 0;
    const int all = count == static_cast<int>(barrier_arrived);
    for (Thread& w : threads) {
        if (w.wait != Wait::barrier) continue;
        switch (barrier_kind) {
            case BarrierKind::sync: w.result = 0; break;
            case BarrierKind::count: w.result = static_cast<std::uint64_t>(count); break;
            case BarrierKind::all: w.result = static_cast<std::uint64_t>(all); break;
            case BarrierKind::any: w.result = static_cast<std::uint64_t>(count > 0); break;
        }
        make_ready(w);
    }
    barrier_arrived = 0;
    ++barrier_epoch;
}

inline int Block::barrier(Thread& t, BarrierKind kind, int predicate, const std::source_location& site) {
    const EmulatorScope scope;
    if (barrier_arrived > 0 && (kind != barrier_kind || !same_site(site, barrier_site))) {
        const Thread* first = nullptr;
        for (const Thread& w : threads)
            if (w.wait == Wait::barrier) {
                first = &w;
                break;
            }
        fail(t, std::string(barrier_name(kind)) + " at " + str(site) + " while thread " + str(first->idx) + " " +
                    waits_at(*first) + ": a block's threads must reach the same barrier");
    }
    if (live < threads.size()) {
        // A barrier in conditional code whose condition differs across the
        // block: the Programming Guide allows __syncthreads() there only when
        // the whole block takes the same branch. (A GPU may let the exited
        // threads count as arrived, and may hang or corrupt later barriers.)
        const Thread* gone = nullptr;
        for (const Thread& w : threads)
            if (w.wait == Wait::exited) {
                gone = &w;
                break;
            }
        fail(t, std::string(barrier_name(kind)) + " at " + str(site) + " while thread " + str(gone->idx) +
                    " has exited: " + partial_barrier_rule);
    }
    if (barrier_arrived == 0) {
        barrier_kind = kind;
        barrier_site = site;
    }
    t.wait = Wait::barrier;
    t.barrier = kind;
    t.site = site;
    t.predicate = predicate;
    if (++barrier_arrived == live) complete_barrier();
    yield(t);
    return static_cast<int>(t.result);
}

inline std::uint64_t Block::collective(Thread& t, const CollectiveCall& call, const std::source_location& site) {
    const EmulatorScope scope;
    const unsigned bit = 1U << t.lane;
    if ((call.mask & bit) == 0)
        fail(t, std::string(call.name) + " at " + str(site) + " with mask " + hex(call.mask) +
                    ", which does not name the calling lane " + std::to_string(t.lane));
    Warp& w = warps[t.warp];
    const unsigned outside = call.mask & ~w.live;
    if (outside != 0) {
        const auto lane = static_cast<unsigned>(std::countr_zero(outside));
        const bool past_end = t.warp * 32 + lane >= threads.size();
        fail(t, std::string(call.name) + " at " + str(site) + " with mask " + hex(call.mask) + " names lane " +
                    std::to_string(lane) + (past_end ? ", which does not exist (the block ends before it)"
                                                     : ", which has exited"));
    }
    t.wait = Wait::collective;
    t.site = site;
    t.call = call;
    PendingCollective* group = nullptr;
    for (PendingCollective& p : w.pending)
        if (p.mask == call.mask) group = &p;
    if (group == nullptr) {
        w.pending.push_back(PendingCollective{call.mask, 0, call.complete});
        group = &w.pending.back();
    } else if (group->complete != call.complete) {
        const unsigned other = static_cast<unsigned>(std::countr_zero(group->arrived));
        const Thread& o = threads[t.warp * 32 + other];
        fail(t, std::string(call.name) + " at " + str(site) + " with mask " + hex(call.mask) + " while lane " +
                    std::to_string(other) + " " + waits_at(o) + ": the lanes of one mask must run the same collective");
    }
    group->arrived |= bit;
    if (group->arrived == group->mask) {
        const unsigned mask = group->mask;
        const CollectiveFn complete = group->complete;
        w.pending.erase(w.pending.begin() + (group - w.pending.data()));
        Thread* lanes[32] = {};
        for (unsigned l = 0; l < 32; ++l) {
            const std::size_t i = std::size_t{t.warp} * 32 + l;
            if (i < threads.size()) lanes[l] = &threads[i];
        }
        complete(*this, lanes, mask);
        w.masks.push_back(mask);
        ++w.generation;
        for (unsigned l = 0; l < 32; ++l)
            if ((mask >> l & 1U) != 0) make_ready(*lanes[l]);
    }
    yield(t);
    return t.result;
}

inline void Block::exit(Thread& t) {
    const EmulatorScope scope;
    t.wait = Wait::exited;
    --live;
    Warp& w = warps[t.warp];
    w.live &= ~(1U << t.lane);
    for (const PendingCollective& p : w.pending) {
        if ((p.mask >> t.lane & 1U) == 0) continue;
        const unsigned other = static_cast<unsigned>(std::countr_zero(p.arrived));
        const Thread& o = threads[t.warp * 32 + other];
        fault = where(t) + ": exited while lane " + std::to_string(other) + " " + waits_at(o) +
                ", whose mask names this lane";
        return;
    }
    if (barrier_arrived > 0) {
        const Thread* first = nullptr;
        for (const Thread& w : threads)
            if (w.wait == Wait::barrier) {
                first = &w;
                break;
            }
        fault = where(t) + ": exited while thread " + str(first->idx) + " " + waits_at(*first) + ": " +
                partial_barrier_rule;
    }
}

SNUG_EMULATED_UNTRACED inline void* Block::static_shared(Thread& t, const void* key, std::size_t bytes, std::size_t align,
                                  std::string_view type_view, const std::source_location& site) {
    const EmulatorScope scope;
    for (SharedAllocation& a : shared) {
        if (a.key != key) continue;
        // The same S from two places of one kernel: one object on the device.
        if (!same_site(a.site, site))
            fail(t, "block_shared<" + std::string(type_view) + ">() is called at " + str(a.site) + " and at " +
                        str(site) + ": on the device both name one object; give each its own type (a struct "
                                    "holding both, say)");
        return a.data;
    }
    if (align > 16) fail(t, "block_shared<" + std::string(type_view) + ">(): alignment " + std::to_string(align) + " > 16");
    static_shared_bytes += bytes;
    const std::size_t dynamic = launch->dynamic_shared;
    if (static_shared_bytes > EmulatedDevice::shared_per_block)
        fail(t, "static shared memory of " + std::to_string(static_shared_bytes) + " bytes (block_shared<" + std::string(type_view) +
                    ">() at " + str(site) + " adds " + std::to_string(bytes) +
                    ") is more than the 48 KiB a kernel may declare statically");
    if (static_shared_bytes + dynamic > EmulatedDevice::shared_per_block_optin)
        fail(t, std::to_string(static_shared_bytes) + " bytes of static and " + std::to_string(dynamic) +
                    " of dynamic shared memory are more than the device's " +
                    std::to_string(EmulatedDevice::shared_per_block_optin) + " bytes per block");
    auto* data = static_cast<unsigned char*>(::operator new[](bytes, std::align_val_t{16}));
    std::memset(data, 0xFF, bytes);
    shared.push_back(SharedAllocation{key, type_view, site, data, bytes, {}});
    return data;
}

inline void* Block::dynamic_shared(Thread& t) {
    for (SharedAllocation& a : shared)
        if (a.key == nullptr) return a.data;
    (void)t;
    return nullptr;  // the launch asked for none
}

// A code address as "file:line" where a sanitizer runtime can say, else in hex.
inline std::string describe_pc(const void* pc) {
    char buf[512] = {};
#if defined(SNUG_EMULATED_ASAN)
    char function[512] = {};
    __sanitizer_symbolize_pc(const_cast<void*>(pc), "%s:%l", buf, sizeof buf);
    __sanitizer_symbolize_pc(const_cast<void*>(pc), "%f", function, sizeof function);
    if (buf[0] != '\0' && buf[0] != '<') {
        std::string where = buf;
        if (const auto slash = where.find_last_of('/'); slash != std::string::npos) where.erase(0, slash + 1);
        return where + " (" + function + ")";
    }
#endif
    std::snprintf(buf, sizeof buf, "pc %p", pc);
    return buf;
}

inline void Block::note_shared_access(Thread& t, const void* p, std::size_t n, bool write, bool atomic,
                                      const void* pc) {
    if (fault) return;
    SharedAllocation* a = nullptr;
    for (SharedAllocation& s : shared)
        if (s.contains(p, 1)) a = &s;
    if (a == nullptr) return;
    if (a->shadow.empty()) a->shadow.resize(a->bytes);
    const std::size_t first = static_cast<std::size_t>(static_cast<const unsigned char*>(p) - a->data);
    const std::uint32_t epoch = barrier_epoch, gen = warps[t.warp].generation;
    const auto me = static_cast<std::uint16_t>(t.linear), my_warp = static_cast<std::uint16_t>(t.warp);
    // Ordered: an earlier barrier interval, or the same warp with a
    // collective between that named both lanes.
    const Warp& my_warp_state = warps[t.warp];
    const auto ordered = [&](std::uint16_t who, std::uint32_t e, std::uint32_t g) {
        return e != epoch || (threads[who].warp == t.warp && my_warp_state.synced_since(g, threads[who].lane, t.lane));
    };
    // The first fault is reported when the thread next synchronises (the
    // checker runs inside the thread's loads and stores, where nothing may throw).
    const auto report = [&](std::size_t i, const std::string& what) {
        fault = this->where(t) + ": " + what + " (" + a->name() + ", byte " + std::to_string(i) + ")";
    };
    // The thread's own cp.async into these bytes, not yet waited for: the
    // read sees what was there before (another thread's read of them is a
    // race with the wait, found below).
    if (!write)
        for (const AsyncCopy& c : t.async_copies) {
            const auto* d = static_cast<const unsigned char*>(c.dst);
            const auto* q = static_cast<const unsigned char*>(p);
            if (q < d + c.bytes && d < q + n)
                return report(static_cast<std::size_t>(std::max(q, d) - a->data),
                              "reads at " + describe_pc(pc) + " shared memory its own cp.async at " + str(c.site) +
                                  " has not written yet: wait for it (cp_async_wait) first");
        }
    for (std::size_t i = first; i < std::min(first + n, a->bytes); ++i) {
        ShadowByte& b = a->shadow[i];
        if (!write) {
            if (b.writer == ShadowByte::none)
                return report(i, "reads shared memory no thread of the block has written (it starts undefined on a "
                                 "GPU) at " + describe_pc(pc));
            if (b.writer != me && !(atomic && b.write_atomic) && !ordered(b.writer, b.write_epoch, b.write_gen))
                return report(i, "race on shared memory: reads at " + describe_pc(pc) + " what thread " +
                                     str(threads[b.writer].idx) + " wrote at " + describe_pc(b.write_pc) +
                                     " with no barrier between");
            if (b.reader == ShadowByte::none || b.read_epoch != epoch) {
                b.reader = me;
                b.reader_warp = my_warp;
            } else if (b.reader != me) {
                b.reader = ShadowByte::many;
                if (b.reader_warp != my_warp) b.reader_warp = ShadowByte::many;
            }
            b.read_epoch = epoch;
            b.read_gen = gen;
            b.read_pc = pc;
            continue;
        }
        if (b.writer != ShadowByte::none && b.writer != me && !(atomic && b.write_atomic) &&
            !ordered(b.writer, b.write_epoch, b.write_gen))
            return report(i, "race on shared memory: writes at " + describe_pc(pc) + " what thread " +
                                 str(threads[b.writer].idx) + " wrote at " + describe_pc(b.write_pc) +
                                 " with no barrier between");
        // Since the reads: one reader ordered as above; several of this
        // warp, any collective of it (their lanes are not kept).
        const bool reads_ordered =
            b.reader == ShadowByte::many ? b.reader_warp == my_warp && b.read_gen != gen
                                         : b.reader != ShadowByte::none && ordered(b.reader, b.read_epoch, b.read_gen);
        if (atomic && b.writer == ShadowByte::none)
            return report(i, "an atomic at " + describe_pc(pc) + " reads shared memory no thread of the block has "
                             "written (it starts undefined on a GPU: zero it first)");
        if (b.reader != ShadowByte::none && b.read_epoch == epoch && b.reader != me && !reads_ordered) {
            const std::string readers = b.reader == ShadowByte::many ? std::string("other threads")
                                                                     : "thread " + str(threads[b.reader].idx);
            return report(i, "race on shared memory: writes at " + describe_pc(pc) + " what " + readers +
                                 " read (last at " + describe_pc(b.read_pc) + ") with no barrier between");
        }
        b.writer = me;
        b.write_epoch = epoch;
        b.write_gen = gen;
        b.write_atomic = atomic;
        b.write_pc = pc;
        b.reader = ShadowByte::none;
    }
}

inline std::string Block::diagnose_stall() {
    // A barrier some live threads never reach.
    if (barrier_arrived > 0) {
        for (const Thread& w : threads) {
            if (w.wait == Wait::barrier || w.wait == Wait::exited) continue;
            return where(w) + ": " + barrier_name(barrier_kind) + " at " + str(barrier_site) + " is reached by " +
                   std::to_string(barrier_arrived) + " of " + std::to_string(live) +
                   " live threads; this thread " + waits_at(w);
        }
    }
    // A collective some named lanes never reach.
    for (std::size_t wi = 0; wi < warps.size(); ++wi) {
        for (const PendingCollective& p : warps[wi].pending) {
            const unsigned missing = p.mask & ~p.arrived;
            const auto lane = static_cast<unsigned>(std::countr_zero(missing));
            const Thread& first = threads[wi * 32 + static_cast<unsigned>(std::countr_zero(p.arrived))];
            const Thread& absent = threads[wi * 32 + lane];
            return where(first) + ": " + first.call.name + " at " + str(first.site) + " with mask " + hex(p.mask) +
                   " never completes: lane " + std::to_string(lane) + " (thread " + str(absent.idx) + ") " +
                   waits_at(absent);
        }
    }
    return "kernel " + std::string(launch->kernel) + ", block " + str(idx) + ": no thread can make progress";
}

// ---- Worker -----------------------------------------------------------------------

inline std::optional<std::string> Worker::run(const KernelLaunch& launch, std::uint64_t linear) {
    Block& b = block;
    const dim3 g = launch.grid, d = launch.block;
    const unsigned n = d.x * d.y * d.z;
    b.launch = &launch;
    b.linear = linear;
    b.idx = uint3{static_cast<unsigned>(linear % g.x), static_cast<unsigned>(linear / g.x % g.y),
                  static_cast<unsigned>(linear / (std::uint64_t{g.x} * g.y))};
    b.threads.assign(n, Thread{});
    for (unsigned i = 0; i < n; ++i) {
        Thread& t = b.threads[i];
        t.idx = uint3{i % d.x, i / d.x % d.y, i / (d.x * d.y)};
        t.linear = i;
        t.warp = i / 32;
        t.lane = i % 32;
    }
    b.warps.assign((n + 31) / 32, Warp{});
    for (unsigned w = 0; w < b.warps.size(); ++w) {
        const unsigned lanes = std::min(32U, n - w * 32);
        b.warps[w].live = lanes == 32 ? 0xFFFF'FFFFU : (1U << lanes) - 1;
    }
    b.ready.clear();
    b.head = 0;
    for (unsigned i = 0; i < n; ++i) b.ready.push_back(i);
    b.live = n;
    b.barrier_arrived = 0;
    b.barrier_epoch = 0;
    b.fault.reset();
    b.release_shared();
    if (launch.dynamic_shared > 0) {
        auto* data = static_cast<unsigned char*>(::operator new[](launch.dynamic_shared, std::align_val_t{16}));
        std::memset(data, 0xFF, launch.dynamic_shared);
        b.shared.push_back(SharedAllocation{nullptr, "dynamic", {}, data, launch.dynamic_shared, {}});
    }
    ensure_fibers(n);
    tls_worker = this;
    blockIdx = b.idx;
    blockDim = d;
    gridDim = g;

    // Runs the threads, fiber to fiber, until none is ready or one faulted.
    if (Thread* first = next_ready()) {
        enter(*first);
        Context::switch_to(home_, *slots_[first->linear]->fiber);
    }
    current_ = nullptr;
    if (!b.fault && b.live > 0) b.fault = b.diagnose_stall();
    if (b.fault) {
        // Fibers stopped in the middle of the kernel start afresh next time.
        for (unsigned i = 0; i < n; ++i) slots_[i]->fiber->reset();
    }
    b.release_shared();
    return b.fault;
}

// ---- the pool of workers ------------------------------------------------------------

// Runs launches on the calling thread and up to cores - 1 helpers (all cores
// by default; the environment variable SNUG_EMULATED_THREADS sets another
// count, 1 for a fully sequential run). One launch at a time.
class Pool {
public:
    static Pool& instance() {
        static Pool pool;
        return pool;
    }

    Pool(const Pool&) = delete;
    Pool& operator=(const Pool&) = delete;

    ~Pool() {
        {
            std::lock_guard lock(mutex_);
            stop_ = true;
        }
        wake_.notify_all();
        for (std::thread& t : helpers_) t.join();
    }

    // Runs every block of `launch`; the fault of the lowest-numbered block
    // that failed, if any (later blocks are not started once one failed).
    std::optional<Fault> run(const KernelLaunch& launch) {
        std::lock_guard one_launch(launch_mutex_);
        Job job;
        job.launch = &launch;
        job.blocks = std::uint64_t{launch.grid.x} * launch.grid.y * launch.grid.z;
        const auto helpers = static_cast<unsigned>(
            std::min<std::uint64_t>(helpers_.size(), job.blocks > 0 ? job.blocks - 1 : 0));
        {
            std::lock_guard lock(mutex_);
            job_ = &job;
            wanted_ = helpers;
            running_ = helpers;
            ++generation_;
        }
        if (helpers > 0) wake_.notify_all();
        work(job);
        {
            std::unique_lock lock(mutex_);
            done_.wait(lock, [&] { return running_ == 0; });
            job_ = nullptr;
        }
        return job.fault;
    }

private:
    struct Job {
        const KernelLaunch* launch = nullptr;
        std::uint64_t blocks = 0;
        std::atomic<std::uint64_t> next{0};
        std::atomic<bool> stop{false};
        std::mutex fault_mutex;
        std::optional<Fault> fault;
    };

    Pool() {
#if defined(SNUG_EMULATED_ASAN)
        // An AddressSanitizer report from inside a kernel says which emulated thread made the access.
        __asan_set_error_report_callback([](const char*) {
            if (tls_worker != nullptr && tls_worker->current() != nullptr)
                std::fprintf(stderr, "snug emulated CUDA: the access was made by %s\n",
                             tls_worker->block.where(*tls_worker->current()).c_str());
        });
#endif
        unsigned cores = std::max(1U, std::thread::hardware_concurrency());
        if (const char* env = std::getenv("SNUG_EMULATED_THREADS"); env != nullptr && std::atoi(env) > 0)
            cores = static_cast<unsigned>(std::atoi(env));
        for (unsigned i = 1; i < cores; ++i) helpers_.emplace_back([this] { helper(); });
    }

    static void work(Job& job) {
        Worker& worker = this_worker();
        while (!job.stop.load(std::memory_order_relaxed)) {
            const std::uint64_t b = job.next.fetch_add(1, std::memory_order_relaxed);
            if (b >= job.blocks) break;
            if (std::optional<std::string> f = worker.run(*job.launch, b)) {
                std::lock_guard lock(job.fault_mutex);
                if (!job.fault || b < job.fault->block) job.fault = Fault{b, std::move(*f)};
                job.stop = true;
            }
        }
    }

    void helper() {
        std::uint64_t seen = 0;
        for (;;) {
            Job* job = nullptr;
            {
                std::unique_lock lock(mutex_);
                wake_.wait(lock, [&] { return stop_ || (generation_ != seen && wanted_ > 0); });
                if (stop_) return;
                seen = generation_;
                --wanted_;
                job = job_;
            }
            work(*job);
            {
                std::lock_guard lock(mutex_);
                --running_;
            }
            done_.notify_all();
        }
    }

    std::mutex launch_mutex_;
    std::mutex mutex_;
    std::condition_variable wake_, done_;
    std::vector<std::thread> helpers_;
    Job* job_ = nullptr;
    std::uint64_t generation_ = 0;
    unsigned wanted_ = 0, running_ = 0;
    bool stop_ = false;
};

}  // namespace detail

// Runs a launch to completion (synchronously); the first fault, if any.
inline std::optional<Fault> run(const KernelLaunch& launch) { return detail::Pool::instance().run(launch); }

}  // namespace snug::cuda::emulated

using snug::cuda::emulated::blockDim;
using snug::cuda::emulated::blockIdx;
using snug::cuda::emulated::gridDim;
using snug::cuda::emulated::threadIdx;
