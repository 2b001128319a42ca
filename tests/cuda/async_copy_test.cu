// cp.async (snug/cuda/async_copy.hpp): copies of 16 and 4 bytes from global
// to shared memory land by the wait that covers their group, zero-filled
// where the source is marked invalid; wait<1> leaves only the newest group in
// flight. Fresh random inputs, poisoned outputs, expected values written out
// here. Emulated everywhere (the deferred copies of the emulator) and on a GPU
// where one exists (the inline PTX).
#include <catch2/catch.hpp>

#include <cstddef>
#include <vector>

#include "snug/cuda/async_copy.hpp"
#include "snug/cuda/launch.hpp"
#include "snug/cuda/shared_memory.hpp"
#include "snug/snug.hpp"
#include "support/cuda_support.hpp"

using snug::MemoryTracker;
using namespace snug::test;

namespace {

constexpr int copy_threads = 64;

// Thread t copies 16 bytes of `a` (group 0), then 16 bytes of `b` and 4 of
// `c` (group 1), each zero-filled for t >= valid; after wait<1> and a barrier
// it reads thread 63 - t's piece of a, after wait<0> and a barrier those of b
// and c.
__global__ void async_copy_kernel(float* out_a,      // (64, 4)
                                  float* out_b,      // (64, 4)
                                  float* out_c,      // (64)
                                  const float* a,    // (64, 4)
                                  const float* b,    // (64, 4)
                                  const float* c,    // (64)
                                  int valid) {
    struct Tiles {
        alignas(16) float a[copy_threads][4];
        alignas(16) float b[copy_threads][4];
        float c[copy_threads];
    };
    Tiles& s = snug::cuda::block_shared<Tiles>();
    const int t = static_cast<int>(threadIdx.x);
    const bool in = t < valid;
    const int src = in ? t : 0;
    snug::cuda::cp_async<16>(s.a[t], a + 4 * src, in);
    snug::cuda::cp_async_commit();
    snug::cuda::cp_async<16>(s.b[t], b + 4 * src, in);
    snug::cuda::cp_async<4>(&s.c[t], c + src, in);
    snug::cuda::cp_async_commit();
    snug::cuda::cp_async_wait<1>();  // group 0 has landed
    __syncthreads();
    const int u = copy_threads - 1 - t;
    for (int i = 0; i < 4; ++i) out_a[4 * u + i] = s.a[u][i];
    snug::cuda::cp_async_wait<0>();
    __syncthreads();
    for (int i = 0; i < 4; ++i) out_b[4 * u + i] = s.b[u][i];
    out_c[u] = s.c[u];
}

}  // namespace

TEST_CASE("cp.async copies land by their group's wait, zero-filled where invalid", "[cuda][async_copy]") {
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    MemoryTracker tracker;
    const int valid = 37;
    const auto a = random_values<float>(rng, 4 * copy_threads, -2.0f, 2.0f);
    const auto b = random_values<float>(rng, 4 * copy_threads, -2.0f, 2.0f);
    const auto c = random_values<float>(rng, copy_threads, -2.0f, 2.0f);
    auto a_d = to_device(tracker, a), b_d = to_device(tracker, b), c_d = to_device(tracker, c);
    auto out_a = poisoned<float>(tracker, 4 * copy_threads);
    auto out_b = poisoned<float>(tracker, 4 * copy_threads);
    auto out_c = poisoned<float>(tracker, copy_threads);
    snug::cuda::launch<async_copy_kernel>(1, copy_threads, 0, nullptr, out_a.data(), out_b.data(), out_c.data(),
                                          a_d.data(), b_d.data(), c_d.data(), valid);
    const auto got_a = to_host(out_a), got_b = to_host(out_b), got_c = to_host(out_c);
    for (int t = 0; t < copy_threads; ++t) {
        INFO("thread " << t);
        const bool in = t < valid;
        for (int i = 0; i < 4; ++i) {
            const auto k = static_cast<std::size_t>(4 * t + i);
            CHECK(got_a[k] == (in ? a[k] : 0.0f));
            CHECK(got_b[k] == (in ? b[k] : 0.0f));
        }
        const auto k = static_cast<std::size_t>(t);
        CHECK(got_c[k] == (in ? c[k] : 0.0f));
    }
}
