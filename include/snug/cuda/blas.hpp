// snug::cuda::Blas: the CUDA backend's GEMM. Owns a cuBLASLt handle and its
// workspace (recorded in a MemoryTracker as MemoryCategory::workspace), caches
// one plan (descriptor, layouts, the heuristic's algorithm) per problem, and
// offers a row-major matmul: C = alpha op(A) op(B) + beta C (+ bias), fp32
// accumulation, A and B in float / half / bfloat16, C in their type or float.
// The workspace doubles as scratch for kernels on the same stream, and its
// last bytes hold a counter kept at zero between kernels (a grid's ticket).
// Plain C++ over the CUDA headers: no kernels here.
#pragma once

#include "snug/cuda/runtime.hpp"

#include <compare>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <source_location>
#include <string>
#include <type_traits>

#include "snug/core/buffer.hpp"
#include "snug/core/error.hpp"
#include "snug/core/dtype.hpp"
#include "snug/core/half.hpp"
#include "snug/core/memory_tracker.hpp"
#include "snug/cuda/check.hpp"
#include "snug/cuda/device.hpp"
#include "snug/cuda/launch_observer.hpp"
#include "snug/cuda/limits.hpp"

namespace snug::cuda {

// How matmul reads an operand: as stored (N) or transposed (T).
enum class Op : bool { N, T };

// C (and the bias) is float, or the inputs' own type.
template <class TC, class T>
concept GemmOutput = FloatStorage<T> && (std::same_as<TC, float> || std::same_as<TC, T>);

namespace detail {

template <FloatStorage T>
constexpr cudaDataType_t cuda_data_type() {
    if constexpr (std::same_as<T, float>) {
        return CUDA_R_32F;
    } else if constexpr (std::same_as<T, half>) {
        return CUDA_R_16F;
    } else {
        return CUDA_R_16BF;
    }
}

inline const char* data_type_name(cudaDataType_t type) {
    switch (type) {
        case CUDA_R_32F: return "float";
        case CUDA_R_16F: return "half";
        case CUDA_R_16BF: return "bfloat16";
        default: return "unsupported type";
    }
}

// Owning handles for cuBLASLt's opaque descriptors.
struct MatmulDescDeleter {
    void operator()(cublasLtMatmulDesc_t p) const noexcept { (void)cublasLtMatmulDescDestroy(p); }
};
struct LayoutDeleter {
    void operator()(cublasLtMatrixLayout_t p) const noexcept { (void)cublasLtMatrixLayoutDestroy(p); }
};
struct PreferenceDeleter {
    void operator()(cublasLtMatmulPreference_t p) const noexcept { (void)cublasLtMatmulPreferenceDestroy(p); }
};
using MatmulDescPtr = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>, MatmulDescDeleter>;
using LayoutPtr = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>, LayoutDeleter>;
using PreferencePtr = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, PreferenceDeleter>;

}  // namespace detail

// Everything that selects a plan: a row-major problem as matmul receives it.
struct MatmulKey {
    Op op_a = Op::N;
    Op op_b = Op::N;
    std::int64_t M = 0, N = 0, K = 0;
    std::int64_t lda = 0, ldb = 0, ldc = 0;
    cudaDataType_t ab_type = CUDA_R_32F;  // A and B
    cudaDataType_t c_type = CUDA_R_32F;   // C, D and the bias
    cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
    bool bias = false;  // CUBLASLT_EPILOGUE_BIAS

    auto operator<=>(const MatmulKey&) const = default;

    // "(M = 4, N = 7, K = 9, op(A) = N, op(B) = T, lda = 9, ldb = 9, ldc = 7;
    //  A, B half, C float, fp32 compute, bias epilogue)"
    std::string str() const {
        auto op = [](Op o) { return o == Op::N ? "N" : "T"; };
        return "(M = " + std::to_string(M) + ", N = " + std::to_string(N) + ", K = " + std::to_string(K) +
               ", op(A) = " + op(op_a) + ", op(B) = " + op(op_b) + ", lda = " + std::to_string(lda) +
               ", ldb = " + std::to_string(ldb) + ", ldc = " + std::to_string(ldc) + "; A, B " +
               detail::data_type_name(ab_type) + ", C " + detail::data_type_name(c_type) + ", " +
               (compute == CUBLAS_COMPUTE_32F_FAST_TF32 ? "tf32" : "fp32") + " compute" +
               (bias ? ", bias epilogue" : "") + ")";
    }
};

// One cached problem: the descriptor and layouts of the column-major call
// matmul makes, and the algorithm cuBLASLt's heuristic chose for it. When the
// heuristic found none, `found` is false and `failure` says why.
struct MatmulPlan {
    detail::MatmulDescPtr desc;
    detail::LayoutPtr layout_a;  // cuBLASLt's A: the row-major B
    detail::LayoutPtr layout_b;  // cuBLASLt's B: the row-major A
    detail::LayoutPtr layout_c;  // C and D (the same memory)
    cublasLtMatmulAlgo_t algo{};
    std::size_t workspace_bytes = 0;  // what the algorithm needs of the Blas workspace
    bool found = false;
    std::string failure;
};

// The cuBLASLt context of one device: handle, workspace, plan cache, options.
//
// - The workspace is 32 MiB on compute capability 9.x, 4 MiB elsewhere,
//   allocated through snug::Cuda and recorded in the tracker given to the
//   constructor as MemoryCategory::workspace for the Blas's lifetime (the
//   tracker must outlive it). cuBLASLt's own small internal allocations are
//   not tracked (cuda::report_with_driver shows them as unseen bytes).
// - Bound to the device that is current at construction. Not thread-safe,
//   and the workspace is shared by every call: use one Blas per stream that
//   runs GEMMs concurrently with another. Between matmuls the workspace may
//   serve as scratch for kernels queued on the same stream (scratch()).
// - Its last counter_bytes are neither cuBLASLt's nor scratch: ticket_counter()
//   (zeroed here, and left zero by every kernel that takes tickets from it).
// - Neither copyable nor movable: device tags point at it.
class Blas {
public:
    // Pointers matmul receives must be aligned to this many bytes.
    static constexpr std::size_t required_alignment = 16;
    // The end of the workspace kept for ticket_counter() (a multiple of 256,
    // so that what comes before it keeps cudaMalloc's alignment).
    static constexpr std::size_t counter_bytes = 256;

    explicit Blas(MemoryTracker& tracker, std::source_location loc = std::source_location::current()) {
        workspace_ = Buffer<std::byte, Cuda>(tracker, MemoryCategory::workspace, workspace_bytes_for_current_device(loc),
                                             "cuBLASLt workspace");
        check(cudaMemset(ticket_counter(), 0, counter_bytes), loc);
        check(cudaStreamSynchronize(nullptr), loc);  // before any stream, a non-blocking one too, may use it
        check(cublasLtCreate(&handle_), loc);
    }

    // The workspace a Blas takes on the current device (what a memory plan counts).
    static std::size_t workspace_bytes_for_current_device(std::source_location loc = std::source_location::current()) {
        int device = 0;
        check(cudaGetDevice(&device), loc);
        int major = 0;
        check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), loc);
        return blas_workspace_bytes(major);
    }

    Blas(const Blas&) = delete;
    Blas& operator=(const Blas&) = delete;

    ~Blas() {
        plans_.clear();  // descriptors before the handle
        if (handle_ != nullptr) (void)cublasLtDestroy(handle_);
    }

    // TF32 tensor cores for float inputs (10-bit mantissa products, fp32
    // accumulation: relative error ~3e-4 instead of ~1e-6). Off by default.
    void set_tf32(bool on) noexcept { tf32_ = on; }
    bool tf32() const noexcept { return tf32_; }

    // Whether linear_forward adds its bias in the GEMM's epilogue (true, the
    // default) or writes the bias into the output first and runs the GEMM
    // with beta = 1 (false; also what happens for a shape the epilogue has no
    // algorithm for). A switch for benchmarks and tests.
    void set_fuse_bias(bool on) noexcept { fuse_bias_ = on; }
    bool fuse_bias() const noexcept { return fuse_bias_; }

    cublasLtHandle_t handle() const noexcept { return handle_; }
    void* workspace() noexcept { return workspace_.data(); }
    // The whole allocation (what the tracker records and a memory plan counts).
    std::size_t workspace_bytes() const noexcept { return workspace_.bytes(); }
    // The workspace as `count` T of scratch for kernels queued on this Blas's
    // stream between GEMMs (memory already held and tracked); nullptr when it
    // holds fewer. What the deterministic reductions keep their partial sums in.
    template <class T>
    T* scratch(std::size_t count) noexcept {
        return count <= scratch_capacity<T>() ? reinterpret_cast<T*>(workspace_.data()) : nullptr;
    }
    // How many T the workspace holds before ticket_counter()'s bytes (cuBLASLt
    // gets the same part of it).
    template <class T>
    std::size_t scratch_capacity() const noexcept {
        return usable_bytes() / sizeof(T);
    }
    // A device counter that reads 0 between kernels on this Blas's stream: the
    // ticket a grid's blocks take when each adds a partial result and the last
    // one to finish combines them (norm_rows.cuh). A kernel that takes tickets
    // leaves it 0 (atomicInc with the grid's size wraps it there), so no
    // memset runs before each launch; one stream at a time, as for scratch().
    unsigned* ticket_counter() noexcept { return reinterpret_cast<unsigned*>(workspace_.data() + usable_bytes()); }
    // Number of cached plans (found or not).
    std::size_t plan_count() const noexcept { return plans_.size(); }

    // The key matmul<T, TC> uses for this problem.
    template <FloatStorage T, class TC>
        requires GemmOutput<TC, T>
    MatmulKey key(Op op_a, Op op_b, std::int64_t M, std::int64_t N, std::int64_t K, std::int64_t lda,
                  std::int64_t ldb, std::int64_t ldc, bool bias) const noexcept {
        MatmulKey k;
        k.op_a = op_a;
        k.op_b = op_b;
        k.M = M;
        k.N = N;
        k.K = K;
        k.lda = lda;
        k.ldb = ldb;
        k.ldc = ldc;
        k.ab_type = detail::cuda_data_type<T>();
        k.c_type = detail::cuda_data_type<TC>();
        k.compute = std::same_as<T, float> && tf32_ ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
        k.bias = bias;
        return k;
    }

    // The cached plan for `k`, created (descriptors and one heuristic query)
    // on first use. The same key always gives the same object. A key whose
    // heuristic found no algorithm is cached too (found == false).
    const MatmulPlan& plan(const MatmulKey& k, std::source_location loc = std::source_location::current()) {
        auto it = plans_.find(k);
        if (it == plans_.end()) it = plans_.emplace(k, make_plan(k, loc)).first;
        return *it->second;
    }

    // Whether cuBLASLt has an algorithm for this problem (queried once, cached).
    template <FloatStorage T, class TC>
        requires GemmOutput<TC, T>
    bool supports(Op op_a, Op op_b, std::int64_t M, std::int64_t N, std::int64_t K, std::int64_t lda,
                  std::int64_t ldb, std::int64_t ldc, bool bias,
                  std::source_location loc = std::source_location::current()) {
        return plan(key<T, TC>(op_a, op_b, M, N, K, lda, ldb, ldc, bias), loc).found;
    }

    // C = alpha * op(A) * op(B) + beta * C (+ bias broadcast over the rows),
    // row-major with leading dimensions (elements between the starts of
    // consecutive stored rows), queued on `stream`. fp32 accumulation (TF32
    // for float inputs when tf32() is on); a 16-bit C is rounded once. When
    // beta == 0, C is only written. bias (N), in C's type, or nullptr.
    // C must not overlap A, B or bias.
    // Throws ShapeError for a non-positive size or a leading dimension shorter
    // than a stored row (K == 0 is refused: there is no product to run);
    // snug::Error for a null pointer or one not aligned to 16 bytes;
    // CudaError when cuBLASLt has no algorithm for the problem (naming the
    // shape and types) or the call fails.
    template <FloatStorage T, class TC>
        requires GemmOutput<TC, T>
    void matmul(cudaStream_t stream, Op op_a, Op op_b, std::int64_t M, std::int64_t N, std::int64_t K,
                float alpha,
                const T* A, std::int64_t lda,  // (M, K), or (K, M) when op_a == Op::T
                const T* B, std::int64_t ldb,  // (K, N), or (N, K) when op_b == Op::T
                float beta,
                TC* C, std::int64_t ldc,      // (M, N)
                const TC* bias = nullptr,     // (N) or nullptr
                std::source_location loc = std::source_location::current()) {
        const MatmulKey k = key<T, TC>(op_a, op_b, M, N, K, lda, ldb, ldc, bias != nullptr);
        check_problem(k, A, B, C, bias, loc);
        const MatmulPlan& p = plan(k, loc);
        if (!p.found) throw CudaError(snug::detail::where(loc) + p.failure);
        if (bias != nullptr) {
            const void* bias_ptr = bias;
            check(cublasLtMatmulDescSetAttribute(p.desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr,
                                                 sizeof(bias_ptr)),
                  loc);
        }
        // Column-major: row-major C (M, N) is C^T (N, M) = op(B)^T op(A)^T.
        observed(stream, [&] {
            check(cublasLtMatmul(handle_, p.desc.get(), &alpha, B, p.layout_a.get(), A, p.layout_b.get(), &beta, C,
                                 p.layout_c.get(), C, p.layout_c.get(), &p.algo, workspace_.data(),
                                 p.workspace_bytes, stream),
                  loc);
        });
    }

private:
    static void check_problem(const MatmulKey& k, const void* A, const void* B, const void* C, const void* bias,
                              const std::source_location& loc) {
        const std::string prefix = snug::detail::where(loc) + "Blas::matmul: ";
        if (k.M <= 0 || k.N <= 0 || k.K <= 0)
            throw ShapeError(prefix + "every size must be positive " + k.str());
        auto check_ld = [&](const char* name, std::int64_t ld, std::int64_t row) {
            if (ld < row)
                throw ShapeError(prefix + name + " = " + std::to_string(ld) + " is shorter than a stored row of " +
                                 std::to_string(row) + " elements " + k.str());
        };
        check_ld("lda", k.lda, k.op_a == Op::N ? k.K : k.M);
        check_ld("ldb", k.ldb, k.op_b == Op::N ? k.N : k.K);
        check_ld("ldc", k.ldc, k.N);
        auto check_ptr = [&](const char* name, const void* p) {
            if (p == nullptr) throw Error(prefix + name + " is null " + k.str());
            const auto address = reinterpret_cast<std::uintptr_t>(p);
            if (address % required_alignment != 0)
                throw Error(prefix + name + " (address " + std::to_string(address) +
                            ") is not aligned to 16 bytes, which cuBLASLt needs; allocate or offset the tensor "
                            "to a multiple of 16 bytes " +
                            k.str());
        };
        check_ptr("A", A);
        check_ptr("B", B);
        check_ptr("C", C);
        if (k.bias) check_ptr("bias", bias);
    }

    std::unique_ptr<MatmulPlan> make_plan(const MatmulKey& k, const std::source_location& loc) {
        auto p = std::make_unique<MatmulPlan>();
        cublasLtMatmulDesc_t desc = nullptr;
        check(cublasLtMatmulDescCreate(&desc, k.compute, CUDA_R_32F), loc);
        p->desc.reset(desc);
        // cuBLASLt's A is the row-major B, its B the row-major A (see matmul).
        const cublasOperation_t trans_a = k.op_b == Op::N ? CUBLAS_OP_N : CUBLAS_OP_T;
        const cublasOperation_t trans_b = k.op_a == Op::N ? CUBLAS_OP_N : CUBLAS_OP_T;
        set(p->desc.get(), CUBLASLT_MATMUL_DESC_TRANSA, trans_a, loc);
        set(p->desc.get(), CUBLASLT_MATMUL_DESC_TRANSB, trans_b, loc);
        if (k.bias) {
            set(p->desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS, loc);
            // The heuristic reads the bias pointer's alignment (never the
            // data): give it one aligned to exactly 16 bytes, the least
            // matmul accepts, so the algorithm suits every later bias.
            const void* probe = workspace_.data() + required_alignment;
            set(p->desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, probe, loc);
        }
        // Stored row-major X (rows, cols) with ld is column-major (cols, rows).
        auto layout = [&](cudaDataType_t type, std::int64_t rows, std::int64_t cols, std::int64_t ld) {
            cublasLtMatrixLayout_t l = nullptr;
            check(cublasLtMatrixLayoutCreate(&l, type, static_cast<std::uint64_t>(cols),
                                             static_cast<std::uint64_t>(rows), ld),
                  loc);
            return detail::LayoutPtr(l);
        };
        p->layout_a = k.op_b == Op::N ? layout(k.ab_type, k.K, k.N, k.ldb) : layout(k.ab_type, k.N, k.K, k.ldb);
        p->layout_b = k.op_a == Op::N ? layout(k.ab_type, k.M, k.K, k.lda) : layout(k.ab_type, k.K, k.M, k.lda);
        p->layout_c = layout(k.c_type, k.M, k.N, k.ldc);

        cublasLtMatmulPreference_t pref_raw = nullptr;
        check(cublasLtMatmulPreferenceCreate(&pref_raw), loc);
        const detail::PreferencePtr pref(pref_raw);
        const std::uint64_t max_workspace = usable_bytes();
        check(cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                   &max_workspace, sizeof(max_workspace)),
              loc);
        // Algorithms must work for any pointer aligned to 16 bytes (the
        // default preference assumes 256), so one plan serves every call.
        const auto alignment = static_cast<std::uint32_t>(required_alignment);
        for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
            check(cublasLtMatmulPreferenceSetAttribute(pref.get(), attr, &alignment, sizeof(alignment)), loc);

        cublasLtMatmulHeuristicResult_t result{};
        int returned = 0;
        const cublasStatus_t status =
            cublasLtMatmulAlgoGetHeuristic(handle_, p->desc.get(), p->layout_a.get(), p->layout_b.get(),
                                           p->layout_c.get(), p->layout_c.get(), pref.get(), 1, &result, &returned);
        // NOT_SUPPORTED means no algorithm; INVALID_VALUE is what some
        // versions answer for shapes they have none for (one row or column
        // with an epilogue). Both are kept as a plan without an algorithm, so
        // that callers can ask supports() and take another way; any other
        // status is an error now.
        if (status != CUBLAS_STATUS_SUCCESS && status != CUBLAS_STATUS_NOT_SUPPORTED &&
            status != CUBLAS_STATUS_INVALID_VALUE)
            check(status, loc);
        if (status == CUBLAS_STATUS_SUCCESS && returned > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
            p->algo = result.algo;
            p->workspace_bytes = result.workspaceSize;
            p->found = true;
        } else {
            const std::string why = status != CUBLAS_STATUS_SUCCESS ? detail::describe(status)
                                    : returned == 0           ? std::string("0 algorithms returned")
                                                              : detail::describe(result.state);
            p->failure = "cuBLASLt's heuristic found no algorithm for the row-major GEMM " + k.str() + " with a " +
                         std::to_string(workspace_.bytes() >> 20) + " MiB workspace (" + why + ")";
        }
        return p;
    }

    std::size_t usable_bytes() const noexcept { return workspace_.bytes() - counter_bytes; }

    template <class V>
    static void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const V& value,
                    const std::source_location& loc) {
        // cuBLASLt's enum-valued attributes are 32-bit integers.
        if constexpr (std::is_enum_v<V>) {
            const auto v = static_cast<std::int32_t>(value);
            check(cublasLtMatmulDescSetAttribute(desc, attr, &v, sizeof(v)), loc);
        } else {
            check(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)), loc);
        }
    }

    Buffer<std::byte, Cuda> workspace_;
    cublasLtHandle_t handle_ = nullptr;
    std::map<MatmulKey, std::unique_ptr<MatmulPlan>> plans_;
    bool tf32_ = false;
    bool fuse_bias_ = true;
};

}  // namespace snug::cuda
