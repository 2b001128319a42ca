// The emulated CUDA backend itself: what its SIMT machine promises (built-in
// variables, barriers and their reductions, shuffles and votes with CUDA's
// documented semantics, atomics, shared memory per block, cp.async landing at
// its wait, launch limits, a launch recorder) and each fault it must catch, shown on a small
// deliberately broken kernel: barriers at different call sites or not reached
// by every live thread, warp collectives whose mask leaves out the caller or
// names lanes that never arrive, shuffles that read outside their mask, one
// block_shared type claimed twice, __trap, a misaligned cp.async; with the
// shared-memory checker (Clang builds with SNUG_EMULATED_CHECKS), reads of unwritten shared memory and races,
// through loads and stores and through struct copies. Expected
// values come from the CUDA Programming Guide's definitions, written out here.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "snug/cuda/async_copy.hpp"
#include "snug/cuda/check.hpp"
#include "snug/cuda/device.hpp"
#include "snug/cuda/launch.hpp"
#include "snug/cuda/runtime.hpp"
#include "snug/cuda/shared_memory.hpp"

using Catch::Matchers::Contains;
using snug::cuda::block_shared;
using snug::cuda::dynamic_shared;
using snug::cuda::launch;

namespace {

// Device memory of n T, filled with 0xFF bytes (poisoned).
template <class T>
struct DeviceArray {
    T* p = nullptr;
    std::size_t n = 0;
    explicit DeviceArray(std::size_t count) : n(count) {
        snug::cuda::check(cudaMalloc(&p, n * sizeof(T)));
        snug::cuda::check(cudaMemset(p, 0xFF, n * sizeof(T)));
    }
    DeviceArray(const DeviceArray&) = delete;
    DeviceArray& operator=(const DeviceArray&) = delete;
    // After a cudaDeviceReset the memory is gone already: that cudaFree fails.
    ~DeviceArray() {
        if (cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
    }
    std::vector<T> get() const {
        std::vector<T> out(n);
        snug::cuda::check(cudaMemcpy(out.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
        return out;
    }
};

// Runs `body`, which must throw snug::CudaError; returns its message, leaves
// the device usable again (a kernel fault is sticky, as on a GPU, until
// cudaDeviceReset) and checks that the error was sticky until then.
template <class F>
std::string fault_of(F body) {
    std::string message;
    try {
        body();
    } catch (const snug::CudaError& e) {
        message = e.what();
    }
    INFO(message);
    CHECK_FALSE(message.empty());
    int probe = 0;
    CHECK(cudaMemset(&probe, 0, 0) == cudaErrorLaunchFailure);  // sticky
    CHECK(cudaDeviceReset() == cudaSuccess);
    CHECK(cudaGetLastError() == cudaSuccess);
    return message;
}

// ---- kernels that work --------------------------------------------------------------------

__global__ void builtins_kernel(unsigned* out) {  // (grid threads, 12)
    const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    unsigned* o = out + 12 * (block * blockDim.x * blockDim.y * blockDim.z + thread);
    const unsigned v[12] = {threadIdx.x, threadIdx.y, threadIdx.z, blockIdx.x, blockIdx.y, blockIdx.z,
                            blockDim.x,  blockDim.y,  blockDim.z,  gridDim.x,  gridDim.y,  gridDim.z};
    for (int i = 0; i < 12; ++i) o[i] = v[i];
}

__global__ void rotate_kernel(int* out) {  // (blocks, 256): out = tid + 1 of the neighbour
    auto& s = block_shared<int[256]>();
    s[threadIdx.x] = static_cast<int>(threadIdx.x) + 1;
    __syncthreads();
    out[blockIdx.x * 256 + threadIdx.x] = s[(threadIdx.x + 1) % 256];
}

__global__ void barrier_reductions_kernel(int* out) {  // (3)
    const int pred = threadIdx.x % 3 == 0;
    const int count = __syncthreads_count(pred);
    const int all = __syncthreads_and(threadIdx.x < 1000);
    const int any = __syncthreads_or(threadIdx.x == 77);
    if (threadIdx.x == 5) {
        out[0] = count;
        out[1] = all;
        out[2] = any;
    }
}

enum class Mode { idx, up, down, bfly };

template <Mode M>
__global__ void shuffle_kernel(int* out, int arg, int width) {  // (32)
    const int lane = static_cast<int>(threadIdx.x);
    const int v = 100 + lane;
    int r = 0;
    if constexpr (M == Mode::idx) r = __shfl_sync(0xFFFF'FFFFU, v, arg, width);
    if constexpr (M == Mode::up) r = __shfl_up_sync(0xFFFF'FFFFU, v, static_cast<unsigned>(arg), width);
    if constexpr (M == Mode::down) r = __shfl_down_sync(0xFFFF'FFFFU, v, static_cast<unsigned>(arg), width);
    if constexpr (M == Mode::bfly) r = __shfl_xor_sync(0xFFFF'FFFFU, v, arg, width);
    out[lane] = r;
}

// The source lane CUDA's documentation gives for lane l: idx reads lane
// (arg mod width) of l's width-segment; up and down shift within the segment,
// leaving the lanes that would leave it unchanged; xor reads l ^ arg unless
// that lies in a later segment, which gives l's own value.
int expected_source(Mode m, int l, int arg, int width) {
    const int seg = l / width * width, pos = l % width;
    switch (m) {
        case Mode::idx: return seg + ((arg % width) + width) % width;
        case Mode::up: return pos - arg >= 0 ? l - arg : l;
        case Mode::down: return pos + arg < width ? l + arg : l;
        case Mode::bfly: {
            const int src = l ^ arg;
            return src >= seg + width ? l : src;
        }
    }
    return l;
}

__global__ void votes_kernel(unsigned* out) {  // (64 lanes: 2 warps) x 6
    const unsigned lane = threadIdx.x % 32;
    const int pred = lane % 5 == 0;
    unsigned* o = out + 6 * threadIdx.x;
    o[0] = __ballot_sync(0xFFFF'FFFFU, pred);
    o[1] = static_cast<unsigned>(__any_sync(0xFFFF'FFFFU, lane == 31));
    o[2] = static_cast<unsigned>(__all_sync(0xFFFF'FFFFU, lane < 31));
    o[3] = __match_any_sync(0xFFFF'FFFFU, lane / 8);
    o[4] = __reduce_add_sync(0xFFFF'FFFFU, lane);
    o[5] = static_cast<unsigned>(__reduce_max_sync(0xFFFF'FFFFU, static_cast<int>(lane) - 7));
}

__global__ void atomics_kernel(unsigned* counter, int* maximum, float* sum) {
    atomicAdd(counter, 1U);
    atomicMax(maximum, static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x));
    atomicAdd(sum, 0.5f);
}

__global__ void big_dynamic_kernel(float* out, int n) {
    float* s = dynamic_shared<float>();
    for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x)) s[i] = float(i);
    __syncthreads();
    if (threadIdx.x == 0) out[0] = s[n - 1];
}

__global__ void unwritten_shared_kernel(float* out) {
    auto& s = block_shared<float[4]>();
    out[threadIdx.x] = s[threadIdx.x];  // never written
}

// cp.async lands at the wait: each thread sets its shared float to -1, issues
// a copy of src[t] over it, and reads it before and after waiting. (On a GPU
// the read before the wait is a race; the emulator makes it read the old
// value, so a kernel that forgets to wait fails its tests.)
__global__ void async_copy_lands_at_wait_kernel(float* before, float* after, const float* src) {  // (64)
    auto& s = block_shared<float[64]>();
    const unsigned t = threadIdx.x;
    s[t] = -1.0f;
    snug::cuda::cp_async<4>(&s[t], src + t, true);
    snug::cuda::cp_async_commit();
    before[t] = s[t];
    snug::cuda::cp_async_wait<0>();
    after[t] = s[t];
}

// ---- kernels with faults --------------------------------------------------------------------

__global__ void barriers_at_two_sites_kernel(int* out) {
    if (threadIdx.x < 32) {
        __syncthreads();
    } else {
        __syncthreads();
    }
    out[threadIdx.x] = 1;
}

// Half of warp 0 reaches a barrier, the rest of the block exits: a
// conditional __syncthreads() whose condition differs across the block.
__global__ void barrier_after_exit_kernel(int* out) {
    if (threadIdx.x < 16) {
        __syncthreads();
        out[threadIdx.x] = 1;
    }
}

// Whole warps exit, then the others meet at a barrier: the same rule.
__global__ void barrier_after_warp_exit_kernel(int* out) {
    if (threadIdx.x >= 32) return;
    __syncthreads();
    out[threadIdx.x] = 1;
}

// Correct: every thread passes the barrier, then some exit.
__global__ void exit_after_barrier_kernel(int* out) {
    __syncthreads();
    if (threadIdx.x >= 16) return;
    out[threadIdx.x] = 1;
}

__global__ void barrier_against_syncwarp_kernel(int* out) {
    if (threadIdx.x % 32 == 0) {
        __syncthreads();
    } else {
        __syncwarp();  // waits for lane 0, which waits at the barrier
    }
    out[threadIdx.x] = 1;
}

__global__ void half_warp_shuffle_kernel(int* out) {
    int v = static_cast<int>(threadIdx.x);
    if (threadIdx.x < 16) v = __shfl_sync(0xFFFF'FFFFU, v, 0);  // lanes 16-31 never come
    out[threadIdx.x] = v;
}

__global__ void mask_without_caller_kernel(int* out) {
    out[threadIdx.x] = __shfl_sync(0x1U, static_cast<int>(threadIdx.x), 0);
}

__global__ void shuffle_outside_mask_kernel(int* out) {
    if (threadIdx.x < 16) out[threadIdx.x] = __shfl_sync(0x0000'FFFFU, static_cast<int>(threadIdx.x), 20);
}

__global__ void shared_type_twice_kernel(float* out) {
    auto& a = block_shared<float[8]>();
    a[threadIdx.x] = 1.0f;
    auto& b = block_shared<float[8]>();  // on the device the same object as a
    out[threadIdx.x] = b[threadIdx.x];
}

// A 16-byte cp.async into shared memory 4 bytes off a 16-byte boundary.
__global__ void misaligned_async_copy_kernel(const float* src) {  // (1)
    struct Tile {
        alignas(16) float v[8];
    };
    Tile& s = block_shared<Tile>();
    snug::cuda::cp_async<16>(&s.v[1], src, true);
    snug::cuda::cp_async_commit();
    snug::cuda::cp_async_wait<0>();
}

__global__ void trap_kernel(int* out) {
    if (blockIdx.x == 5 || blockIdx.x == 9) __trap();
    out[blockIdx.x] = 1;
}

#if defined(SNUG_EMULATED_SHARED_CHECKS)
__global__ void write_race_kernel(int* out) {
    auto& s = block_shared<int[1]>();
    s[0] = static_cast<int>(threadIdx.x);  // every warp writes it, no barrier
    __syncthreads();
    out[threadIdx.x] = s[0];
}

__global__ void read_race_kernel(int* out) {
    auto& s = block_shared<int[64]>();
    s[threadIdx.x] = 1;
    out[threadIdx.x] = s[(threadIdx.x + 32) % 64];  // the other warp's, no barrier
}

__global__ void ordered_by_barriers_kernel(int* out) {
    auto& s = block_shared<int[64]>();
    s[threadIdx.x] = 1;
    __syncthreads();
    out[threadIdx.x] = s[(threadIdx.x + 32) % 64];
    __syncthreads();
    s[threadIdx.x] = 2;  // after everyone's read
    __syncwarp();
    out[threadIdx.x] += s[threadIdx.x ^ 1];  // same warp, after a collective
}

// Each half-warp synchronises on its own: lane 3 reading what lane 19 wrote
// is a race (the two masks share no lane).
__global__ void half_warp_sync_race_kernel(int* out) {
    auto& s = block_shared<int[32]>();
    const unsigned lane = threadIdx.x % 32;
    s[lane] = static_cast<int>(lane);
    __syncwarp(lane < 16 ? 0x0000FFFFU : 0xFFFF0000U);
    out[lane] = s[lane ^ 16];  // the other half's
}

// The same, each half reading its own half: ordered.
__global__ void half_warp_sync_kernel(int* out) {
    auto& s = block_shared<int[32]>();
    const unsigned lane = threadIdx.x % 32;
    s[lane] = static_cast<int>(lane);
    __syncwarp(lane < 16 ? 0x0000FFFFU : 0xFFFF0000U);
    out[lane] = s[lane ^ 1];  // a neighbour in the same half
}

// cp.async, then the wait, then the read: correct.
__global__ void async_copy_waited_kernel(float* out, const float* src) {  // (64)
    auto& s = block_shared<float[64]>();
    const unsigned t = threadIdx.x;
    snug::cuda::cp_async<4>(&s[t], src + t, true);
    snug::cuda::cp_async_commit();
    snug::cuda::cp_async_wait<0>();
    out[t] = s[t];
}

// A histogram whose bins nobody zeroed: each atomicAdd reads them.
__global__ void unzeroed_histogram_kernel(int* out) {
    auto& bins = block_shared<int[4]>();
    atomicAdd(&bins[threadIdx.x % 4], 1);
    __syncthreads();
    if (threadIdx.x < 4) out[threadIdx.x] = bins[threadIdx.x];
}

// The same with the bins zeroed first.
__global__ void zeroed_histogram_kernel(int* out) {
    auto& bins = block_shared<int[4]>();
    if (threadIdx.x < 4) bins[threadIdx.x] = 0;
    __syncthreads();
    atomicAdd(&bins[threadIdx.x % 4], 1);
    __syncthreads();
    if (threadIdx.x < 4) out[threadIdx.x] = bins[threadIdx.x];
}

// Rows of 32 bytes, which Clang copies with llvm.memcpy (the checker sees
// those through its copy hooks: shared_check.hpp).
struct Row {
    float v[8];
};

struct Rows {
    Row rows[64];
    Row zeros[64];
    Row moved[64];
};

// Correct: each thread writes its rows by struct assignment, by zeroing and
// by std::memmove, then after the barrier reads another warp's row element
// by element and copies it out whole.
__global__ void row_copies_kernel(Row* out, float* sums, const Row* in) {  // (64)
    auto& s = block_shared<Rows>();
    const unsigned t = threadIdx.x, j = (t + 32) % 64;
    s.rows[t] = in[t];
    s.zeros[t] = Row{};
    std::memmove(&s.moved[t], &in[t], sizeof(Row));
    __syncthreads();
    float sum = 0.0f;
    for (int k = 0; k < 8; ++k) sum += s.rows[j].v[k] + s.zeros[j].v[k] - s.moved[j].v[k];
    sums[t] = sum;
    out[t] = s.rows[j];
}

// Broken: copies out rows no thread wrote. The line the report must name:
constexpr unsigned unwritten_row_copy_line = __LINE__ + 3;
__global__ void unwritten_row_copy_kernel(Row* out) {  // (64)
    auto& s = block_shared<Rows>();
    out[threadIdx.x] = s.rows[threadIdx.x];
}

// Broken: copies out the other warp's row with only __syncwarp between (it
// orders the warp's own lanes). The lines the report must name:
constexpr unsigned row_race_write_line = __LINE__ + 4, row_race_read_line = __LINE__ + 6;
__global__ void row_copy_race_kernel(Row* out, const Row* in) {  // (64)
    auto& s = block_shared<Rows>();
    const unsigned t = threadIdx.x;
    s.rows[t] = in[t];
    __syncwarp();
    out[t] = s.rows[(t + 32) % 64];
}

// Broken: both warps copy into the same rows between barriers.
constexpr unsigned row_write_race_line = __LINE__ + 3;
__global__ void row_copy_write_race_kernel(const Row* in) {  // (64)
    auto& s = block_shared<Rows>();
    s.rows[threadIdx.x % 32] = in[threadIdx.x];
    __syncthreads();
}
#endif

}  // namespace

TEST_CASE("the emulated device states H200 limits", "[emulated]") {
    int count = 0;
    REQUIRE(cudaGetDeviceCount(&count) == cudaSuccess);
    CHECK(count == 1);
    cudaDeviceProp prop{};
    REQUIRE(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
    CHECK(std::string(prop.name).find("emulated") != std::string::npos);
    CHECK(prop.maxThreadsPerBlock == 1024);
    CHECK(prop.sharedMemPerBlockOptin == 227 * 1024);
    CHECK(prop.multiProcessorCount == 132);
    CHECK(prop.major == 9);
}

TEST_CASE("every thread sees its own built-in variables", "[emulated]") {
    const dim3 grid(3, 2, 2), block(4, 3, 5);
    const std::size_t threads = 3 * 2 * 2 * 4 * 3 * 5;
    DeviceArray<unsigned> out(12 * threads);
    launch<builtins_kernel>(grid, block, 0, nullptr, out.p);
    const auto v = out.get();
    std::size_t bad = 0;
    for (unsigned bz = 0; bz < 2; ++bz)
        for (unsigned by = 0; by < 2; ++by)
            for (unsigned bx = 0; bx < 3; ++bx)
                for (unsigned tz = 0; tz < 5; ++tz)
                    for (unsigned ty = 0; ty < 3; ++ty)
                        for (unsigned tx = 0; tx < 4; ++tx) {
                            const std::size_t b = bx + 3 * (by + 2 * bz), t = tx + 4 * (ty + 3 * tz);
                            const unsigned* o = v.data() + 12 * (b * 60 + t);
                            const unsigned want[12] = {tx, ty, tz, bx, by, bz, 4, 3, 5, 3, 2, 2};
                            for (int i = 0; i < 12; ++i) bad += o[i] == want[i] ? 0 : 1;
                        }
    CHECK(bad == 0);
}

TEST_CASE("a barrier orders shared memory, and each block has its own", "[emulated]") {
    DeviceArray<int> out(8 * 256);
    launch<rotate_kernel>(8, 256, 0, nullptr, out.p);
    const auto v = out.get();
    for (int b = 0; b < 8; ++b)
        for (int t = 0; t < 256; ++t) CHECK(v[b * 256 + t] == (t + 1) % 256 + 1);
}

TEST_CASE("__syncthreads_count, _and and _or reduce over the block", "[emulated]") {
    DeviceArray<int> out(3);
    launch<barrier_reductions_kernel>(1, 200, 0, nullptr, out.p);
    const auto v = out.get();
    CHECK(v[0] == 67);  // 0, 3, ..., 198
    CHECK(v[1] == 1);
    CHECK(v[2] == 1);
}

void run_shuffle(Mode m, int* out, int arg, int width) {
    switch (m) {
        case Mode::idx: launch<shuffle_kernel<Mode::idx>>(1, 32, 0, nullptr, out, arg, width); break;
        case Mode::up: launch<shuffle_kernel<Mode::up>>(1, 32, 0, nullptr, out, arg, width); break;
        case Mode::down: launch<shuffle_kernel<Mode::down>>(1, 32, 0, nullptr, out, arg, width); break;
        case Mode::bfly: launch<shuffle_kernel<Mode::bfly>>(1, 32, 0, nullptr, out, arg, width); break;
    }
}

TEST_CASE("shuffles read the source lanes CUDA documents, for every width", "[emulated]") {
    DeviceArray<int> out(32);
    for (Mode m : {Mode::idx, Mode::up, Mode::down, Mode::bfly}) {
        for (int width : {32, 16, 8, 4, 2, 1}) {
            for (int arg : {0, 1, 3, 5, 17, 31}) {
                run_shuffle(m, out.p, arg, width);
                const auto v = out.get();
                for (int l = 0; l < 32; ++l) {
                    INFO("mode " << static_cast<int>(m) << ", width " << width << ", arg " << arg << ", lane " << l);
                    CHECK(v[l] == 100 + expected_source(m, l, arg, width));
                }
            }
        }
    }
}

TEST_CASE("votes, match and reduce see the whole warp", "[emulated]") {
    DeviceArray<unsigned> out(6 * 64);
    launch<votes_kernel>(1, 64, 0, nullptr, out.p);
    const auto v = out.get();
    unsigned ballot = 0;
    for (unsigned l = 0; l < 32; l += 5) ballot |= 1U << l;
    for (unsigned t = 0; t < 64; ++t) {
        const unsigned lane = t % 32;
        INFO("thread " << t);
        CHECK(v[6 * t + 0] == ballot);
        CHECK(v[6 * t + 1] == 1);
        CHECK(v[6 * t + 2] == 0);
        CHECK(v[6 * t + 3] == 0xFFU << (8 * (lane / 8)));
        CHECK(v[6 * t + 4] == 31 * 32 / 2);
        CHECK(v[6 * t + 5] == 24);
    }
}

TEST_CASE("atomics from every block add up", "[emulated]") {
    DeviceArray<unsigned> counter(1);
    DeviceArray<int> maximum(1);
    DeviceArray<float> sum(1);
    snug::cuda::check(cudaMemset(counter.p, 0, 4));
    snug::cuda::check(cudaMemset(maximum.p, 0, 4));
    snug::cuda::check(cudaMemset(sum.p, 0, 4));
    launch<atomics_kernel>(64, 96, 0, nullptr, counter.p, maximum.p, sum.p);
    CHECK(counter.get()[0] == 64 * 96);
    CHECK(maximum.get()[0] == 64 * 96 - 1);
    CHECK(sum.get()[0] == 64 * 96 * 0.5f);
}

TEST_CASE("dynamic shared memory past 48 KiB needs the kernel's attribute raised", "[emulated]") {
    const int n = 15 * 1024;  // 60 KiB of floats
    DeviceArray<float> out(1);
    CHECK_THROWS_WITH(launch<big_dynamic_kernel>(1, 256, n * sizeof(float), nullptr, out.p, n),
                      Contains("big_dynamic_kernel") && Contains("61440 bytes of dynamic shared memory") &&
                          Contains("cudaFuncAttributeMaxDynamicSharedMemorySize"));
    REQUIRE(cudaFuncSetAttribute(big_dynamic_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, n * 4) ==
            cudaSuccess);
    launch<big_dynamic_kernel>(1, 256, n * sizeof(float), nullptr, out.p, n);
    CHECK(out.get()[0] == float(n - 1));
    // More than the device's 227 KiB is refused outright.
    CHECK(cudaFuncSetAttribute(big_dynamic_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 240 * 1024) ==
          cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK(cudaDeviceReset() == cudaSuccess);
}

TEST_CASE("the emulated device takes another card's limits, and device_facts sees them", "[emulated]") {
    using snug::cuda::emulated::set_device_limits;
    set_device_limits({82, 99 * 1024});  // an RTX 3090's (sm_86)
    cudaDeviceProp prop{};
    REQUIRE(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
    CHECK(prop.sharedMemPerBlockOptin == 99 * 1024);
    CHECK(prop.multiProcessorCount == 82);
    int optin = 0;
    REQUIRE(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0) == cudaSuccess);
    CHECK(optin == 99 * 1024);
    const snug::cuda::DeviceFacts facts = snug::cuda::device_facts();
    CHECK(facts.multiprocessors == 82);
    CHECK(facts.shared_per_block_optin == 99 * 1024);
    // A kernel may opt in to the card's 99 KiB, not more.
    CHECK(cudaFuncSetAttribute(big_dynamic_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024) ==
          cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK(cudaFuncSetAttribute(big_dynamic_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 99 * 1024) ==
          cudaSuccess);
    // Limits the emulator cannot give are refused.
    CHECK_THROWS_AS(set_device_limits({0, 99 * 1024}), std::invalid_argument);
    CHECK_THROWS_AS(set_device_limits({82, 228 * 1024}), std::invalid_argument);
    CHECK(snug::cuda::device_facts().shared_per_block_optin == 99 * 1024);
    set_device_limits({});  // an H200's again
    CHECK(snug::cuda::device_facts().shared_per_block_optin == 227 * 1024);
    CHECK(snug::cuda::device_facts().multiprocessors == 132);
    CHECK(cudaDeviceReset() == cudaSuccess);
}

TEST_CASE("launch refuses what the device would, naming the kernel", "[emulated]") {
    DeviceArray<int> out(1);
    CHECK_THROWS_WITH(launch<trap_kernel>(1, 1025, 0, nullptr, out.p),
                      Contains("trap_kernel") && Contains("block x = 1025 is more than the device's 1024"));
    CHECK_THROWS_WITH(launch<trap_kernel>(1, dim3(32, 32, 2), 0, nullptr, out.p),
                      Contains("2048 threads per block are more than the device's 1024"));
    CHECK_THROWS_WITH(launch<trap_kernel>(dim3(1, 70000), 1, 0, nullptr, out.p),
                      Contains("grid y = 70000 is more than the device's 65535"));
    CHECK_THROWS_WITH(launch<trap_kernel>(0, 32, 0, nullptr, out.p), Contains("a grid dimension (x) is 0"));
    CHECK(cudaGetLastError() == cudaSuccess);  // refused before the runtime saw them
}

TEST_CASE("a launch recorder gets each launch the device would take, and nothing runs", "[emulated]") {
    using snug::cuda::emulated::KernelLaunch;
    static std::vector<KernelLaunch> seen;  // a recorder is a plain function: no captures
    seen.clear();
    DeviceArray<int> out(1);
    snug::cuda::emulated::set_launch_recorder([](const KernelLaunch& l) { seen.push_back(l); });
    launch<trap_kernel>(dim3(1, 2), 64, 128, nullptr, out.p);  // would write out[0] if it ran
    CHECK_THROWS(launch<trap_kernel>(1, 1025, 0, nullptr, out.p));  // refused before the recorder
    snug::cuda::emulated::set_launch_recorder(nullptr);
    REQUIRE(seen.size() == 1);
    CHECK(seen[0].kernel == snug::cuda::kernel_name<trap_kernel>());
    CHECK(seen[0].entry == reinterpret_cast<const void*>(trap_kernel));
    CHECK((seen[0].grid.x == 1 && seen[0].grid.y == 2 && seen[0].block.x == 64 && seen[0].dynamic_shared == 128));
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(out.get()[0] == -1);  // untouched: still the poison
    launch<trap_kernel>(1, 1, 0, nullptr, out.p);  // with the recorder gone, kernels run again
    CHECK(out.get()[0] == 1);
}

TEST_CASE("device memory: copies outside an allocation fail, fresh memory is poisoned", "[emulated]") {
    float* p = nullptr;
    REQUIRE(cudaMalloc(&p, 64) == cudaSuccess);
    std::vector<float> host(32, 1.0f);
    CHECK(cudaMemcpy(p, host.data(), 128, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaSuccess);  // not sticky
    CHECK(cudaMemcpy(host.data(), p, 64, cudaMemcpyDeviceToHost) == cudaSuccess);
    std::uint32_t bits = 0;
    std::memcpy(&bits, host.data(), 4);
    CHECK(bits == 0xFFFF'FFFFU);
    CHECK(cudaFree(p) == cudaSuccess);
    CHECK(cudaFree(p) == cudaErrorInvalidValue);  // twice
    (void)cudaGetLastError();
}

TEST_CASE("shared memory is fresh and poisoned in every block", "[emulated]") {
    DeviceArray<float> out(4);
    if constexpr (!snug::cuda::emulated::shared_checks) {
        // Without the checker the kernel reads the poison: NaN, 0xFFFFFFFF.
        launch<unwritten_shared_kernel>(1, 4, 0, nullptr, out.p);
        for (float f : out.get()) {
            std::uint32_t bits = 0;
            std::memcpy(&bits, &f, 4);
            CHECK(bits == 0xFFFF'FFFFU);
        }
    } else {
        // With it, the read is a fault naming the kernel, the thread and the line.
        const std::string m = fault_of([&] { launch<unwritten_shared_kernel>(1, 4, 0, nullptr, out.p); });
        CHECK_THAT(m, Contains("unwritten_shared_kernel") && Contains("thread (0, 0, 0)") &&
                          Contains("no thread of the block has written") && Contains("simt_test.cpp:"));
    }
}

TEST_CASE("cp.async writes shared memory at the wait, not at the issue", "[emulated]") {
    DeviceArray<float> before(64), after(64), src(64);
    std::vector<float> values(64);
    for (int i = 0; i < 64; ++i) values[static_cast<std::size_t>(i)] = 0.5f + static_cast<float>(i);
    snug::cuda::check(cudaMemcpy(src.p, values.data(), 64 * sizeof(float), cudaMemcpyHostToDevice));
    if constexpr (!snug::cuda::emulated::shared_checks) {
        launch<async_copy_lands_at_wait_kernel>(1, 64, 0, nullptr, before.p, after.p, src.p);
        const std::vector<float> b = before.get(), a = after.get();
        for (std::size_t i = 0; i < 64; ++i) {
            CHECK(b[i] == -1.0f);
            CHECK(a[i] == values[i]);
        }
    } else {
        // The checker reports the read before the wait, naming the copy's line.
        const std::string m =
            fault_of([&] { launch<async_copy_lands_at_wait_kernel>(1, 64, 0, nullptr, before.p, after.p, src.p); });
        CHECK_THAT(m, Contains("async_copy_lands_at_wait_kernel") && Contains("thread (0, 0, 0)") &&
                          Contains("shared memory its own cp.async at simt_test.cpp:") &&
                          Contains("has not written yet"));
    }
}

TEST_CASE("detector: a cp.async to a misaligned shared address", "[emulated][fault]") {
    DeviceArray<float> src(8);
    const std::string m = fault_of([&] { launch<misaligned_async_copy_kernel>(1, 1, 0, nullptr, src.p); });
    CHECK_THAT(m, Contains("misaligned_async_copy_kernel") && Contains("thread (0, 0, 0)") &&
                      Contains("cp.async of 16 bytes at ") && Contains("simt_test.cpp:") &&
                      Contains(": an address not aligned to 16 bytes"));
}

TEST_CASE("detector: a barrier reached at different call sites", "[emulated][fault]") {
    DeviceArray<int> out(64);
    const std::string m = fault_of([&] { launch<barriers_at_two_sites_kernel>(2, 64, 0, nullptr, out.p); });
    CHECK_THAT(m, Contains("barriers_at_two_sites_kernel") && Contains("block (0, 0, 0)") &&
                      Contains("thread (32, 0, 0)") && Contains("a block's threads must reach the same barrier") &&
                      Contains("simt_test.cpp:"));
}

TEST_CASE("detector: a barrier not reached by every live thread", "[emulated][fault]") {
    DeviceArray<int> out(64);
    const std::string m = fault_of([&] { launch<barrier_against_syncwarp_kernel>(1, 64, 0, nullptr, out.p); });
    CHECK_THAT(m, Contains("barrier_against_syncwarp_kernel") && Contains("is reached by 2 of 64 live threads") &&
                      Contains("thread (1, 0, 0)") && Contains("waits at __syncwarp"));
}

TEST_CASE("detector: a barrier that some of the block's threads skip by exiting", "[emulated][fault]") {
    // Warp 0 split: lanes 0-15 wait at the barrier (thread 0 arrives first), lane 16 exits.
    DeviceArray<int> out(64);
    const std::string split = fault_of([&] { launch<barrier_after_exit_kernel>(1, 64, 0, nullptr, out.p); });
    CHECK_THAT(split, Contains("barrier_after_exit_kernel") && Contains("thread (16, 0, 0)") &&
                          Contains("exited while thread (0, 0, 0) waits at __syncthreads") &&
                          Contains("simt_test.cpp:") && Contains("a barrier must be reached by every thread"));
    DeviceArray<int> out2(64);  // after the reset: out's memory went with it
    const std::string warps = fault_of([&] { launch<barrier_after_warp_exit_kernel>(1, 64, 0, nullptr, out2.p); });
    CHECK_THAT(warps, Contains("barrier_after_warp_exit_kernel") &&
                          Contains("a barrier must be reached by every thread"));
}

TEST_CASE("threads may exit once every thread has passed the barrier", "[emulated]") {
    DeviceArray<int> out(64);
    launch<exit_after_barrier_kernel>(1, 64, 0, nullptr, out.p);
    const auto v = out.get();
    for (int t = 0; t < 16; ++t) CHECK(v[t] == 1);
}

TEST_CASE("detector: a warp collective whose mask names lanes that never arrive", "[emulated][fault]") {
    DeviceArray<int> out(32);
    const std::string m = fault_of([&] { launch<half_warp_shuffle_kernel>(1, 32, 0, nullptr, out.p); });
    CHECK_THAT(m, Contains("half_warp_shuffle_kernel") && Contains("thread (16, 0, 0)") &&
                      Contains("exited while lane 0 waits at __shfl_sync") && Contains("mask 0xffffffff"));
}

TEST_CASE("detector: a mask that leaves out the calling lane", "[emulated][fault]") {
    DeviceArray<int> out(32);
    const std::string m = fault_of([&] { launch<mask_without_caller_kernel>(1, 32, 0, nullptr, out.p); });
    CHECK_THAT(m, Contains("thread (1, 0, 0)") && Contains("with mask 0x00000001, which does not name the calling lane 1"));
}

TEST_CASE("detector: a shuffle that reads a lane outside its mask", "[emulated][fault]") {
    DeviceArray<int> out(32);
    const std::string m = fault_of([&] { launch<shuffle_outside_mask_kernel>(1, 32, 0, nullptr, out.p); });
    CHECK_THAT(m, Contains("shuffle_outside_mask_kernel") && Contains("thread (0, 0, 0)") &&
                      Contains("reads lane 20, which is not in the mask 0x0000ffff"));
}

TEST_CASE("detector: one block_shared type claimed at two places of a kernel", "[emulated][fault]") {
    DeviceArray<float> out(8);
    const std::string m = fault_of([&] { launch<shared_type_twice_kernel>(1, 8, 0, nullptr, out.p); });
    CHECK_THAT(m, Contains("shared_type_twice_kernel") && Contains("block_shared<float") &&
                      Contains("8]>() is called at simt_test.cpp:") && Contains("on the device both name one object"));
}

TEST_CASE("detector: __trap, reported for the lowest faulting block", "[emulated][fault]") {
    DeviceArray<int> out(16);
    const std::string m = fault_of([&] { launch<trap_kernel>(16, 32, 0, nullptr, out.p); });
    CHECK_THAT(m, Contains("trap_kernel") && Contains("block (5, 0, 0)") && Contains("__trap() called"));
}

#if defined(SNUG_EMULATED_SHARED_CHECKS)
TEST_CASE("detector: two warps write one shared word between barriers", "[emulated][fault][checker]") {
    DeviceArray<int> out(64);
    const std::string m = fault_of([&] { launch<write_race_kernel>(1, 64, 0, nullptr, out.p); });
    CHECK_THAT(m, Contains("write_race_kernel") && Contains("race on shared memory: writes at simt_test.cpp:") &&
                      Contains("what thread (0, 0, 0) wrote") && Contains("block_shared<int"));
}

TEST_CASE("detector: a read of another warp's write with no barrier between", "[emulated][fault][checker]") {
    DeviceArray<int> out(64);
    const std::string m = fault_of([&] { launch<read_race_kernel>(1, 64, 0, nullptr, out.p); });
    // Thread 0 reads byte 128 before thread 32 wrote it (an unwritten read);
    // either report names the kernel and the line.
    CHECK_THAT(m, Contains("read_race_kernel") && Contains("simt_test.cpp:"));
    CHECK((m.find("race on shared memory") != std::string::npos ||
           m.find("no thread of the block has written") != std::string::npos));
}

TEST_CASE("detector: __syncwarp orders only the lanes its mask names", "[emulated][fault][checker]") {
    DeviceArray<int> out(32);
    const std::string m = fault_of([&] { launch<half_warp_sync_race_kernel>(1, 32, 0, nullptr, out.p); });
    CHECK_THAT(m, Contains("half_warp_sync_race_kernel") && Contains("race on shared memory: reads at simt_test.cpp:") &&
                      Contains("with no barrier between"));
    DeviceArray<int> out2(32);  // after the reset
    launch<half_warp_sync_kernel>(1, 32, 0, nullptr, out2.p);
    const auto v = out2.get();
    for (int l = 0; l < 32; ++l) CHECK(v[static_cast<std::size_t>(l)] == (l ^ 1));
}

TEST_CASE("the checker accepts a cp.async destination read after its wait", "[emulated][checker]") {
    DeviceArray<float> out(64), src(64);
    std::vector<float> values(64);
    for (int i = 0; i < 64; ++i) values[static_cast<std::size_t>(i)] = 1.5f * static_cast<float>(i);
    snug::cuda::check(cudaMemcpy(src.p, values.data(), 64 * sizeof(float), cudaMemcpyHostToDevice));
    launch<async_copy_waited_kernel>(1, 64, 0, nullptr, out.p, src.p);
    CHECK(out.get() == values);
}

TEST_CASE("detector: an atomic on shared memory no thread wrote", "[emulated][fault][checker]") {
    DeviceArray<int> out(4);
    const std::string m = fault_of([&] { launch<unzeroed_histogram_kernel>(1, 64, 0, nullptr, out.p); });
    CHECK_THAT(m, Contains("unzeroed_histogram_kernel") && Contains("an atomic at simt_test.cpp:") &&
                      Contains("no thread of the block has written"));
    DeviceArray<int> out2(4);
    launch<zeroed_histogram_kernel>(1, 64, 0, nullptr, out2.p);
    for (int v : out2.get()) CHECK(v == 16);
}

TEST_CASE("the checker accepts accesses ordered by barriers and warp collectives", "[emulated][checker]") {
    DeviceArray<int> out(64);
    launch<ordered_by_barriers_kernel>(1, 64, 0, nullptr, out.p);
    for (int v : out.get()) CHECK(v == 3);
}

// Struct copies (llvm.memcpy), zeroing (memset) and std::memmove into and
// out of shared memory are seen (issue 39, hole 1): before, the correct kernel
// was reported (its element reads found rows no load had written) and the
// broken ones were not.
TEST_CASE("the checker accepts rows written by struct copies and read after the barrier", "[emulated][checker]") {
    DeviceArray<Row> in(64), out(64);
    DeviceArray<float> sums(64);
    std::vector<Row> rows(64);
    for (std::size_t t = 0; t < 64; ++t)
        for (std::size_t k = 0; k < 8; ++k) rows[t].v[k] = static_cast<float>(t) + 0.125f * static_cast<float>(k);
    snug::cuda::check(cudaMemcpy(in.p, rows.data(), 64 * sizeof(Row), cudaMemcpyHostToDevice));
    launch<row_copies_kernel>(1, 64, 0, nullptr, out.p, sums.p, in.p);
    const std::vector<Row> got = out.get();
    const std::vector<float> s = sums.get();
    for (std::size_t t = 0; t < 64; ++t) {
        CHECK(std::memcmp(&got[t], &rows[(t + 32) % 64], sizeof(Row)) == 0);
        CHECK(s[t] == 0.0f);
    }
}

TEST_CASE("detector: a struct copy out of shared memory no thread wrote", "[emulated][fault][checker]") {
    DeviceArray<Row> out(64);
    const std::string m = fault_of([&] { launch<unwritten_row_copy_kernel>(1, 64, 0, nullptr, out.p); });
    CHECK_THAT(m, Contains("unwritten_row_copy_kernel") && Contains("thread (0, 0, 0)") &&
                      Contains("no thread of the block has written") &&
                      Contains("simt_test.cpp:" + std::to_string(unwritten_row_copy_line) + " "));
}

TEST_CASE("detector: struct copies racing on shared memory", "[emulated][fault][checker]") {
    DeviceArray<Row> in(64), out(64);
    const std::string read = fault_of([&] { launch<row_copy_race_kernel>(1, 64, 0, nullptr, out.p, in.p); });
    CHECK_THAT(read, Contains("row_copy_race_kernel") && Contains("thread (0, 0, 0)") &&
                         Contains("race on shared memory: reads at simt_test.cpp:" +
                                  std::to_string(row_race_read_line) + " ") &&
                         Contains("what thread (32, 0, 0) wrote at simt_test.cpp:" +
                                  std::to_string(row_race_write_line) + " "));
    DeviceArray<Row> in2(64);  // after the reset
    const std::string write = fault_of([&] { launch<row_copy_write_race_kernel>(1, 64, 0, nullptr, in2.p); });
    CHECK_THAT(write, Contains("row_copy_write_race_kernel") && Contains("thread (32, 0, 0)") &&
                          Contains("race on shared memory: writes at simt_test.cpp:" +
                                   std::to_string(row_write_race_line) + " ") &&
                          Contains("what thread (0, 0, 0) wrote at simt_test.cpp:" +
                                   std::to_string(row_write_race_line) + " "));
}
#endif
