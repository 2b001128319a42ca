// Tensor-core building blocks for kernels: the warp-wide matrix multiply
// mma.sync.m16n8k16 (bf16 or fp16 inputs, fp32 accumulation) and the warp-wide
// shared-memory load ldmatrix (.m8n8, .x1/.x2/.x4, optionally transposed),
// each with a device body (inline PTX, sm_80 and later) and an emulated body
// that gathers the warp's fragments per the PTX ISA's documented layouts
// ("Matrix Fragments for mma.m16n8k16 with floating point type"; "ldmatrix").
//
// Fragments of D = A B + C, A 16 x 16 (row-major), B 16 x 8 ("col": stored as
// Bᵀ, 8 rows of 16), C and D 16 x 8, for lane l with g = l / 4, t = l % 4:
//   A: a[0] = A[g][2t, 2t+1]      a[1] = A[g+8][2t, 2t+1]
//      a[2] = A[g][2t+8, 2t+9]    a[3] = A[g+8][2t+8, 2t+9]
//   B: b[0] = B[2t, 2t+1][g]      b[1] = B[2t+8, 2t+9][g]
//   C: c[0], c[1] = C[g][2t, 2t+1]    c[2], c[3] = C[g+8][2t, 2t+1]
// Each 32-bit register holds two 16-bit elements, the lower-indexed one in
// its low half.
//
// ldmatrix: lanes 8j .. 8j + 7 give the addresses of the 8 rows (16 bytes
// each, 16-byte aligned, in shared memory) of matrix j; lane l receives, for
// each matrix, elements [l / 4][2 (l % 4)] and [l / 4][2 (l % 4) + 1] (with
// .trans: [2 (l % 4)][l / 4] and [2 (l % 4) + 1][l / 4]). So ldmatrix_x4 of a
// 16 x 16 row-major tile (lane l pointing at row l % 16, column 8 (l / 16))
// gives exactly A's fragment above.
//
// The emulator computes D with every product and sum in double and rounds
// once to fp32; a GPU's tensor cores round their sums their own way (within
// fp32 accumulation's error). Every lane of the warp must take part: the
// emulator reports one that exited, a row address outside shared memory or
// not aligned to 16 bytes.
#pragma once

#include <concepts>
#include <cstdint>
#include <cstring>
#include <source_location>

#include "snug/core/half.hpp"
#include "snug/cuda/runtime.hpp"

namespace snug::cuda {

struct FragmentA {
    std::uint32_t x[4];
};
struct FragmentB {
    std::uint32_t x[2];
};
struct FragmentC {
    float x[4];
};

template <class T>
concept MmaInput = std::same_as<T, bfloat16> || std::same_as<T, half>;

// Two 16-bit values in one register, `lo` in the low half.
template <MmaInput T>
SNUG_HD std::uint32_t pack2(T lo, T hi) {
    return static_cast<std::uint32_t>(lo.bits) | static_cast<std::uint32_t>(hi.bits) << 16;
}

#if defined(SNUG_CUDA_EMULATED)

namespace emulated::detail {

template <class T>
float element(std::uint32_t reg, int half) {
    return static_cast<float>(T::from_bits(static_cast<std::uint16_t>(reg >> (16 * half))));
}

// What each lane brings to an mma.
struct MmaOperands {
    const FragmentA* a;
    const FragmentB* b;
    const FragmentC* c;
    FragmentC* d;
};

template <class T>
void mma_complete(Block& block, Thread* const* lanes, unsigned mask) {
    (void)block;
    (void)mask;
    double A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; ++l) {
        const auto& op = *static_cast<const MmaOperands*>(lanes[l]->call.in);
        const int g = l / 4, t = l % 4;
        for (int h = 0; h < 2; ++h) {
            A[g][2 * t + h] = element<T>(op.a->x[0], h);
            A[g + 8][2 * t + h] = element<T>(op.a->x[1], h);
            A[g][2 * t + 8 + h] = element<T>(op.a->x[2], h);
            A[g + 8][2 * t + 8 + h] = element<T>(op.a->x[3], h);
            B[2 * t + h][g] = element<T>(op.b->x[0], h);
            B[2 * t + 8 + h][g] = element<T>(op.b->x[1], h);
            C[g][2 * t + h] = op.c->x[h];
            C[g + 8][2 * t + h] = op.c->x[2 + h];
        }
    }
    for (int l = 0; l < 32; ++l) {
        const auto& op = *static_cast<const MmaOperands*>(lanes[l]->call.in);
        const int g = l / 4, t = l % 4;
        float out[4];
        for (int i = 0; i < 4; ++i) {
            const int row = g + (i >= 2 ? 8 : 0), col = 2 * t + (i & 1);
            double acc = C[row][col];
            for (int k = 0; k < 16; ++k) acc += A[row][k] * B[k][col];
            out[i] = static_cast<float>(acc);
        }
        std::memcpy(op.d->x, out, sizeof out);
    }
}

// What each lane brings to an ldmatrix.
struct LdmatrixOperands {
    const void* row;        // this lane's row address (lanes < 8 * count)
    std::uint32_t* out;     // count registers
};

template <int Count, bool Trans>
SNUG_EMULATED_UNTRACED void ldmatrix_complete(Block& block, Thread* const* lanes, unsigned mask) {
    (void)mask;
    std::uint16_t M[4][8][8];
    for (int j = 0; j < Count; ++j) {
        for (int r = 0; r < 8; ++r) {
            Thread& t = *lanes[8 * j + r];
            const void* row = static_cast<const LdmatrixOperands*>(t.call.in)->row;
            if (reinterpret_cast<std::uintptr_t>(row) % 16 != 0)
                block.fail(t, std::string(t.call.name) + ": lane " + std::to_string(8 * j + r) +
                                  "'s row address is not aligned to 16 bytes");
            if (!block.is_shared(row, 16))
                block.fail(t, std::string(t.call.name) + ": lane " + std::to_string(8 * j + r) +
                                  "'s row address does not point at 16 bytes of this block's shared memory");
            if constexpr (shared_checks) block.note_shared_read(t, row, 16);
            std::memcpy(M[j][r], row, 16);
        }
    }
    for (int l = 0; l < 32; ++l) {
        std::uint32_t* out = static_cast<const LdmatrixOperands*>(lanes[l]->call.in)->out;
        for (int j = 0; j < Count; ++j) {
            const int a = l / 4, b = 2 * (l % 4);
            const std::uint16_t lo = Trans ? M[j][b][a] : M[j][a][b];
            const std::uint16_t hi = Trans ? M[j][b + 1][a] : M[j][a][b + 1];
            out[j] = static_cast<std::uint32_t>(lo) | static_cast<std::uint32_t>(hi) << 16;
        }
    }
}

inline void warp_fragments(const char* name, CollectiveFn complete, const void* operands,
                           const std::source_location& site) {
    Thread& t = this_thread(name);
    CollectiveCall call;
    call.complete = complete;
    call.name = name;
    call.mask = 0xFFFF'FFFFU;
    call.in = operands;
    (void)this_block().collective(t, call, site);
}

}  // namespace emulated::detail

// d = a b + c for the warp's 16 x 8 tile (every lane of the warp calls it).
// d may be c.
template <MmaInput T>
void mma_m16n8k16(FragmentC& d, const FragmentA& a, const FragmentB& b, const FragmentC& c,
                  std::source_location site = std::source_location::current()) {
    FragmentC result;
    const emulated::detail::MmaOperands ops{&a, &b, &c, &result};
    emulated::detail::warp_fragments(std::same_as<T, bfloat16> ? "mma.sync.m16n8k16 (bf16)" : "mma.sync.m16n8k16 (f16)",
                                     &emulated::detail::mma_complete<T>, &ops, site);
    d = result;
}

template <int Count, bool Trans>
void ldmatrix(std::uint32_t (&r)[Count], const void* row, std::source_location site = std::source_location::current()) {
    static_assert(Count == 1 || Count == 2 || Count == 4, "ldmatrix loads 1, 2 or 4 matrices");
    std::uint32_t out[Count];
    const emulated::detail::LdmatrixOperands ops{row, out};
    emulated::detail::warp_fragments(Trans ? "ldmatrix.m8n8.trans" : "ldmatrix.m8n8",
                                     &emulated::detail::ldmatrix_complete<Count, Trans>, &ops, site);
    for (int i = 0; i < Count; ++i) r[i] = out[i];
}

#else

template <MmaInput T>
__device__ __forceinline__ void mma_m16n8k16(FragmentC& d, const FragmentA& a, const FragmentB& b,
                                             const FragmentC& c) {
    if constexpr (std::same_as<T, bfloat16>) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%10, %11, %12, %13};\n"
            : "=f"(d.x[0]), "=f"(d.x[1]), "=f"(d.x[2]), "=f"(d.x[3])
            : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]), "f"(c.x[0]),
              "f"(c.x[1]), "f"(c.x[2]), "f"(c.x[3]));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%10, %11, %12, %13};\n"
            : "=f"(d.x[0]), "=f"(d.x[1]), "=f"(d.x[2]), "=f"(d.x[3])
            : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]), "f"(c.x[0]),
              "f"(c.x[1]), "f"(c.x[2]), "f"(c.x[3]));
    }
}

template <int Count, bool Trans>
__device__ __forceinline__ void ldmatrix(std::uint32_t (&r)[Count], const void* row) {
    static_assert(Count == 1 || Count == 2 || Count == 4, "ldmatrix loads 1, 2 or 4 matrices");
    const auto address = static_cast<unsigned>(__cvta_generic_to_shared(row));
    if constexpr (Count == 1 && !Trans) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(address));
    } else if constexpr (Count == 1) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(address));
    } else if constexpr (Count == 2 && !Trans) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                     : "=r"(r[0]), "=r"(r[1])
                     : "r"(address));
    } else if constexpr (Count == 2) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                     : "=r"(r[0]), "=r"(r[1])
                     : "r"(address));
    } else if constexpr (!Trans) {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(address));
    } else {
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(address));
    }
}

#endif

// The named forms. Every lane of the warp calls them; `row` is this lane's
// row address (ignored for lanes >= 8 x the count).
#if defined(SNUG_CUDA_EMULATED)
inline void ldmatrix_x1(std::uint32_t (&r)[1], const void* row,
                        std::source_location site = std::source_location::current()) {
    ldmatrix<1, false>(r, row, site);
}
inline void ldmatrix_x2(std::uint32_t (&r)[2], const void* row,
                        std::source_location site = std::source_location::current()) {
    ldmatrix<2, false>(r, row, site);
}
inline void ldmatrix_x4(std::uint32_t (&r)[4], const void* row,
                        std::source_location site = std::source_location::current()) {
    ldmatrix<4, false>(r, row, site);
}
inline void ldmatrix_x1_trans(std::uint32_t (&r)[1], const void* row,
                              std::source_location site = std::source_location::current()) {
    ldmatrix<1, true>(r, row, site);
}
inline void ldmatrix_x2_trans(std::uint32_t (&r)[2], const void* row,
                              std::source_location site = std::source_location::current()) {
    ldmatrix<2, true>(r, row, site);
}
inline void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* row,
                              std::source_location site = std::source_location::current()) {
    ldmatrix<4, true>(r, row, site);
}
#else
__device__ __forceinline__ void ldmatrix_x1(std::uint32_t (&r)[1], const void* row) { ldmatrix<1, false>(r, row); }
__device__ __forceinline__ void ldmatrix_x2(std::uint32_t (&r)[2], const void* row) { ldmatrix<2, false>(r, row); }
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* row) { ldmatrix<4, false>(r, row); }
__device__ __forceinline__ void ldmatrix_x1_trans(std::uint32_t (&r)[1], const void* row) {
    ldmatrix<1, true>(r, row);
}
__device__ __forceinline__ void ldmatrix_x2_trans(std::uint32_t (&r)[2], const void* row) {
    ldmatrix<2, true>(r, row);
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* row) {
    ldmatrix<4, true>(r, row);
}
#endif

}  // namespace snug::cuda
