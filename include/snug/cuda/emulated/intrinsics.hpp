// The device functions of CUDA C++ that kernels call, for the emulated backend:
// barriers, warp shuffles and votes, atomics, memory fences, load/store hints,
// bit tricks and the correctly rounded float operations. They live in the
// global namespace, as CUDA's do. Barriers and collectives record their call
// site (a defaulted std::source_location), which fault reports name.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <limits>
#include <source_location>
#include <type_traits>

#include "snug/cuda/emulated/shared_check.hpp"
#include "snug/cuda/emulated/simt.hpp"

namespace snug::cuda::emulated::detail {

enum class ShuffleMode { idx, up, down, bfly };

constexpr const char* shuffle_name(ShuffleMode m) {
    switch (m) {
        case ShuffleMode::idx: return "__shfl_sync";
        case ShuffleMode::up: return "__shfl_up_sync";
        case ShuffleMode::down: return "__shfl_down_sync";
        case ShuffleMode::bfly: return "__shfl_xor_sync";
    }
    return "shuffle";
}

// The source lane of lane l, per the CUDA Programming Guide: idx takes lane
// (arg mod width) of l's segment; up and down shift within the segment and
// leave the lanes that would leave it unchanged; xor may read earlier
// segments but not later ones (then it returns l's own value).
inline unsigned shuffle_source(ShuffleMode mode, unsigned l, int arg, int width) {
    const unsigned w = static_cast<unsigned>(width);
    const unsigned base = l & ~(w - 1);
    const auto a = static_cast<unsigned>(arg);
    switch (mode) {
        case ShuffleMode::idx: return base + (a & (w - 1));
        case ShuffleMode::up: return l - base >= a ? l - a : l;
        case ShuffleMode::down: return l - base + a < w ? l + a : l;
        case ShuffleMode::bfly: {
            const unsigned src = l ^ a;
            return src >= base + w ? l : src;
        }
    }
    return l;
}

template <ShuffleMode Mode>
void shuffle_complete(Block& b, Thread* const* lanes, unsigned mask) {
    for (unsigned l = 0; l < 32; ++l) {
        if ((mask >> l & 1U) == 0) continue;
        Thread& t = *lanes[l];
        const int width = t.call.width;
        if (width < 1 || width > 32 || (width & (width - 1)) != 0)
            b.fail(t, std::string(t.call.name) + " at " + str(t.site) + ": width " + std::to_string(width) +
                          " is not a power of two from 1 to 32");
        const unsigned src = shuffle_source(Mode, l, t.call.arg, width);
        if (src != l && (src >= 32 || (mask >> src & 1U) == 0))
            b.fail(t, std::string(t.call.name) + " at " + str(t.site) + " reads lane " + std::to_string(src) +
                          ", which is not in the mask " + hex(mask) + " (its value is undefined on a GPU)");
        t.result = lanes[src]->call.value;
    }
}

enum class Vote { ballot, any, all, sync };

template <Vote V>
void vote_complete(Block&, Thread* const* lanes, unsigned mask) {
    unsigned ballot = 0;
    for (unsigned l = 0; l < 32; ++l)
        if ((mask >> l & 1U) != 0 && lanes[l]->call.value != 0) ballot |= 1U << l;
    for (unsigned l = 0; l < 32; ++l) {
        if ((mask >> l & 1U) == 0) continue;
        std::uint64_t r = 0;
        if constexpr (V == Vote::ballot) r = ballot;
        if constexpr (V == Vote::any) r = ballot != 0;
        if constexpr (V == Vote::all) r = ballot == mask;
        lanes[l]->result = r;
    }
}

enum class Match { any, all };

template <Match M>
void match_complete(Block&, Thread* const* lanes, unsigned mask) {
    for (unsigned l = 0; l < 32; ++l) {
        if ((mask >> l & 1U) == 0) continue;
        unsigned same = 0;
        for (unsigned o = 0; o < 32; ++o)
            if ((mask >> o & 1U) != 0 && lanes[o]->call.value == lanes[l]->call.value) same |= 1U << o;
        if constexpr (M == Match::any) {
            lanes[l]->result = same;
        } else {
            const bool all = same == mask;
            lanes[l]->result = all ? mask : 0;
            if (lanes[l]->call.out != nullptr) *static_cast<int*>(lanes[l]->call.out) = all ? 1 : 0;
        }
    }
}

enum class Reduce { add, min, max, and_, or_, xor_ };

template <Reduce R, class T>
void reduce_complete(Block&, Thread* const* lanes, unsigned mask) {
    bool first = true;
    T acc{};
    for (unsigned l = 0; l < 32; ++l) {
        if ((mask >> l & 1U) == 0) continue;
        const auto v = static_cast<T>(static_cast<unsigned>(lanes[l]->call.value));
        if (first) {
            acc = v;
            first = false;
            continue;
        }
        if constexpr (R == Reduce::add) acc = static_cast<T>(acc + v);
        if constexpr (R == Reduce::min) acc = std::min(acc, v);
        if constexpr (R == Reduce::max) acc = std::max(acc, v);
        if constexpr (R == Reduce::and_) acc = acc & v;
        if constexpr (R == Reduce::or_) acc = acc | v;
        if constexpr (R == Reduce::xor_) acc = acc ^ v;
    }
    for (unsigned l = 0; l < 32; ++l)
        if ((mask >> l & 1U) != 0) lanes[l]->result = static_cast<unsigned>(acc);
}

template <class T>
concept ShuffleValue = std::is_trivially_copyable_v<T> && sizeof(T) <= 8;

template <class T>
std::uint64_t to_bits(T v) {
    std::uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    return bits;
}

template <class T>
T from_bits(std::uint64_t bits) {
    T v;
    std::memcpy(&v, &bits, sizeof(T));
    return v;
}

inline std::uint64_t warp_op(const char* name, CollectiveFn complete, unsigned mask, std::uint64_t value, int arg,
                             int width, void* out, const std::source_location& site) {
    Thread& t = this_thread(name);
    CollectiveCall call;
    call.complete = complete;
    call.name = name;
    call.mask = mask;
    call.value = value;
    call.arg = arg;
    call.width = width;
    call.out = out;
    return this_block().collective(t, call, site);
}

template <ShuffleMode Mode, ShuffleValue T>
T shuffle(unsigned mask, T var, int arg, int width, const std::source_location& site) {
    return from_bits<T>(warp_op(shuffle_name(Mode), &shuffle_complete<Mode>, mask, to_bits(var), arg, width, nullptr,
                                site));
}

inline int block_barrier(BarrierKind kind, int predicate, const std::source_location& site) {
    Thread& t = this_thread(barrier_name(kind));
    return this_block().barrier(t, kind, predicate, site);
}

}  // namespace snug::cuda::emulated::detail

// ---- barriers -------------------------------------------------------------------

inline void __syncthreads(std::source_location site = std::source_location::current()) {
    (void)snug::cuda::emulated::detail::block_barrier(snug::cuda::emulated::detail::BarrierKind::sync, 0, site);
}
inline int __syncthreads_count(int predicate, std::source_location site = std::source_location::current()) {
    return snug::cuda::emulated::detail::block_barrier(snug::cuda::emulated::detail::BarrierKind::count, predicate,
                                                       site);
}
inline int __syncthreads_and(int predicate, std::source_location site = std::source_location::current()) {
    return snug::cuda::emulated::detail::block_barrier(snug::cuda::emulated::detail::BarrierKind::all, predicate,
                                                       site);
}
inline int __syncthreads_or(int predicate, std::source_location site = std::source_location::current()) {
    return snug::cuda::emulated::detail::block_barrier(snug::cuda::emulated::detail::BarrierKind::any, predicate,
                                                       site);
}

// ---- warp collectives ---------------------------------------------------------------

inline void __syncwarp(unsigned mask = 0xFFFF'FFFFU, std::source_location site = std::source_location::current()) {
    using namespace snug::cuda::emulated::detail;
    (void)warp_op("__syncwarp", &vote_complete<Vote::sync>, mask, 0, 0, 32, nullptr, site);
}

template <snug::cuda::emulated::detail::ShuffleValue T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize,
              std::source_location site = std::source_location::current()) {
    using namespace snug::cuda::emulated::detail;
    return shuffle<ShuffleMode::idx>(mask, var, src_lane, width, site);
}
template <snug::cuda::emulated::detail::ShuffleValue T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                 std::source_location site = std::source_location::current()) {
    using namespace snug::cuda::emulated::detail;
    return shuffle<ShuffleMode::up>(mask, var, static_cast<int>(delta), width, site);
}
template <snug::cuda::emulated::detail::ShuffleValue T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                   std::source_location site = std::source_location::current()) {
    using namespace snug::cuda::emulated::detail;
    return shuffle<ShuffleMode::down>(mask, var, static_cast<int>(delta), width, site);
}
template <snug::cuda::emulated::detail::ShuffleValue T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize,
                  std::source_location site = std::source_location::current()) {
    using namespace snug::cuda::emulated::detail;
    return shuffle<ShuffleMode::bfly>(mask, var, lane_mask, width, site);
}

inline unsigned __ballot_sync(unsigned mask, int predicate, std::source_location site = std::source_location::current()) {
    using namespace snug::cuda::emulated::detail;
    return static_cast<unsigned>(
        warp_op("__ballot_sync", &vote_complete<Vote::ballot>, mask, predicate != 0, 0, 32, nullptr, site));
}
inline int __any_sync(unsigned mask, int predicate, std::source_location site = std::source_location::current()) {
    using namespace snug::cuda::emulated::detail;
    return static_cast<int>(warp_op("__any_sync", &vote_complete<Vote::any>, mask, predicate != 0, 0, 32, nullptr, site));
}
inline int __all_sync(unsigned mask, int predicate, std::source_location site = std::source_location::current()) {
    using namespace snug::cuda::emulated::detail;
    return static_cast<int>(warp_op("__all_sync", &vote_complete<Vote::all>, mask, predicate != 0, 0, 32, nullptr, site));
}

template <snug::cuda::emulated::detail::ShuffleValue T>
unsigned __match_any_sync(unsigned mask, T value, std::source_location site = std::source_location::current()) {
    using namespace snug::cuda::emulated::detail;
    return static_cast<unsigned>(
        warp_op("__match_any_sync", &match_complete<Match::any>, mask, to_bits(value), 0, 32, nullptr, site));
}
template <snug::cuda::emulated::detail::ShuffleValue T>
unsigned __match_all_sync(unsigned mask, T value, int* pred, std::source_location site = std::source_location::current()) {
    using namespace snug::cuda::emulated::detail;
    return static_cast<unsigned>(
        warp_op("__match_all_sync", &match_complete<Match::all>, mask, to_bits(value), 0, 32, pred, site));
}

namespace snug::cuda::emulated::detail {
template <class T>
concept ReduceValue = std::same_as<T, int> || std::same_as<T, unsigned>;

template <Reduce R, ReduceValue T>
T reduce(const char* name, unsigned mask, T value, const std::source_location& site) {
    const auto bits = static_cast<std::uint64_t>(static_cast<unsigned>(value));
    return static_cast<T>(static_cast<unsigned>(warp_op(name, &reduce_complete<R, T>, mask, bits, 0, 32, nullptr, site)));
}
}  // namespace snug::cuda::emulated::detail

template <snug::cuda::emulated::detail::ReduceValue T>
T __reduce_add_sync(unsigned mask, T value, std::source_location site = std::source_location::current()) {
    using namespace snug::cuda::emulated::detail;
    return reduce<Reduce::add>("__reduce_add_sync", mask, value, site);
}
template <snug::cuda::emulated::detail::ReduceValue T>
T __reduce_min_sync(unsigned mask, T value, std::source_location site = std::source_location::current()) {
    using namespace snug::cuda::emulated::detail;
    return reduce<Reduce::min>("__reduce_min_sync", mask, value, site);
}
template <snug::cuda::emulated::detail::ReduceValue T>
T __reduce_max_sync(unsigned mask, T value, std::source_location site = std::source_location::current()) {
    using namespace snug::cuda::emulated::detail;
    return reduce<Reduce::max>("__reduce_max_sync", mask, value, site);
}
inline unsigned __reduce_and_sync(unsigned mask, unsigned value,
                                  std::source_location site = std::source_location::current()) {
    using namespace snug::cuda::emulated::detail;
    return reduce<Reduce::and_>("__reduce_and_sync", mask, value, site);
}
inline unsigned __reduce_or_sync(unsigned mask, unsigned value,
                                 std::source_location site = std::source_location::current()) {
    using namespace snug::cuda::emulated::detail;
    return reduce<Reduce::or_>("__reduce_or_sync", mask, value, site);
}
inline unsigned __reduce_xor_sync(unsigned mask, unsigned value,
                                  std::source_location site = std::source_location::current()) {
    using namespace snug::cuda::emulated::detail;
    return reduce<Reduce::xor_>("__reduce_xor_sync", mask, value, site);
}

// The lanes of the calling warp that have not exited (on a GPU: the lanes
// executing this instruction together, which the emulator cannot know).
inline unsigned __activemask() {
    using namespace snug::cuda::emulated::detail;
    const Thread& t = this_thread("__activemask");
    return this_block().warps[t.warp].live;
}

// ---- memory fences, hints and atomics -----------------------------------------------

inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __nanosleep(unsigned) {}

template <class T>
T __ldg(const T* p) {
    return *p;
}
template <class T>
T __ldcg(const T* p) {
    return *p;
}
template <class T>
T __ldca(const T* p) {
    return *p;
}
template <class T>
T __ldcs(const T* p) {
    return *p;
}
template <class T>
T __ldlu(const T* p) {
    return *p;
}
template <class T>
T __ldcv(const T* p) {
    return *p;
}
template <class T>
void __stcg(T* p, T v) {
    *p = v;
}
template <class T>
void __stcs(T* p, T v) {
    *p = v;
}
template <class T>
void __stwb(T* p, T v) {
    *p = v;
}
template <class T>
void __stwt(T* p, T v) {
    *p = v;
}

namespace snug::cuda::emulated::detail {
template <class T>
concept AtomicValue = std::same_as<T, int> || std::same_as<T, unsigned> || std::same_as<T, unsigned long long> ||
                      std::same_as<T, long long> || std::same_as<T, float> || std::same_as<T, double>;
template <class T>
concept AtomicInteger = AtomicValue<T> && std::integral<T>;
}  // namespace snug::cuda::emulated::detail

// Not inlined: __builtin_return_address(0) is then the atomic's own line in
// the kernel, which the shared-memory checker names.
template <snug::cuda::emulated::detail::AtomicValue T>
[[gnu::noinline]] T atomicAdd(T* address, T value) {
    snug::cuda::emulated::detail::note_atomic(address, sizeof(T), __builtin_return_address(0));
    return std::atomic_ref<T>(*address).fetch_add(value);
}
template <snug::cuda::emulated::detail::AtomicInteger T>
[[gnu::noinline]] T atomicSub(T* address, T value) {
    snug::cuda::emulated::detail::note_atomic(address, sizeof(T), __builtin_return_address(0));
    return std::atomic_ref<T>(*address).fetch_sub(value);
}
template <snug::cuda::emulated::detail::AtomicValue T>
[[gnu::noinline]] T atomicExch(T* address, T value) {
    snug::cuda::emulated::detail::note_atomic(address, sizeof(T), __builtin_return_address(0));
    return std::atomic_ref<T>(*address).exchange(value);
}
template <snug::cuda::emulated::detail::AtomicInteger T>
[[gnu::noinline]] T atomicMin(T* address, T value) {
    snug::cuda::emulated::detail::note_atomic(address, sizeof(T), __builtin_return_address(0));
    std::atomic_ref<T> a(*address);
    T old = a.load();
    while (value < old && !a.compare_exchange_weak(old, value)) {
    }
    return old;
}
template <snug::cuda::emulated::detail::AtomicInteger T>
[[gnu::noinline]] T atomicMax(T* address, T value) {
    snug::cuda::emulated::detail::note_atomic(address, sizeof(T), __builtin_return_address(0));
    std::atomic_ref<T> a(*address);
    T old = a.load();
    while (value > old && !a.compare_exchange_weak(old, value)) {
    }
    return old;
}
template <snug::cuda::emulated::detail::AtomicInteger T>
[[gnu::noinline]] T atomicAnd(T* address, T value) {
    snug::cuda::emulated::detail::note_atomic(address, sizeof(T), __builtin_return_address(0));
    return std::atomic_ref<T>(*address).fetch_and(value);
}
template <snug::cuda::emulated::detail::AtomicInteger T>
[[gnu::noinline]] T atomicOr(T* address, T value) {
    snug::cuda::emulated::detail::note_atomic(address, sizeof(T), __builtin_return_address(0));
    return std::atomic_ref<T>(*address).fetch_or(value);
}
template <snug::cuda::emulated::detail::AtomicInteger T>
[[gnu::noinline]] T atomicXor(T* address, T value) {
    snug::cuda::emulated::detail::note_atomic(address, sizeof(T), __builtin_return_address(0));
    return std::atomic_ref<T>(*address).fetch_xor(value);
}
template <class T>
    requires std::same_as<T, int> || std::same_as<T, unsigned> || std::same_as<T, unsigned long long> ||
             std::same_as<T, unsigned short>
[[gnu::noinline]] T atomicCAS(T* address, T compare, T value) {
    snug::cuda::emulated::detail::note_atomic(address, sizeof(T), __builtin_return_address(0));
    std::atomic_ref<T>(*address).compare_exchange_strong(compare, value);
    return compare;  // the old value, whether the swap happened or not
}
[[gnu::noinline]] inline unsigned atomicInc(unsigned* address, unsigned limit) {
    snug::cuda::emulated::detail::note_atomic(address, sizeof(unsigned), __builtin_return_address(0));
    std::atomic_ref<unsigned> a(*address);
    unsigned old = a.load();
    while (!a.compare_exchange_weak(old, old >= limit ? 0U : old + 1U)) {
    }
    return old;
}
[[gnu::noinline]] inline unsigned atomicDec(unsigned* address, unsigned limit) {
    snug::cuda::emulated::detail::note_atomic(address, sizeof(unsigned), __builtin_return_address(0));
    std::atomic_ref<unsigned> a(*address);
    unsigned old = a.load();
    while (!a.compare_exchange_weak(old, (old == 0U || old > limit) ? limit : old - 1U)) {
    }
    return old;
}

// ---- bits and the correctly rounded float operations ---------------------------------
// The emulated target compiles with -ffp-contract=off, so none of these is
// fused into a multiply-add: each is one IEEE operation, as on the device.

inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline float __uint_as_float(unsigned x) { return std::bit_cast<float>(x); }
inline unsigned __float_as_uint(float x) { return std::bit_cast<unsigned>(x); }
inline double __longlong_as_double(long long x) { return std::bit_cast<double>(x); }
inline long long __double_as_longlong(double x) { return std::bit_cast<long long>(x); }

inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
// The CUDA Math API's fast division: within 2 ulp of a / b on the device
// (correctly rounded here), except that for 2^126 < |b| < 2^128 it delivers
// 0 for a finite a and NaN for an infinite one (the reciprocal it multiplies
// by is flushed to zero), as here.
inline float __fdividef(float a, float b) {
    const float magnitude = std::fabs(b);
    if (magnitude > 0x1p126f && magnitude <= std::numeric_limits<float>::max()) return a * (0.0f * b);
    return a / b;
}
inline float rsqrtf(float a) { return 1.0f / std::sqrt(a); }
inline double rsqrt(double a) { return 1.0 / std::sqrt(a); }
inline float __expf(float a) { return std::exp(a); }
inline float __exp10f(float a) { return std::pow(10.0f, a); }
inline float __logf(float a) { return std::log(a); }
inline float __log2f(float a) { return std::log2(a); }
inline float __powf(float a, float b) { return std::pow(a, b); }
inline float __sinf(float a) { return std::sin(a); }
inline float __cosf(float a) { return std::cos(a); }
inline float __tanf(float a) { return std::tan(a); }
inline float __saturatef(float a) { return a >= 1.0f ? 1.0f : (a > 0.0f ? a : 0.0f); }  // NaN -> 0

inline int __popc(unsigned x) { return std::popcount(x); }
inline int __popcll(unsigned long long x) { return std::popcount(x); }
inline int __clz(int x) { return std::countl_zero(static_cast<unsigned>(x)); }
inline int __clzll(long long x) { return std::countl_zero(static_cast<unsigned long long>(x)); }
inline int __ffs(int x) { return x == 0 ? 0 : std::countr_zero(static_cast<unsigned>(x)) + 1; }
inline int __ffsll(long long x) { return x == 0 ? 0 : std::countr_zero(static_cast<unsigned long long>(x)) + 1; }
inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1U) << (31 - i);
    return r;
}

// Classification functions device code calls unqualified, as in C.
using std::isfinite;
using std::isinf;
using std::isnan;
using std::signbit;

// CUDA's device min and max for the integer and float types.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }

// A nanosecond counter (the device's is cycles; only differences mean anything).
inline long long clock64() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// Ends the kernel with a fault, as the device's trap instruction does.
[[noreturn]] inline void __trap() {
    using namespace snug::cuda::emulated::detail;
    Thread& t = this_thread("__trap");
    this_block().fail(t, "__trap() called");
}
