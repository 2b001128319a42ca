// cuBLASLt for the emulated backend: the part of cuBLASLt's matmul contract
// that snug's GEMM wrapper (snug/cuda/blas.hpp) uses, computed by the host GEMM.
//
// It verifies snug's use of the contract, not NVIDIA's kernels: column-major
// layouts (CUBLASLT_ORDER_COL) with leading dimensions and strided batches;
// TRANSA / TRANSB; alpha and beta as host floats; A and B in fp32, fp16 or
// bf16 with C and D in their type or fp32; compute CUBLAS_COMPUTE_32F (inputs
// exact), _32F_FAST_TF32 (fp32 inputs rounded to TF32 first, to nearest with
// ties away, as the tensor cores' conversion does), _32F_FAST_16F / _16BF;
// the DEFAULT and BIAS epilogues (a bias of D's type and D's row count,
// broadcast over columns, added before D is rounded once). The algorithm the
// heuristic returns remembers the alignments the preference allowed (256 bytes
// by default, and the bias pointer's alignment at query time, as cuBLASLt
// does), and cublasLtMatmul refuses pointers that break them. Every matrix
// must lie inside device memory: one that does not is what a GPU reports as an
// illegal address, and becomes that sticky error here. Anything else (other
// epilogues, orders, compute types, device pointer mode) is
// CUBLAS_STATUS_NOT_SUPPORTED, so that a use the emulator cannot check does
// not pass silently. Enumerators carry cuBLASLt 13's numbers.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "snug/core/half.hpp"
#include "snug/cuda/emulated/runtime.hpp"
#include "snug/host/gemm.hpp"

enum cudaDataType_t {
    CUDA_R_32F = 0,
    CUDA_R_64F = 1,
    CUDA_R_16F = 2,
    CUDA_R_8I = 3,
    CUDA_R_32I = 10,
    CUDA_R_16BF = 14,
};
using cudaDataType = cudaDataType_t;

enum cublasStatus_t {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_ALLOC_FAILED = 3,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_ARCH_MISMATCH = 8,
    CUBLAS_STATUS_MAPPING_ERROR = 11,
    CUBLAS_STATUS_EXECUTION_FAILED = 13,
    CUBLAS_STATUS_INTERNAL_ERROR = 14,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
};

enum cublasComputeType_t {
    CUBLAS_COMPUTE_16F = 64,
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_32F_FAST_16F = 74,
    CUBLAS_COMPUTE_32F_FAST_16BF = 75,
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
};

enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 };

enum cublasLtOrder_t { CUBLASLT_ORDER_COL = 0, CUBLASLT_ORDER_ROW = 1 };

enum cublasLtPointerMode_t { CUBLASLT_POINTER_MODE_HOST = 0, CUBLASLT_POINTER_MODE_DEVICE = 1 };

enum cublasLtEpilogue_t {
    CUBLASLT_EPILOGUE_DEFAULT = 1,
    CUBLASLT_EPILOGUE_RELU = 2,
    CUBLASLT_EPILOGUE_BIAS = 4,
    CUBLASLT_EPILOGUE_GELU = 32,
    CUBLASLT_EPILOGUE_GELU_BIAS = 36,
};

enum cublasLtMatmulDescAttributes_t {
    CUBLASLT_MATMUL_DESC_COMPUTE_TYPE = 0,
    CUBLASLT_MATMUL_DESC_SCALE_TYPE = 1,
    CUBLASLT_MATMUL_DESC_POINTER_MODE = 2,
    CUBLASLT_MATMUL_DESC_TRANSA = 3,
    CUBLASLT_MATMUL_DESC_TRANSB = 4,
    CUBLASLT_MATMUL_DESC_TRANSC = 5,
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
    CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
    CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE = 10,
    CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26,
};

enum cublasLtMatrixLayoutAttribute_t {
    CUBLASLT_MATRIX_LAYOUT_TYPE = 0,
    CUBLASLT_MATRIX_LAYOUT_ORDER = 1,
    CUBLASLT_MATRIX_LAYOUT_ROWS = 2,
    CUBLASLT_MATRIX_LAYOUT_COLS = 3,
    CUBLASLT_MATRIX_LAYOUT_LD = 4,
    CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5,
    CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 6,
};

enum cublasLtMatmulPreferenceAttributes_t {
    CUBLASLT_MATMUL_PREF_SEARCH_MODE = 0,
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
};

struct cublasLtContext {
    int magic = 0x5107;
};
using cublasLtHandle_t = cublasLtContext*;

struct cublasLtMatmulDescOpaque_t {
    cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
    cudaDataType_t scale = CUDA_R_32F;
    std::int32_t pointer_mode = CUBLASLT_POINTER_MODE_HOST;
    std::int32_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N, trans_c = CUBLAS_OP_N;
    std::uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    const void* bias = nullptr;
    std::int64_t bias_batch_stride = 0;
    std::int32_t bias_type = -1;  // -1: D's type
};
using cublasLtMatmulDesc_t = cublasLtMatmulDescOpaque_t*;

struct cublasLtMatrixLayoutOpaque_t {
    cudaDataType_t type = CUDA_R_32F;
    std::int32_t order = CUBLASLT_ORDER_COL;
    std::uint64_t rows = 0, cols = 0;
    std::int64_t ld = 0;
    std::int32_t batch_count = 1;
    std::int64_t batch_offset = 0;
};
using cublasLtMatrixLayout_t = cublasLtMatrixLayoutOpaque_t*;

struct cublasLtMatmulPreferenceOpaque_t {
    std::uint64_t max_workspace = 0;
    std::uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D
};
using cublasLtMatmulPreference_t = cublasLtMatmulPreferenceOpaque_t*;

struct cublasLtMatmulAlgo_t {
    std::uint64_t data[8];
};

struct cublasLtMatmulHeuristicResult_t {
    cublasLtMatmulAlgo_t algo;
    std::size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
};

inline const char* cublasLtGetStatusName(cublasStatus_t s) {
    switch (s) {
        case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
        case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
        case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
        case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
        case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
        case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
        case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
        case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    }
    return "unknown cublasStatus_t";
}

inline const char* cublasLtGetStatusString(cublasStatus_t s) {
    switch (s) {
        case CUBLAS_STATUS_SUCCESS: return "success";
        case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
        case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
        case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
        case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
        case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
        case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
        case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported (by snug's cuBLASLt emulation)";
    }
    return "unknown status";
}

inline cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
    if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    *handle = new cublasLtContext;
    return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                               cudaDataType_t scale) {
    if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    *desc = new cublasLtMatmulDescOpaque_t;
    (*desc)->compute = compute;
    (*desc)->scale = scale;
    return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
    delete desc;
    return CUBLAS_STATUS_SUCCESS;
}

namespace snug::cuda::emulated::detail {

// Copies an attribute value of exactly `size` bytes into/out of a field.
template <class Field>
cublasStatus_t set_field(Field& field, const void* buf, std::size_t size) {
    if (buf == nullptr || size != sizeof(Field)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(&field, buf, sizeof(Field));
    return CUBLAS_STATUS_SUCCESS;
}

template <class Field>
cublasStatus_t get_field(const Field& field, void* buf, std::size_t size, std::size_t* written) {
    if (written != nullptr) *written = sizeof(Field);
    if (buf == nullptr && size == 0) return CUBLAS_STATUS_SUCCESS;  // a size query
    if (buf == nullptr || size < sizeof(Field)) return CUBLAS_STATUS_INVALID_VALUE;
    std::memcpy(buf, &field, sizeof(Field));
    return CUBLAS_STATUS_SUCCESS;
}

// Visits the field an attribute names (nullptr: not one the emulator knows).
template <class F>
cublasStatus_t with_desc_field(cublasLtMatmulDescOpaque_t& d, cublasLtMatmulDescAttributes_t attr, F f) {
    switch (attr) {
        case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: return f(d.compute);
        case CUBLASLT_MATMUL_DESC_SCALE_TYPE: return f(d.scale);
        case CUBLASLT_MATMUL_DESC_POINTER_MODE: return f(d.pointer_mode);
        case CUBLASLT_MATMUL_DESC_TRANSA: return f(d.trans_a);
        case CUBLASLT_MATMUL_DESC_TRANSB: return f(d.trans_b);
        case CUBLASLT_MATMUL_DESC_TRANSC: return f(d.trans_c);
        case CUBLASLT_MATMUL_DESC_EPILOGUE: return f(d.epilogue);
        case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return f(d.bias);
        case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: return f(d.bias_batch_stride);
        case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return f(d.bias_type);
    }
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

template <class F>
cublasStatus_t with_layout_field(cublasLtMatrixLayoutOpaque_t& l, cublasLtMatrixLayoutAttribute_t attr, F f) {
    switch (attr) {
        case CUBLASLT_MATRIX_LAYOUT_TYPE: return f(l.type);
        case CUBLASLT_MATRIX_LAYOUT_ORDER: return f(l.order);
        case CUBLASLT_MATRIX_LAYOUT_ROWS: return f(l.rows);
        case CUBLASLT_MATRIX_LAYOUT_COLS: return f(l.cols);
        case CUBLASLT_MATRIX_LAYOUT_LD: return f(l.ld);
        case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: return f(l.batch_count);
        case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return f(l.batch_offset);
    }
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

inline std::size_t type_bytes(cudaDataType_t t) {
    switch (t) {
        case CUDA_R_32F: return 4;
        case CUDA_R_16F: return 2;
        case CUDA_R_16BF: return 2;
        default: return 0;
    }
}

inline constexpr std::uint64_t algo_magic = 0x736E'7567'4C74'0001ULL;  // "snugLt", version 1

// The largest power of two (at most 256) that divides the address.
inline std::uint32_t alignment_of(const void* p) {
    if (p == nullptr) return 256;
    return static_cast<std::uint32_t>(std::min<std::uintptr_t>(256, std::uintptr_t{1} << std::countr_zero(reinterpret_cast<std::uintptr_t>(p))));
}

// The checks the heuristic and the matmul share: NOT_SUPPORTED for what the
// emulator does not implement, INVALID_VALUE for an inconsistent problem.
inline cublasStatus_t check_problem(const cublasLtMatmulDescOpaque_t& d, const cublasLtMatrixLayoutOpaque_t& a,
                                    const cublasLtMatrixLayoutOpaque_t& b, const cublasLtMatrixLayoutOpaque_t& c,
                                    const cublasLtMatrixLayoutOpaque_t& dl) {
    if (d.scale != CUDA_R_32F || d.pointer_mode != CUBLASLT_POINTER_MODE_HOST || d.trans_c != CUBLAS_OP_N)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (d.compute != CUBLAS_COMPUTE_32F && d.compute != CUBLAS_COMPUTE_32F_FAST_TF32 &&
        d.compute != CUBLAS_COMPUTE_32F_FAST_16F && d.compute != CUBLAS_COMPUTE_32F_FAST_16BF)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (d.epilogue != CUBLASLT_EPILOGUE_DEFAULT && d.epilogue != CUBLASLT_EPILOGUE_BIAS)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if ((d.trans_a != CUBLAS_OP_N && d.trans_a != CUBLAS_OP_T) || (d.trans_b != CUBLAS_OP_N && d.trans_b != CUBLAS_OP_T))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    for (const auto* l : {&a, &b, &c, &dl})
        if (l->order != CUBLASLT_ORDER_COL || type_bytes(l->type) == 0) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (a.type != b.type || c.type != dl.type) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (dl.type != CUDA_R_32F && dl.type != a.type) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (d.bias_type != -1 && d.bias_type != dl.type) return CUBLAS_STATUS_NOT_SUPPORTED;
    // op(A) is m x k, op(B) k x n, C and D m x n.
    const std::uint64_t m = dl.rows, n = dl.cols;
    const std::uint64_t am = d.trans_a == CUBLAS_OP_N ? a.rows : a.cols, ak = d.trans_a == CUBLAS_OP_N ? a.cols : a.rows;
    const std::uint64_t bk = d.trans_b == CUBLAS_OP_N ? b.rows : b.cols, bn = d.trans_b == CUBLAS_OP_N ? b.cols : b.rows;
    if (am != m || bn != n || ak != bk || c.rows != m || c.cols != n) return CUBLAS_STATUS_INVALID_VALUE;
    if (m == 0 || n == 0 || ak == 0) return CUBLAS_STATUS_INVALID_VALUE;
    for (const auto* l : {&a, &b, &c, &dl}) {
        if (l->ld < static_cast<std::int64_t>(l->rows) || l->batch_count < 1) return CUBLAS_STATUS_INVALID_VALUE;
        if (l->batch_count != dl.batch_count) return CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}

// Elements a column-major matrix spans, over every batch.
inline std::uint64_t span_elements(const cublasLtMatrixLayoutOpaque_t& l) {
    const std::uint64_t one = (l.cols - 1) * static_cast<std::uint64_t>(l.ld) + l.rows;
    return one + static_cast<std::uint64_t>(l.batch_count - 1) * static_cast<std::uint64_t>(std::max<std::int64_t>(l.batch_offset, 0));
}

inline float load(cudaDataType_t t, const void* base, std::uint64_t i) {
    switch (t) {
        case CUDA_R_16F: return static_cast<float>(static_cast<const snug::half*>(base)[i]);
        case CUDA_R_16BF: return static_cast<float>(static_cast<const snug::bfloat16*>(base)[i]);
        default: return static_cast<const float*>(base)[i];
    }
}

inline void store(cudaDataType_t t, void* base, std::uint64_t i, float v) {
    switch (t) {
        case CUDA_R_16F: static_cast<snug::half*>(base)[i] = snug::half(v); break;
        case CUDA_R_16BF: static_cast<snug::bfloat16*>(base)[i] = snug::bfloat16(v); break;
        default: static_cast<float*>(base)[i] = v; break;
    }
}

// TF32: 10 explicit mantissa bits, rounded to nearest with ties away from zero.
inline float round_tf32(float x) {
    auto bits = std::bit_cast<std::uint32_t>(x);
    if ((bits & 0x7F80'0000U) == 0x7F80'0000U) return x;  // inf, NaN
    bits = (bits + 0x1000U) & 0xFFFF'E000U;
    return std::bit_cast<float>(bits);
}

inline float round_input(cublasComputeType_t compute, cudaDataType_t type, float x) {
    if (type != CUDA_R_32F) return x;  // 16-bit inputs are exact in fp32
    switch (compute) {
        case CUBLAS_COMPUTE_32F_FAST_TF32: return round_tf32(x);
        case CUBLAS_COMPUTE_32F_FAST_16F: return static_cast<float>(snug::half(x));
        case CUBLAS_COMPUTE_32F_FAST_16BF: return static_cast<float>(snug::bfloat16(x));
        default: return x;
    }
}

// Reports an access outside device memory as the sticky error a GPU would leave.
inline cublasStatus_t illegal_address(const char* what) {
    std::lock_guard lock(state().mutex);
    if (state().sticky == cudaSuccess) {
        state().sticky = cudaErrorIllegalAddress;
        state().sticky_message = std::string("cublasLtMatmul: matrix ") + what +
                                 " reaches outside device memory (an illegal address on a GPU)";
    }
    return CUBLAS_STATUS_EXECUTION_FAILED;
}

}  // namespace snug::cuda::emulated::detail

inline cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                                     const void* buf, std::size_t size) {
    using namespace snug::cuda::emulated::detail;
    if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    return with_desc_field(*desc, attr, [&](auto& field) { return set_field(field, buf, size); });
}

inline cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                                     void* buf, std::size_t size, std::size_t* written) {
    using namespace snug::cuda::emulated::detail;
    if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    return with_desc_field(*desc, attr, [&](auto& field) { return get_field(field, buf, size, written); });
}

inline cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, std::uint64_t rows,
                                                 std::uint64_t cols, std::int64_t ld) {
    if (layout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    *layout = new cublasLtMatrixLayoutOpaque_t;
    (*layout)->type = type;
    (*layout)->rows = rows;
    (*layout)->cols = cols;
    (*layout)->ld = ld;
    return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
    delete layout;
    return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                       cublasLtMatrixLayoutAttribute_t attr, const void* buf,
                                                       std::size_t size) {
    using namespace snug::cuda::emulated::detail;
    if (layout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    return with_layout_field(*layout, attr, [&](auto& field) { return set_field(field, buf, size); });
}

inline cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t layout,
                                                       cublasLtMatrixLayoutAttribute_t attr, void* buf,
                                                       std::size_t size, std::size_t* written) {
    using namespace snug::cuda::emulated::detail;
    if (layout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    return with_layout_field(*layout, attr, [&](auto& field) { return get_field(field, buf, size, written); });
}

inline cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
    if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    *pref = new cublasLtMatmulPreferenceOpaque_t;
    return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    delete pref;
    return CUBLAS_STATUS_SUCCESS;
}

inline cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                           cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                           std::size_t size) {
    using namespace snug::cuda::emulated::detail;
    if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
        case CUBLASLT_MATMUL_PREF_SEARCH_MODE: {
            std::uint32_t ignored = 0;
            return set_field(ignored, buf, size);
        }
        case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return set_field(pref->max_workspace, buf, size);
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return set_field(pref->align[0], buf, size);
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return set_field(pref->align[1], buf, size);
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return set_field(pref->align[2], buf, size);
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return set_field(pref->align[3], buf, size);
    }
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

// One algorithm for every problem the emulator supports; it needs no workspace.
inline cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                                     cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                                     cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                                     cublasLtMatmulPreference_t pref, int requested,
                                                     cublasLtMatmulHeuristicResult_t* results, int* returned) {
    using namespace snug::cuda::emulated::detail;
    if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (desc == nullptr || a == nullptr || b == nullptr || c == nullptr || d == nullptr || pref == nullptr ||
        requested < 1 || results == nullptr || returned == nullptr)
        return CUBLAS_STATUS_INVALID_VALUE;
    *returned = 0;
    if (const cublasStatus_t s = check_problem(*desc, *a, *b, *c, *d); s != CUBLAS_STATUS_SUCCESS) return s;
    cublasLtMatmulHeuristicResult_t& r = results[0];
    r = cublasLtMatmulHeuristicResult_t{};
    r.algo.data[0] = algo_magic;
    for (int i = 0; i < 4; ++i) r.algo.data[1 + i] = std::max<std::uint32_t>(pref->align[i], 1);
    r.algo.data[5] = desc->epilogue == CUBLASLT_EPILOGUE_BIAS ? std::min<std::uint32_t>(alignment_of(desc->bias), 16) : 1;
    r.workspaceSize = 0;
    r.state = CUBLAS_STATUS_SUCCESS;
    r.wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

// D = alpha op(A) op(B) + beta C (+ bias), column-major, per batch; fp32
// accumulation, D rounded once. C may be D (in place); D must not overlap A or B.
inline cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                                     const void* A, cublasLtMatrixLayout_t a, const void* B, cublasLtMatrixLayout_t b,
                                     const void* beta, const void* C, cublasLtMatrixLayout_t c, void* D,
                                     cublasLtMatrixLayout_t d, const cublasLtMatmulAlgo_t* algo, void* workspace,
                                     std::size_t workspace_bytes, cudaStream_t stream) {
    using namespace snug::cuda::emulated::detail;
    (void)workspace;
    (void)workspace_bytes;
    if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (desc == nullptr || a == nullptr || b == nullptr || c == nullptr || d == nullptr || alpha == nullptr ||
        beta == nullptr || A == nullptr || B == nullptr || D == nullptr)
        return CUBLAS_STATUS_INVALID_VALUE;
    {
        std::lock_guard lock(state().mutex);
        if (state().sticky != cudaSuccess) return CUBLAS_STATUS_EXECUTION_FAILED;
        if (!valid_stream_locked(stream)) return CUBLAS_STATUS_INVALID_VALUE;
    }
    if (const cublasStatus_t s = check_problem(*desc, *a, *b, *c, *d); s != CUBLAS_STATUS_SUCCESS) return s;
    const float alpha_v = *static_cast<const float*>(alpha), beta_v = *static_cast<const float*>(beta);
    if (beta_v != 0.0f && C == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    const bool bias = desc->epilogue == CUBLASLT_EPILOGUE_BIAS;
    if (bias && desc->bias == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    if (algo != nullptr) {
        if (algo->data[0] != algo_magic) return CUBLAS_STATUS_INVALID_VALUE;
        const void* ptrs[4] = {A, B, C, D};
        for (int i = 0; i < 4; ++i)
            if (ptrs[i] != nullptr && reinterpret_cast<std::uintptr_t>(ptrs[i]) % algo->data[1 + i] != 0)
                return CUBLAS_STATUS_INVALID_VALUE;  // the algorithm was chosen for better-aligned pointers
        if (bias && reinterpret_cast<std::uintptr_t>(desc->bias) % algo->data[5] != 0) return CUBLAS_STATUS_INVALID_VALUE;
    }
    // Every matrix inside device memory, D clear of A and B.
    const auto bytes_of = [](const cublasLtMatrixLayoutOpaque_t& l) { return span_elements(l) * type_bytes(l.type); };
    const auto overlaps = [](const void* x, std::uint64_t nx, const void* y, std::uint64_t ny) {
        const auto px = reinterpret_cast<std::uintptr_t>(x), py = reinterpret_cast<std::uintptr_t>(y);
        return px < py + ny && py < px + nx;
    };
    const std::uint64_t bias_bytes =
        (d->rows + static_cast<std::uint64_t>(d->batch_count - 1) *
                       static_cast<std::uint64_t>(std::max<std::int64_t>(desc->bias_batch_stride, 0))) *
        type_bytes(d->type);
    const struct {
        const void* p;
        std::uint64_t bytes;
        const char* name;
    } spans[] = {{A, bytes_of(*a), "A"},
                 {B, bytes_of(*b), "B"},
                 {beta_v != 0.0f ? C : nullptr, bytes_of(*c), "C"},
                 {D, bytes_of(*d), "D"},
                 {bias ? desc->bias : nullptr, bias_bytes, "bias"}};
    const char* outside = nullptr;
    {
        std::lock_guard lock(state().mutex);
        for (const auto& s : spans)
            if (outside == nullptr && s.p != nullptr && !inside_device_locked(s.p, s.bytes)) outside = s.name;
    }
    if (outside != nullptr) return illegal_address(outside);
    if (overlaps(D, bytes_of(*d), A, bytes_of(*a)) || overlaps(D, bytes_of(*d), B, bytes_of(*b)))
        return CUBLAS_STATUS_INVALID_VALUE;

    const std::uint64_t m = d->rows, n = d->cols, k = desc->trans_a == CUBLAS_OP_N ? a->cols : a->rows;
    const auto mi = static_cast<std::int64_t>(m), ni = static_cast<std::int64_t>(n), ki = static_cast<std::int64_t>(k);
    std::vector<float> wa(m * k), wb(k * n), acc(m * n);
    for (int batch = 0; batch < d->batch_count; ++batch) {
        const auto off = [&](const cublasLtMatrixLayoutOpaque_t& l) {
            return static_cast<std::uint64_t>(batch) * static_cast<std::uint64_t>(l.batch_offset);
        };
        // Row-major copies of op(A) (m x k) and op(B) (k x n), rounded as the compute type says.
        for (std::uint64_t i = 0; i < m; ++i)
            for (std::uint64_t p = 0; p < k; ++p) {
                const std::uint64_t idx = desc->trans_a == CUBLAS_OP_N ? i + p * static_cast<std::uint64_t>(a->ld)
                                                                       : p + i * static_cast<std::uint64_t>(a->ld);
                wa[i * k + p] = round_input(desc->compute, a->type, load(a->type, A, off(*a) + idx));
            }
        for (std::uint64_t p = 0; p < k; ++p)
            for (std::uint64_t j = 0; j < n; ++j) {
                const std::uint64_t idx = desc->trans_b == CUBLAS_OP_N ? p + j * static_cast<std::uint64_t>(b->ld)
                                                                       : j + p * static_cast<std::uint64_t>(b->ld);
                wb[p * n + j] = round_input(desc->compute, b->type, load(b->type, B, off(*b) + idx));
            }
        snug::host::gemm(snug::host::Op::N, snug::host::Op::N, mi, ni, ki, 1.0f, wa.data(), ki, wb.data(), ni, 0.0f,
                         acc.data(), ni);
        const std::uint64_t bias_off = static_cast<std::uint64_t>(batch) *
                                       static_cast<std::uint64_t>(std::max<std::int64_t>(desc->bias_batch_stride, 0));
        for (std::uint64_t j = 0; j < n; ++j)
            for (std::uint64_t i = 0; i < m; ++i) {
                float v = alpha_v * acc[i * n + j];
                if (beta_v != 0.0f)
                    v = v + beta_v * load(c->type, C, off(*c) + i + j * static_cast<std::uint64_t>(c->ld));
                if (bias) v = v + load(d->type, desc->bias, bias_off + i);
                store(d->type, D, off(*d) + i + j * static_cast<std::uint64_t>(d->ld), v);
            }
    }
    return CUBLAS_STATUS_SUCCESS;
}
