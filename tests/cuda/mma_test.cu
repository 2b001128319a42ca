// Tensor-core fragments (snug/cuda/mma.hpp) against the PTX ISA's documented
// layouts, written out independently here: ldmatrix (x1, x2, x4, plain and
// transposed) returns the documented elements; mma.m16n8k16 (bf16, fp16)
// computes A B + C from fragments laid out by those rules; ldmatrix and mma
// together compute a tile of a GEMM equal to the host's. Emulated everywhere
// (where the emulator's fragment gathering is what is checked), and on a GPU
// where one exists (where the inline PTX is).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "snug/cuda/launch.hpp"
#include "snug/cuda/mma.hpp"
#include "snug/cuda/shared_memory.hpp"
#include "snug/snug.hpp"
#include "support/cuda_support.hpp"

using snug::Cuda;
using snug::MemoryCategory;
using snug::MemoryTracker;
using snug::cuda::FragmentA;
using snug::cuda::FragmentB;
using snug::cuda::FragmentC;

namespace {

// A 16 x 16 tile of 16-bit values in shared memory, each lane pointing at row
// l % 16, column 8 (l / 16): the addressing of an A tile.
template <int Count, bool Trans>
__global__ void ldmatrix_kernel(std::uint32_t* out,          // (32, Count)
                                const std::uint16_t* tile) {  // (16, 16)
    struct Tile {
        alignas(16) std::uint16_t v[16][16];
    };
    Tile& s = snug::cuda::block_shared<Tile>();
    const unsigned l = threadIdx.x;
    for (unsigned i = l; i < 256; i += 32) s.v[i / 16][i % 16] = tile[i];
    __syncthreads();
    std::uint32_t r[Count];
    snug::cuda::ldmatrix<Count, Trans>(r, &s.v[l % 16][8 * (l / 16)]);
    for (int j = 0; j < Count; ++j) out[l * Count + j] = r[j];
}

template <class T>
__global__ void mma_kernel(FragmentC* d,           // (32)
                           const FragmentA* a,     // (32)
                           const FragmentB* b,     // (32)
                           const FragmentC* c) {   // (32)
    const unsigned l = threadIdx.x;
    FragmentC out;
    snug::cuda::mma_m16n8k16<T>(out, a[l], b[l], c[l]);
    d[l] = out;
}

// D (16 x 8, row-major) = A (16 x 16, row-major) B (16 x 8, given as Bt 8 x 16
// row-major) through shared memory, ldmatrix and one mma.
template <class T>
__global__ void tile_gemm_kernel(float* D, const T* A, const T* Bt) {
    struct Tiles {
        alignas(16) T a[16][16];
        alignas(16) T bt[8][16];
    };
    Tiles& s = snug::cuda::block_shared<Tiles>();
    const unsigned l = threadIdx.x;
    for (unsigned i = l; i < 256; i += 32) s.a[i / 16][i % 16] = A[i];
    for (unsigned i = l; i < 128; i += 32) s.bt[i / 16][i % 16] = Bt[i];
    __syncthreads();
    FragmentA fa;
    FragmentB fb;
    snug::cuda::ldmatrix_x4(fa.x, &s.a[l % 16][8 * (l / 16)]);
    // Bt's rows are B's columns: lanes 0-7 point at the 8 rows, columns 0-7
    // (b[0]: k = 0..7), lanes 8-15 at columns 8-15 (b[1]: k = 8..15).
    snug::cuda::ldmatrix_x2(fb.x, &s.bt[l % 8][8 * ((l / 8) % 2)]);
    const FragmentC zero{{0.0f, 0.0f, 0.0f, 0.0f}};
    FragmentC out;
    snug::cuda::mma_m16n8k16<T>(out, fa, fb, zero);
    const unsigned g = l / 4, t = l % 4;
    D[g * 8 + 2 * t] = out.x[0];
    D[g * 8 + 2 * t + 1] = out.x[1];
    D[(g + 8) * 8 + 2 * t] = out.x[2];
    D[(g + 8) * 8 + 2 * t + 1] = out.x[3];
}

using OneMatrix = std::integral_constant<int, 1>;
using TwoMatrices = std::integral_constant<int, 2>;
using FourMatrices = std::integral_constant<int, 4>;

// The PTX ISA's rules for lane l, g = l / 4, t = l % 4 (see mma.hpp's comment).
template <class T>
FragmentA fragment_a(const std::vector<T>& A, int l) {  // A (16, 16)
    const int g = l / 4, t = l % 4;
    const auto at = [&](int r, int c) { return A[static_cast<std::size_t>(r * 16 + c)]; };
    using snug::cuda::pack2;
    return FragmentA{{pack2(at(g, 2 * t), at(g, 2 * t + 1)), pack2(at(g + 8, 2 * t), at(g + 8, 2 * t + 1)),
                      pack2(at(g, 2 * t + 8), at(g, 2 * t + 9)), pack2(at(g + 8, 2 * t + 8), at(g + 8, 2 * t + 9))}};
}
template <class T>
FragmentB fragment_b(const std::vector<T>& B, int l) {  // B (16, 8)
    const int g = l / 4, t = l % 4;
    const auto at = [&](int r, int c) { return B[static_cast<std::size_t>(r * 8 + c)]; };
    using snug::cuda::pack2;
    return FragmentB{{pack2(at(2 * t, g), at(2 * t + 1, g)), pack2(at(2 * t + 8, g), at(2 * t + 9, g))}};
}

}  // namespace

TEMPLATE_TEST_CASE("ldmatrix returns the elements the PTX ISA documents", "[cuda][mma]", OneMatrix, TwoMatrices,
                   FourMatrices) {
    constexpr int count = TestType::value;
    MemoryTracker tracker;
    std::vector<std::uint16_t> tile(256);
    for (int i = 0; i < 256; ++i) tile[static_cast<std::size_t>(i)] = static_cast<std::uint16_t>(0x1000 + i);
    auto tile_d = snug::test::to_device(tracker, tile);
    for (const bool trans : {false, true}) {
        auto out = snug::test::poisoned<std::uint32_t>(tracker, 32 * count);
        if (trans)
            snug::cuda::launch<ldmatrix_kernel<count, true>>(1, 32, 0, nullptr, out.data(), tile_d.data());
        else
            snug::cuda::launch<ldmatrix_kernel<count, false>>(1, 32, 0, nullptr, out.data(), tile_d.data());
        const auto got = snug::test::to_host(out);
        for (int l = 0; l < 32; ++l) {
            for (int j = 0; j < count; ++j) {
                // Matrix j's rows come from lanes 8j .. 8j + 7: row r of it is
                // the tile's row (8j + r) % 16 from column 8 ((8j + r) / 16).
                const auto m = [&](int r, int c) {
                    const int lane = 8 * j + r;
                    const auto i = static_cast<std::size_t>((lane % 16) * 16 + 8 * (lane / 16) + c);
                    return static_cast<std::uint32_t>(tile[i]);
                };
                const int a = l / 4, b = 2 * (l % 4);
                const std::uint32_t want = trans ? (m(b, a) | m(b + 1, a) << 16) : (m(a, b) | m(a, b + 1) << 16);
                INFO("x" << count << (trans ? ".trans" : "") << ", lane " << l << ", matrix " << j);
                CHECK(got[static_cast<std::size_t>(l * count + j)] == want);
            }
        }
    }
}

TEMPLATE_TEST_CASE("mma.m16n8k16 computes A B + C from the documented fragments", "[cuda][mma]", snug::bfloat16,
                   snug::half) {
    using T = TestType;
    const std::uint64_t seed = snug::test::fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    MemoryTracker tracker;
    const auto A = snug::test::random_values<T>(rng, 256, -2.0f, 2.0f);
    const auto B = snug::test::random_values<T>(rng, 128, -2.0f, 2.0f);
    const auto C = snug::test::random_values<float>(rng, 128, -1.0f, 1.0f);
    std::vector<FragmentA> fa(32);
    std::vector<FragmentB> fb(32);
    std::vector<FragmentC> fc(32);
    for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        fa[static_cast<std::size_t>(l)] = fragment_a(A, l);
        fb[static_cast<std::size_t>(l)] = fragment_b(B, l);
        const auto c = [&](int r, int col) { return C[static_cast<std::size_t>(r * 8 + col)]; };
        fc[static_cast<std::size_t>(l)] = FragmentC{{c(g, 2 * t), c(g, 2 * t + 1), c(g + 8, 2 * t), c(g + 8, 2 * t + 1)}};
    }
    auto a_d = snug::test::to_device(tracker, fa);
    auto b_d = snug::test::to_device(tracker, fb);
    auto c_d = snug::test::to_device(tracker, fc);
    auto d_d = snug::test::poisoned<FragmentC>(tracker, 32);
    snug::cuda::launch<mma_kernel<T>>(1, 32, 0, nullptr, d_d.data(), a_d.data(), b_d.data(), c_d.data());
    const auto d = snug::test::to_host(d_d);
    for (int l = 0; l < 32; ++l) {
        const int g = l / 4, t = l % 4;
        for (int i = 0; i < 4; ++i) {
            const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
            double want = C[static_cast<std::size_t>(row * 8 + col)];
            double scale = std::abs(want);
            for (int k = 0; k < 16; ++k) {
                const double p = static_cast<double>(static_cast<float>(A[static_cast<std::size_t>(row * 16 + k)])) *
                                 static_cast<float>(B[static_cast<std::size_t>(k * 8 + col)]);
                want += p;
                scale += std::abs(p);
            }
            INFO("lane " << l << ", d[" << i << "] = D[" << row << "][" << col << "]");
            // fp32 accumulation of 17 terms: a few fp32 ulps of their magnitude.
            CHECK(std::abs(d[static_cast<std::size_t>(l)].x[i] - want) <= 1e-6 * scale);
        }
    }
}

TEMPLATE_TEST_CASE("ldmatrix and mma compute a GEMM tile equal to the host's", "[cuda][mma]", snug::bfloat16,
                   snug::half) {
    using T = TestType;
    const std::uint64_t seed = snug::test::fresh_seed();
    INFO("seed " << seed);
    snug::Generator rng(seed);
    MemoryTracker tracker;
    const auto A = snug::test::random_values<T>(rng, 256, -1.0f, 1.0f);   // (16, 16)
    const auto Bt = snug::test::random_values<T>(rng, 128, -1.0f, 1.0f);  // (8, 16): B's columns
    auto a_d = snug::test::to_device(tracker, A);
    auto bt_d = snug::test::to_device(tracker, Bt);
    auto d_d = snug::test::poisoned<float>(tracker, 128);
    snug::cuda::launch<tile_gemm_kernel<T>>(1, 32, 0, nullptr, d_d.data(), a_d.data(), bt_d.data());
    std::vector<float> host(128);
    snug::host::gemm(snug::host::Op::N, snug::host::Op::T, 16, 8, 16, 1.0f, A.data(), 16, Bt.data(), 16, 0.0f,
                     host.data(), 8);
    snug::test::check_close(snug::test::to_host(d_d), host, 1e-5, "tile D");
}
