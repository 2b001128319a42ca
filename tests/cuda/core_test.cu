// The core on the device, against the host: 16-bit float conversions (every
// half and bfloat16 bit pattern, millions of fresh random floats), Philox
// streams, tracked device buffers and the activation arena, and the error
// checks. Runs only where a GPU exists (tests/cuda/main.cpp exits 77 otherwise).
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "snug/snug.hpp"
#include "support/cuda_support.hpp"

using Catch::Matchers::Contains;
using snug::Cuda;
using snug::MemoryCategory;
using snug::MemoryTracker;
using snug::test::fresh_seed;

namespace {

constexpr int threads_per_block = 256;

unsigned blocks_for(std::size_t n) {
    return static_cast<unsigned>((n + threads_per_block - 1) / threads_per_block);
}

// Device scratch memory for one test, tracked like any other buffer.
template <class T>
snug::Buffer<T, Cuda> device_buffer(MemoryTracker& tracker, std::size_t count, const char* what) {
    return snug::Buffer<T, Cuda>(tracker, MemoryCategory::temporaries, count, what);
}

// Fills device memory with the byte `value`, so that a kernel that writes
// nothing leaves a pattern no correct result has.
void poison(void* p, std::size_t bytes, int value) {
    snug::cuda::check(cudaMemset(p, value, bytes));
}

// ---- kernels, each followed by its launcher -----------------------------------

// Widens every 16-bit pattern: out[b] = bits of the float that pattern b means.
__global__ void widen_all_kernel(std::uint32_t* half_out,  // (65536)
                                 std::uint32_t* bf16_out)  // (65536)
{
    const unsigned b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= 65536u) return;
    const auto bits = static_cast<std::uint16_t>(b);
    half_out[b] = __float_as_uint(static_cast<float>(snug::half::from_bits(bits)));
    bf16_out[b] = __float_as_uint(snug::bfloat16_bits_to_float(bits));
}

void widen_all(std::uint32_t* half_out, std::uint32_t* bf16_out) {
    snug::cuda::launch<widen_all_kernel>(blocks_for(65536), threads_per_block, 0, nullptr, half_out, bf16_out);
}

// Narrows floats to half and bfloat16 bits, round to nearest even.
__global__ void narrow_kernel(const float* in,            // (n)
                              std::uint16_t* half_out,    // (n)
                              std::uint16_t* bf16_out,    // (n)
                              std::size_t n) {
    for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
         i += std::size_t{gridDim.x} * blockDim.x) {
        half_out[i] = snug::half(in[i]).bits;
        bf16_out[i] = snug::float_to_bfloat16_bits(in[i]);
    }
}

void narrow(const float* in, std::uint16_t* half_out, std::uint16_t* bf16_out, std::size_t n) {
    snug::cuda::launch<narrow_kernel>(1024, threads_per_block, 0, nullptr, in, half_out, bf16_out, n);
}

// Elements first .. first + n - 1 of the Philox stream (seed, offset).
__global__ void philox_stream_kernel(std::uint64_t seed, std::uint64_t offset, std::uint64_t first,
                                     std::uint32_t* bits,  // (n)
                                     float* uniform,       // (n)
                                     std::size_t n) {
    const std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
    if (i >= n) return;
    bits[i] = snug::random_bits(seed, offset, first + i);
    uniform[i] = snug::random_uniform(seed, offset, first + i);
}

void philox_stream(std::uint64_t seed, std::uint64_t offset, std::uint64_t first, std::uint32_t* bits,
                   float* uniform, std::size_t n) {
    snug::cuda::launch<philox_stream_kernel>(blocks_for(n), threads_per_block, 0, nullptr, seed, offset, first, bits,
                                             uniform, n);
}

// One Philox4x32-10 block per thread, for known-answer vectors.
__global__ void philox_blocks_kernel(const snug::Philox4* counters,  // (n)
                                     const std::uint32_t* keys,      // (n, 2)
                                     snug::Philox4* out,             // (n)
                                     int n) {
    const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= n) return;
    out[i] = snug::philox4x32_10(counters[i], keys[2 * i], keys[2 * i + 1]);
}

void philox_blocks(const snug::Philox4* counters, const std::uint32_t* keys, snug::Philox4* out, int n) {
    snug::cuda::launch<philox_blocks_kernel>(1, threads_per_block, 0, nullptr, counters, keys, out, n);
}

// out[i] = in[i] * 2 + 1: proves device memory is readable and writable.
__global__ void affine_kernel(const float* in,  // (n)
                              float* out,       // (n)
                              std::size_t n) {
    const std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x;
    if (i < n) out[i] = in[i] * 2.0f + 1.0f;
}

void affine(const float* in, float* out, std::size_t n, cudaStream_t stream = nullptr,
            unsigned block = threads_per_block) {
    snug::cuda::launch<affine_kernel>(blocks_for(n), block, 0, stream, in, out, n);
}

// ---- host helpers ---------------------------------------------------------------

std::uint32_t float_bits(float f) { return std::bit_cast<std::uint32_t>(f); }
float bits_float(std::uint32_t b) { return std::bit_cast<float>(b); }

std::string hex(std::uint32_t v) {
    std::ostringstream out;
    out << "0x" << std::hex << v;
    return out.str();
}

// Floats at the edges of the 16-bit formats, with both signs: zeros,
// infinities, NaNs with different payloads, float subnormals, the largest
// finite values and the points where rounding reaches infinity, the smallest
// subnormals and the halfway points below them, and ties to even.
std::vector<float> edge_case_floats() {
    const std::uint32_t patterns[] = {
        0x0000'0000, 0x7F80'0000,                            // 0, inf
        0x7FC0'0000, 0x7F80'0001, 0x7FFF'FFFF, 0x7FA0'0000,  // NaNs: quiet, signalling, payloads
        0x0000'0001, 0x0000'0400, 0x007F'FFFF, 0x0080'0000,  // float subnormals, FLT_MIN
        0x3F80'0000,                                         // 1
        0x3F80'1000, 0x3F80'3000, 0x3F80'1001,               // 1 + 2^-11 (half tie, down), 1 + 3*2^-11 (up)
        0x3F80'8000, 0x3F81'8000, 0x3F80'8001,               // bfloat16 ties at 1 (down, up) and above
        0x477F'E000, 0x477F'EFFF, 0x477F'F000, 0x4780'0000,  // 65504, just below 65520, 65520, 65536
        0x3880'0000, 0x387F'C000,                            // half min normal 2^-14, max subnormal
        0x3380'0000, 0x3300'0000, 0x3300'0001, 0x32FF'FFFF,  // 2^-24, 2^-25 (tie to 0), just above/below
        0x33C0'0000, 0x3420'0000, 0x3440'0000,               // 1.5, 2.5, 3 units of 2^-24
        0x387F'E000, 0x387F'F000,                            // rounding up into the normal range
        0x7F7F'FFFF, 0x7F7F'7FFF, 0x7F7F'8000, 0x7F7E'8000,  // FLT_MAX, bf16 max region, ties
        0x0001'8000, 0x0000'8000, 0x0000'7FFF,               // bfloat16 subnormal ties
    };
    std::vector<float> out;
    for (std::uint32_t p : patterns) {
        out.push_back(bits_float(p));
        out.push_back(bits_float(p | 0x8000'0000u));
    }
    return out;
}

}  // namespace

TEST_CASE("every half and bfloat16 bit pattern widens on the device as on the host") {
    MemoryTracker scratch;
    auto half_out = device_buffer<std::uint32_t>(scratch, 65536, "half widened");
    auto bf16_out = device_buffer<std::uint32_t>(scratch, 65536, "bfloat16 widened");
    // 0xA5A5A5A5 has low bits set, so no widened 16-bit value has that pattern.
    poison(half_out.data(), half_out.bytes(), 0xA5);
    poison(bf16_out.data(), bf16_out.bytes(), 0xA5);
    widen_all(half_out.data(), bf16_out.data());
    std::vector<std::uint32_t> half_bits(65536), bf16_bits(65536);
    snug::cuda::copy_to_host(half_bits.data(), half_out.data(), 65536);
    snug::cuda::copy_to_host(bf16_bits.data(), bf16_out.data(), 65536);

    int half_mismatches = 0, bf16_mismatches = 0, half_nans = 0;
    for (std::uint32_t b = 0; b < 65536; ++b) {
        const auto bits = static_cast<std::uint16_t>(b);
        const float half_host = snug::half_bits_to_float(bits);
        const float bf16_host = snug::bfloat16_bits_to_float(bits);
        const bool half_ok = std::isnan(half_host) ? std::isnan(bits_float(half_bits[b]))
                                                   : float_bits(half_host) == half_bits[b];
        const bool bf16_ok = std::isnan(bf16_host) ? std::isnan(bits_float(bf16_bits[b]))
                                                   : float_bits(bf16_host) == bf16_bits[b];
        half_nans += std::isnan(half_host) ? 1 : 0;
        if (!half_ok && ++half_mismatches <= 5)
            FAIL_CHECK("half " << hex(b) << ": device " << hex(half_bits[b]) << ", host " << hex(float_bits(half_host)));
        if (!bf16_ok && ++bf16_mismatches <= 5)
            FAIL_CHECK("bfloat16 " << hex(b) << ": device " << hex(bf16_bits[b]) << ", host "
                                   << hex(float_bits(bf16_host)));
    }
    CHECK(half_mismatches == 0);
    CHECK(bf16_mismatches == 0);
    // 2 * (2^10 - 1) half patterns are NaN: the comparison above did see them.
    CHECK(half_nans == 2046);
}

TEST_CASE("float narrows to half and bfloat16 on the device as on the host") {
    const std::uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    // Random bit patterns cover every exponent, both signs, NaNs and subnormals.
    constexpr std::size_t random_count = std::size_t{1} << 22;
    std::vector<float> input;
    input.reserve(random_count + 128);
    snug::Generator rng(seed);
    for (std::size_t i = 0; i < random_count; ++i) input.push_back(bits_float(rng.next_u32()));
    // And the region where half is finite, densely: |x| < 2^17 with random mantissas.
    for (std::size_t i = 0; i < random_count / 4; ++i)
        input.push_back(bits_float((rng.next_u32() & 0x807F'FFFFu) | ((rng.below(50) + 94u) << 23)));
    for (float f : edge_case_floats()) input.push_back(f);
    const std::size_t n = input.size();

    MemoryTracker scratch;
    auto in = device_buffer<float>(scratch, n, "floats");
    auto half_out = device_buffer<std::uint16_t>(scratch, n, "half bits");
    auto bf16_out = device_buffer<std::uint16_t>(scratch, n, "bfloat16 bits");
    snug::cuda::copy_to_device(in.data(), std::span<const float>(input));
    // 0xFFFF is a NaN with the sign set; the host never produces it (NaN -> 0x7FFF).
    poison(half_out.data(), half_out.bytes(), 0xFF);
    poison(bf16_out.data(), bf16_out.bytes(), 0xFF);
    narrow(in.data(), half_out.data(), bf16_out.data(), n);
    std::vector<std::uint16_t> half_bits(n), bf16_bits(n);
    snug::cuda::copy_to_host(std::span<std::uint16_t>(half_bits), half_out.data());
    snug::cuda::copy_to_host(std::span<std::uint16_t>(bf16_bits), bf16_out.data());

    std::size_t half_mismatches = 0, bf16_mismatches = 0;
    for (std::size_t i = 0; i < n; ++i) {
        const std::uint16_t half_host = snug::float_to_half_bits(input[i]);
        const std::uint16_t bf16_host = snug::float_to_bfloat16_bits(input[i]);
        if (half_bits[i] != half_host && ++half_mismatches <= 5)
            FAIL_CHECK("float " << hex(float_bits(input[i])) << " -> half: device " << hex(half_bits[i])
                                << ", host " << hex(half_host));
        if (bf16_bits[i] != bf16_host && ++bf16_mismatches <= 5)
            FAIL_CHECK("float " << hex(float_bits(input[i])) << " -> bfloat16: device " << hex(bf16_bits[i])
                                << ", host " << hex(bf16_host));
    }
    CHECK(half_mismatches == 0);
    CHECK(bf16_mismatches == 0);
}

TEST_CASE("Philox4x32-10 on the device matches Random123's known-answer vectors") {
    // Random123 tests/kat_vectors, the three "philox4x32 10" lines: counter, key, result.
    const std::vector<snug::Philox4> counters{
        {{0, 0, 0, 0}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
    };
    const std::vector<std::uint32_t> keys{0, 0, 0xffffffff, 0xffffffff, 0xa4093822, 0x299f31d0};
    const snug::Philox4 expected[] = {
        {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    MemoryTracker scratch;
    auto counters_d = device_buffer<snug::Philox4>(scratch, 3, "counters");
    auto keys_d = device_buffer<std::uint32_t>(scratch, 6, "keys");
    auto out_d = device_buffer<snug::Philox4>(scratch, 3, "blocks");
    snug::cuda::copy_to_device(counters_d.data(), std::span<const snug::Philox4>(counters));
    snug::cuda::copy_to_device(keys_d.data(), std::span<const std::uint32_t>(keys));
    poison(out_d.data(), out_d.bytes(), 0xA5);
    philox_blocks(counters_d.data(), keys_d.data(), out_d.data(), 3);
    std::vector<snug::Philox4> out(3);
    snug::cuda::copy_to_host(std::span<snug::Philox4>(out), out_d.data());
    for (int k = 0; k < 3; ++k)
        for (int w = 0; w < 4; ++w) {
            INFO("vector " << k << ", word " << w);
            CHECK(out[static_cast<std::size_t>(k)].v[w] == expected[k].v[w]);
        }
}

TEST_CASE("Philox streams on the device equal the host's, element for element") {
    const std::uint64_t seed = fresh_seed();
    const std::uint64_t offset = fresh_seed();
    INFO("seed " << seed << ", offset " << offset);
    constexpr std::size_t n = std::size_t{1} << 20;
    MemoryTracker scratch;
    auto bits_d = device_buffer<std::uint32_t>(scratch, n, "bits");
    auto uniform_d = device_buffer<float>(scratch, n, "uniform");
    std::vector<std::uint32_t> bits(n);
    std::vector<float> uniform(n);
    // From 0, and across the point where the block counter's low word wraps
    // (index 2^34: block 2^32), which exercises the 64-bit counter.
    for (const std::uint64_t first : {std::uint64_t{0}, (std::uint64_t{1} << 34) - n / 2}) {
        INFO("first index " << first);
        // Poison with a pattern that is not a uniform in [0, 1).
        poison(bits_d.data(), bits_d.bytes(), 0xA5);
        poison(uniform_d.data(), uniform_d.bytes(), 0xFF);
        philox_stream(seed, offset, first, bits_d.data(), uniform_d.data(), n);
        snug::cuda::copy_to_host(std::span<std::uint32_t>(bits), bits_d.data());
        snug::cuda::copy_to_host(std::span<float>(uniform), uniform_d.data());
        std::size_t mismatches = 0;
        for (std::size_t i = 0; i < n; ++i) {
            const std::uint32_t host_bits = snug::random_bits(seed, offset, first + i);
            const float host_uniform = snug::random_uniform(seed, offset, first + i);
            const bool ok = bits[i] == host_bits && float_bits(uniform[i]) == float_bits(host_uniform);
            if (!ok && ++mismatches <= 5)
                FAIL_CHECK("index " << first + i << ": device " << hex(bits[i]) << " / " << uniform[i] << ", host "
                                    << hex(host_bits) << " / " << host_uniform);
        }
        CHECK(mismatches == 0);
    }
}

TEST_CASE("tracked device buffers record exact bytes and respect the budget") {
    snug::cuda::require_device();
    const std::size_t budget = std::size_t{512} << 20;
    MemoryTracker tracker(budget);
    const snug::cuda::DriverMemory before = snug::cuda::driver_memory();
    {
        // 256 MiB + 3 floats: an odd size, recorded to the byte.
        const std::size_t count = (std::size_t{64} << 20) + 3;
        snug::Buffer<float, Cuda> weights(tracker, MemoryCategory::parameters, count, "weights");
        CHECK(tracker.current(MemoryCategory::parameters) == count * 4);
        CHECK(tracker.current_total() == count * 4);
        REQUIRE(weights.data() != nullptr);
        CHECK(reinterpret_cast<std::uintptr_t>(weights.data()) % 256 == 0);

        // The driver sees the allocation: at least the tracked bytes more in use.
        const snug::cuda::DriverMemory during = snug::cuda::driver_memory();
        CHECK(during.total == before.total);
        CHECK(during.used == during.total - during.free);
        CHECK(during.used >= before.used + count * 4);
        CHECK(during.used >= tracker.current_total());

        const std::string report = snug::cuda::report_with_driver(tracker);
        INFO(report);
        CHECK(report.rfind(tracker.report(), 0) == 0);  // the tracker's report comes first
        CHECK_THAT(report, Contains("driver: ") && Contains(" used of ") &&
                               Contains("not seen by the tracker: "));

        // Over the budget: OutOfMemory before anything is allocated or recorded.
        CHECK_THROWS_AS((snug::Buffer<float, Cuda>(tracker, MemoryCategory::gradients, count, "gradients")),
                        snug::OutOfMemory);
        CHECK(tracker.current(MemoryCategory::gradients) == 0);
        CHECK(tracker.current_total() == count * 4);

        // The memory works: random values in, a kernel over them, the result out.
        const std::size_t n = 100'003;
        std::vector<float> host(n);
        snug::Generator rng(fresh_seed());
        for (float& x : host) x = rng.uniform() * 8.0f - 4.0f;
        auto result = device_buffer<float>(tracker, n, "result");
        snug::cuda::copy_to_device(weights.data(), std::span<const float>(host));
        poison(result.data(), result.bytes(), 0xFF);
        affine(weights.data(), result.data(), n);
        std::vector<float> back(n);
        snug::cuda::copy_to_host(std::span<float>(back), result.data());
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < n; ++i) wrong += back[i] == host[i] * 2.0f + 1.0f ? 0 : 1;
        CHECK(wrong == 0);
    }
    CHECK(tracker.current_total() == 0);
    CHECK(tracker.peak(MemoryCategory::parameters) == ((std::size_t{64} << 20) + 3) * 4);
}

TEST_CASE("a cudaMalloc the device cannot satisfy throws OutOfMemory with the driver's figures") {
    const std::size_t too_much = std::size_t{1} << 50;  // 1 PiB
    std::string message;
    try {
        void* p = Cuda::allocate(too_much);
        Cuda::deallocate(p);
    } catch (const snug::OutOfMemory& e) {
        message = e.what();
    }
    INFO(message);
    CHECK_THAT(message, Contains("cudaMalloc of 1.00 PiB") && Contains("free of") &&
                            Contains("cudaErrorMemoryAllocation"));
    // The failure leaves no error behind, and the device still allocates.
    CHECK(cudaGetLastError() == cudaSuccess);
    void* p = Cuda::allocate(1 << 20);
    CHECK(p != nullptr);
    Cuda::deallocate(p);

    // Through a tracked buffer with no budget: the record is undone.
    MemoryTracker tracker;
    CHECK_THROWS_AS((snug::Buffer<float, Cuda>(tracker, MemoryCategory::activations, too_much / 4, "huge")),
                    snug::OutOfMemory);
    CHECK(tracker.current_total() == 0);
    CHECK(Cuda::allocate(0) == nullptr);
}

TEST_CASE("the activation arena on the device: exact bytes, aligned pushes, budget") {
    MemoryTracker tracker(std::size_t{8} << 20);
    {
        snug::ActivationArena<Cuda> arena(tracker, std::size_t{1} << 20);
        float* x = arena.push<float>(1001, "x");
        auto* y = arena.push<snug::half>(333, "y");
        CHECK(tracker.current(MemoryCategory::activations) == 1001 * 4 + 333 * 2);
        CHECK(reinterpret_cast<std::uintptr_t>(x) % 256 == 0);
        CHECK(reinterpret_cast<std::uintptr_t>(y) % 256 == 0);
        // Larger than a chunk: gets its own.
        float* z = arena.push<float>(std::size_t{3} << 18, "z");  // 3 MiB
        CHECK(arena.chunk_count() == 2);
        CHECK(arena.reserved_bytes() >= (std::size_t{4} << 20));
        CHECK(tracker.current(MemoryCategory::activations) == 1001 * 4 + 333 * 2 + (std::size_t{3} << 20));

        // Pushed memory is device memory a kernel can use.
        std::vector<float> host(1001);
        snug::Generator rng(fresh_seed());
        for (float& v : host) v = rng.uniform() + 0.5f;
        snug::cuda::copy_to_device(x, std::span<const float>(host));
        poison(z, 1001 * 4, 0xFF);
        affine(x, z, 1001);
        std::vector<float> back(1001);
        snug::cuda::copy_to_host(std::span<float>(back), z);
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < host.size(); ++i) wrong += back[i] == host[i] * 2.0f + 1.0f ? 0 : 1;
        CHECK(wrong == 0);

        // Over the budget: OutOfMemory, nothing recorded, the stack unchanged.
        CHECK_THROWS_AS(arena.push<float>(std::size_t{2} << 20, "too much"), snug::OutOfMemory);
        CHECK(arena.depth() == 3);
        arena.pop(z);
        arena.pop(y);
        arena.pop(x);
        CHECK(tracker.current(MemoryCategory::activations) == 0);
        CHECK(tracker.peak(MemoryCategory::activations) == 1001 * 4 + 333 * 2 + (std::size_t{3} << 20));
    }
    CHECK(tracker.current_total() == 0);
}

TEST_CASE("copies check shapes and round-trip through the device on a stream") {
    cudaStream_t stream = nullptr;
    snug::cuda::check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const Cuda device{stream};
    MemoryTracker scratch;
    auto a = device_buffer<float>(scratch, 6 * 7, "a");
    auto b = device_buffer<float>(scratch, 6 * 7, "b");
    std::vector<float> host(6 * 7), back(6 * 7, -1.0f);
    snug::Generator rng(fresh_seed());
    for (float& v : host) v = rng.uniform() - 0.5f;

    const snug::TensorView<float, snug::Host> host_view(host.data(), {6, 7});
    const snug::TensorView<float, snug::Host> back_view(back.data(), {6, 7});
    const snug::TensorView<float, Cuda> a_view(a.data(), {6, 7});
    const snug::TensorView<const float, Cuda> b_view(b.data(), {6, 7});
    snug::cuda::copy_to_device(a_view, host_view, device.stream);
    affine(a.data(), b.data(), a.size(), device.stream);
    device.synchronize();
    snug::cuda::copy_to_host(back_view, b_view, device.stream);
    for (std::size_t i = 0; i < host.size(); ++i) CHECK(back[i] == host[i] * 2.0f + 1.0f);

    const snug::TensorView<float, Cuda> wrong(a.data(), {7, 6});
    CHECK_THROWS_AS(snug::cuda::copy_to_device(wrong, host_view), snug::ShapeError);
    CHECK_THROWS_WITH(snug::cuda::copy_to_host(back_view, wrong), Contains("(7, 6)") && Contains("(6, 7)"));
    snug::cuda::check(cudaStreamDestroy(stream));
}

TEST_CASE("failed CUDA calls and launches become CudaError naming this file") {
    MemoryTracker scratch;
    auto buffer = device_buffer<float>(scratch, 1024, "buffer");
    std::vector<float> host(1024, 1.5f);

    // A copy to a null device pointer is an invalid value.
    std::string message;
    const std::string line = std::to_string(__LINE__ + 2);
    try {
        snug::cuda::check(cudaMemcpy(nullptr, host.data(), 4096, cudaMemcpyHostToDevice));
    } catch (const snug::CudaError& e) {
        message = e.what();
    }
    INFO(message);
    CHECK_THAT(message, Contains("core_test.cu:" + line + ": ") && Contains("cudaErrorInvalidValue"));

    // The copy helpers name the caller's line too.
    CHECK_THROWS_WITH(snug::cuda::copy_to_device(static_cast<float*>(nullptr), host.data(), host.size()),
                      Contains("core_test.cu:"));

    // 4096 threads per block is more than any GPU allows: launch() refuses
    // it before the runtime sees it, naming the kernel and the limit.
    CHECK_THROWS_AS(affine(buffer.data(), buffer.data(), 1024, nullptr, 4096), snug::CudaError);
    CHECK_THROWS_WITH(affine(buffer.data(), buffer.data(), 1024, nullptr, 4096),
                      Contains("affine_kernel") && Contains("block (4096, 1, 1)") &&
                          Contains("block x = 4096 is more than the device's 1024"));
    // Neither error is sticky: the device still works.
    CHECK(cudaGetLastError() == cudaSuccess);
    snug::cuda::copy_to_device(buffer.data(), std::span<const float>(host));
    affine(buffer.data(), buffer.data(), 1024);
    std::vector<float> back(1024);
    snug::cuda::copy_to_host(std::span<float>(back), buffer.data());
    CHECK(back[0] == 4.0f);
    CHECK(back[1023] == 4.0f);
}

TEST_CASE("the launch observer sees each kernel and each matmul, before and after it is queued") {
    struct Counting : snug::cuda::LaunchObserver {
        int befores = 0, afters = 0;
        void before(cudaStream_t) override { ++befores; }
        void after(cudaStream_t) override {
            CHECK(afters + 1 == befores);  // each piece of work between its two calls
            ++afters;
        }
    };
    MemoryTracker tracker;
    snug::cuda::Blas blas(tracker);
    Cuda dev{};
    dev.blas = &blas;
    const int M = 4, N = 8, K = 16;
    auto a = device_buffer<float>(tracker, M * K, "a");
    auto b = device_buffer<float>(tracker, K * N, "b");
    auto c = device_buffer<float>(tracker, M * N, "c");
    snug::cuda::check(cudaMemset(a.data(), 0, a.bytes()));
    snug::cuda::check(cudaMemset(b.data(), 0, b.bytes()));
    Counting counting;
    snug::cuda::launch_observer() = &counting;
    snug::cuda::gelu_forward(dev, c.data(), c.data(), M * N);  // one kernel
    blas.matmul(nullptr, snug::cuda::Op::N, snug::cuda::Op::N, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f,
                c.data(), N);  // one matmul
    snug::cuda::launch_observer() = nullptr;
    snug::cuda::gelu_forward(dev, c.data(), c.data(), M * N);  // unseen
    CHECK(counting.befores == 2);
    CHECK(counting.afters == 2);
}
