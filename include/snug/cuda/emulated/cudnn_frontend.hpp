// cuDNN for the emulated backend: the part of cuDNN's graph API (the header-
// only frontend, cudnn_frontend 1.x, over cudnn.h's handle) that snug's fused
// attention (snug/cuda/cudnn_attention.hpp) uses, checked as that code's use
// of it must be and computed by snug's host flash-attention kernels.
//
// A Graph here holds tensors and one causal SDPA node, forward
// (Graph::sdpa: Q, K, V -> O and the softmax statistics) or backward
// (Graph::sdpa_backward: Q, K, V, O, dO, statistics -> dQ, dK, dV), in
// dimensions (b, h, s, d) with any strides, I/O in HALF or BFLOAT16, the
// statistics in FLOAT (b, h, s, 1). The calls must come in cuDNN's order:
// validate, build_operation_graph, create_execution_plans, check_support,
// build_plans, then get_workspace_size and execute. What is checked:
//   validate       every tensor has four dimensions and four strides, a
//                  uid, a unique name; Q, K, V, O, dO and the gradients have
//                  the same dimensions, the statistics (b, h, s, 1) in FLOAT;
//                  every output is marked set_output(true)
//   check_support  the I/O type is HALF or BFLOAT16, intermediates and
//                  compute FLOAT; the mask is causal (the only one emulated);
//                  the forward generates the statistics; d a multiple of 8,
//                  at most 128 (cuDNN's limits on sm_80..sm_90 for these
//                  types); a scale is set. A refusal is GRAPH_NOT_SUPPORTED
//                  with a message, as cuDNN's is.
//   execute        every uid of the graph is in the variant pack, every
//                  tensor 16-byte aligned and inside device memory for its
//                  dimensions and strides (else the sticky
//                  cudaErrorIllegalAddress, as on a GPU), the workspace
//                  present and inside device memory when one is needed; the
//                  handle's stream valid.
// The workspace: nothing for the forward; for the backward what frontend
// 1.32 sizes for a dense, deterministic SDPA backward — its softmax sums
// (b h s fp32) and the dP buffer of the deterministic path (b h s64 s64 2
// bytes, s64 = s rounded up to 64) — and no engine workspace (only a GPU
// can say that part); the emulated execute fills it with 0xFF bytes, so a
// caller that gave too little faults under AddressSanitizer.
// The result is the host flash attention's (ops/flash_attention.hpp), which is
// what the tests compare cuDNN's against on a GPU: emulation verifies the
// wiring — shapes, strides, types, the cache, the workspace through the
// tracker and the planner — not NVIDIA's kernels. Anything the emulator does
// not implement is refused by name rather than computed wrongly.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "snug/core/half.hpp"
#include "snug/cuda/emulated/runtime.hpp"
#include "snug/host/flash_attention.hpp"

// ---- cudnn.h: the handle ----------------------------------------------------------------

enum cudnnStatus_t {
    CUDNN_STATUS_SUCCESS = 0,
    CUDNN_STATUS_NOT_INITIALIZED = 1001,
    CUDNN_STATUS_BAD_PARAM = 2000,
    CUDNN_STATUS_EXECUTION_FAILED = 5000,
};

struct cudnnContext {
    cudaStream_t stream = nullptr;
};
using cudnnHandle_t = cudnnContext*;

inline cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
    if (handle == nullptr) return CUDNN_STATUS_BAD_PARAM;
    *handle = new cudnnContext{};
    return CUDNN_STATUS_SUCCESS;
}
inline cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
    delete handle;
    return CUDNN_STATUS_SUCCESS;
}
inline cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
    if (handle == nullptr) return CUDNN_STATUS_NOT_INITIALIZED;
    handle->stream = stream;
    return CUDNN_STATUS_SUCCESS;
}
inline const char* cudnnGetErrorString(cudnnStatus_t status) {
    switch (status) {
        case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
        case CUDNN_STATUS_NOT_INITIALIZED: return "CUDNN_STATUS_NOT_INITIALIZED";
        case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
        case CUDNN_STATUS_EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
    }
    return "CUDNN_STATUS_UNKNOWN";
}
// The version the emulator stands for (cudnn.h's MAJOR * 10000 + MINOR * 100 + PATCH).
inline std::size_t cudnnGetVersion() { return 91900; }

// ---- cudnn_frontend: the graph ----------------------------------------------------------

#define CUDNN_FRONTEND_MAJOR_VERSION 1
#define CUDNN_FRONTEND_MINOR_VERSION 32
#define CUDNN_FRONTEND_PATCH_VERSION 0

namespace cudnn_frontend {

// The frontend's shim over cudnn.h, which snug calls instead of cudnn.h itself
// (on a GPU machine it calls cuDNN through the handle load_cudnn() opened).
namespace detail {
inline cudnnStatus_t create_handle(cudnnHandle_t* handle) { return cudnnCreate(handle); }
inline cudnnStatus_t destroy_handle(cudnnHandle_t handle) { return cudnnDestroy(handle); }
inline cudnnStatus_t set_stream(cudnnHandle_t handle, cudaStream_t stream) { return cudnnSetStream(handle, stream); }
inline const char* get_error_string(cudnnStatus_t status) { return cudnnGetErrorString(status); }
inline std::size_t get_backend_version() { return cudnnGetVersion(); }
}  // namespace detail

enum class DataType_t { NOT_SET, FLOAT, DOUBLE, HALF, INT8, INT32, INT8x4, UINT8, UINT8x4, INT8x32, BFLOAT16, INT64 };
enum class HeurMode_t { A, B, FALLBACK };

enum class error_code_t {
    OK,
    ATTRIBUTE_NOT_SET,
    SHAPE_DEDUCTION_FAILED,
    INVALID_TENSOR_NAME,
    INVALID_VARIANT_PACK,
    GRAPH_NOT_SUPPORTED,
    GRAPH_EXECUTION_PLAN_CREATION_FAILED,
    GRAPH_EXECUTION_FAILED,
    HEURISTIC_QUERY_FAILED,
    UNSUPPORTED_GRAPH_FORMAT,
    CUDA_API_FAILED,
    CUDNN_BACKEND_API_FAILED,
    INVALID_CUDA_DEVICE,
    HANDLE_ERROR,
};

struct error_object {
    error_code_t code = error_code_t::OK;
    std::string err_msg;
    error_object() = default;
    error_object(error_code_t c, std::string msg) : code(c), err_msg(std::move(msg)) {}
    error_code_t get_code() const { return code; }
    std::string get_message() const { return err_msg; }
    bool is_good() const { return code == error_code_t::OK; }
    bool is_bad() const { return !is_good(); }
};
using error_t = error_object;

namespace graph {

class Tensor_attributes {
public:
    using uid_t = std::int64_t;

    Tensor_attributes& set_name(const std::string& v) { name_ = v; return *this; }
    Tensor_attributes& set_dim(const std::vector<std::int64_t>& v) { dim_ = v; return *this; }
    Tensor_attributes& set_stride(const std::vector<std::int64_t>& v) { stride_ = v; return *this; }
    Tensor_attributes& set_uid(uid_t v) { uid_ = v; has_uid_ = true; return *this; }
    Tensor_attributes& set_data_type(DataType_t v) { type_ = v; return *this; }
    Tensor_attributes& set_is_pass_by_value(bool v) { by_value_ = v; return *this; }
    Tensor_attributes& set_output(bool v) { output_ = v; return *this; }

    const std::string& get_name() const { return name_; }
    const std::vector<std::int64_t>& get_dim() const { return dim_; }
    const std::vector<std::int64_t>& get_stride() const { return stride_; }
    uid_t get_uid() const { return uid_; }
    bool has_uid() const { return has_uid_; }
    DataType_t get_data_type() const { return type_; }
    bool get_is_output() const { return output_; }
    bool get_is_pass_by_value() const { return by_value_; }

private:
    std::string name_;
    std::vector<std::int64_t> dim_, stride_;
    uid_t uid_ = -1;
    bool has_uid_ = false;
    DataType_t type_ = DataType_t::NOT_SET;
    bool by_value_ = false, output_ = false;
};

class SDPA_attributes {
public:
    SDPA_attributes& set_name(const std::string& v) { name = v; return *this; }
    SDPA_attributes& set_generate_stats(bool v) { generate_stats = v; return *this; }
    SDPA_attributes& set_is_inference(bool v) { return set_generate_stats(!v); }
    SDPA_attributes& set_causal_mask(bool v) { causal = v; return *this; }
    SDPA_attributes& set_attn_scale(float v) { scale = v; has_scale = true; return *this; }

    std::string name;
    bool generate_stats = false, causal = false, has_scale = false;
    float scale = 1.0f;
};

class SDPA_backward_attributes {
public:
    SDPA_backward_attributes& set_name(const std::string& v) { name = v; return *this; }
    SDPA_backward_attributes& set_causal_mask(bool v) { causal = v; return *this; }
    SDPA_backward_attributes& set_attn_scale(float v) { scale = v; has_scale = true; return *this; }
    SDPA_backward_attributes& set_deterministic_algorithm(bool v) { deterministic = v; return *this; }

    std::string name;
    bool causal = false, has_scale = false, deterministic = false;
    float scale = 1.0f;
};

class Graph {
public:
    using TensorPtr = std::shared_ptr<Tensor_attributes>;

    Graph& set_io_data_type(DataType_t t) { io_ = t; return *this; }
    Graph& set_intermediate_data_type(DataType_t t) { intermediate_ = t; return *this; }
    Graph& set_compute_data_type(DataType_t t) { compute_ = t; return *this; }

    TensorPtr tensor(const Tensor_attributes& t) {
        tensors_.push_back(std::make_shared<Tensor_attributes>(t));
        return tensors_.back();
    }

    // O and the statistics (nullptr unless generated).
    std::array<TensorPtr, 2> sdpa(TensorPtr q, TensorPtr k, TensorPtr v, SDPA_attributes a) {
        node_ = Node::forward;
        forward_ = a;
        in_ = {q, k, v};
        auto o = output("O");
        auto stats = a.generate_stats ? output("Stats") : nullptr;
        out_ = {o, stats};
        return {o, stats};
    }

    // dQ, dK, dV.
    std::array<TensorPtr, 3> sdpa_backward(TensorPtr q, TensorPtr k, TensorPtr v, TensorPtr o, TensorPtr dO,
                                           TensorPtr stats, SDPA_backward_attributes a) {
        node_ = Node::backward;
        backward_ = a;
        in_ = {q, k, v, o, dO, stats};
        out_ = {output("dQ"), output("dK"), output("dV")};
        return {out_[0], out_[1], out_[2]};
    }

    error_t validate() {
        if (node_ == Node::none) return fail(error_code_t::ATTRIBUTE_NOT_SET, "the graph has no SDPA node");
        std::set<std::string> names;
        std::set<std::int64_t> uids;
        for (const TensorPtr& t : all()) {
            if (t->get_dim().size() != 4 || t->get_stride().size() != 4)
                return fail(error_code_t::ATTRIBUTE_NOT_SET,
                            "tensor '" + t->get_name() + "' needs four dimensions and four strides");
            if (!t->has_uid()) return fail(error_code_t::ATTRIBUTE_NOT_SET, "tensor '" + t->get_name() + "' has no uid");
            if (!names.insert(t->get_name()).second)
                return fail(error_code_t::INVALID_TENSOR_NAME, "two tensors are named '" + t->get_name() + "'");
            if (!uids.insert(t->get_uid()).second)
                return fail(error_code_t::ATTRIBUTE_NOT_SET, "two tensors have uid " + std::to_string(t->get_uid()));
            for (std::size_t i = 0; i < 4; ++i)
                if (t->get_dim()[i] < 1 || t->get_stride()[i] < 0)
                    return fail(error_code_t::ATTRIBUTE_NOT_SET,
                                "tensor '" + t->get_name() + "' has a dimension below 1 or a negative stride");
        }
        for (const TensorPtr& t : out_)
            if (t != nullptr && !t->get_is_output())
                return fail(error_code_t::ATTRIBUTE_NOT_SET, "output '" + t->get_name() + "' is not set_output(true)");
        const std::vector<std::int64_t>& d = in_[0]->get_dim();
        for (const TensorPtr& t : all()) {
            if (is_stats(t)) {
                if (t->get_dim() != std::vector<std::int64_t>{d[0], d[1], d[2], 1} ||
                    t->get_data_type() != DataType_t::FLOAT)
                    return fail(error_code_t::SHAPE_DEDUCTION_FAILED,
                                "the statistics '" + t->get_name() + "' must be FLOAT (b, h, s, 1)");
            } else if (t->get_dim() != d) {
                return fail(error_code_t::SHAPE_DEDUCTION_FAILED,
                            "tensor '" + t->get_name() + "' has other dimensions than Q (emulated: no GQA, s_q == s_kv)");
            }
        }
        stage_ = Stage::validated;
        return {};
    }

    error_t build_operation_graph(cudnnHandle_t handle) {
        if (handle == nullptr) return fail(error_code_t::HANDLE_ERROR, "no cuDNN handle");
        return advance(Stage::validated, Stage::operation_graph, "build_operation_graph");
    }
    error_t create_execution_plans(const std::vector<HeurMode_t>& modes) {
        if (modes.empty()) return fail(error_code_t::HEURISTIC_QUERY_FAILED, "no heuristic mode");
        return advance(Stage::operation_graph, Stage::plans, "create_execution_plans");
    }
    error_t check_support(cudnnHandle_t) { return check_support(); }
    error_t check_support() {
        if (stage_ != Stage::plans) return out_of_order("check_support");
        if (io_ != DataType_t::HALF && io_ != DataType_t::BFLOAT16)
            return fail(error_code_t::GRAPH_NOT_SUPPORTED, "SDPA takes HALF or BFLOAT16 input and output");
        if (intermediate_ != DataType_t::FLOAT || compute_ != DataType_t::FLOAT)
            return fail(error_code_t::GRAPH_NOT_SUPPORTED, "SDPA computes and keeps intermediates in FLOAT");
        const bool causal = node_ == Node::forward ? forward_.causal : backward_.causal;
        const bool scaled = node_ == Node::forward ? forward_.has_scale : backward_.has_scale;
        if (!causal) return fail(error_code_t::GRAPH_NOT_SUPPORTED, "the emulated SDPA implements the causal mask only");
        if (!scaled) return fail(error_code_t::GRAPH_NOT_SUPPORTED, "the emulated SDPA needs set_attn_scale");
        if (node_ == Node::forward && !forward_.generate_stats)
            return fail(error_code_t::GRAPH_NOT_SUPPORTED, "the emulated SDPA forward always generates the statistics");
        const std::int64_t hd = in_[0]->get_dim()[3];
        if (hd % 8 != 0 || hd > 128)
            return fail(error_code_t::GRAPH_NOT_SUPPORTED,
                        "SDPA head dimension " + std::to_string(hd) + " is not a multiple of 8 up to 128");
        stage_ = Stage::supported;
        return {};
    }
    error_t build_plans(cudnnHandle_t) { return build_plans(); }
    error_t build_plans() { return advance(Stage::supported, Stage::built, "build_plans"); }

    error_t get_workspace_size(std::int64_t& bytes) const {
        if (stage_ != Stage::built) return out_of_order("get_workspace_size");
        bytes = workspace_bytes();
        return {};
    }

    error_t execute(cudnnHandle_t handle, std::unordered_map<std::int64_t, void*>& pack, void* workspace) const {
        if (stage_ != Stage::built) return out_of_order("execute");
        if (handle == nullptr) return {error_code_t::HANDLE_ERROR, "no cuDNN handle"};
        std::vector<void*> ptr;
        for (const TensorPtr& t : all()) {
            const auto it = pack.find(t->get_uid());
            if (it == pack.end() || it->second == nullptr)
                return {error_code_t::INVALID_VARIANT_PACK,
                        "the variant pack has no pointer for '" + t->get_name() + "' (uid " +
                            std::to_string(t->get_uid()) + ")"};
            if (reinterpret_cast<std::uintptr_t>(it->second) % 16 != 0)
                return {error_code_t::INVALID_VARIANT_PACK, "'" + t->get_name() + "' is not 16-byte aligned"};
            ptr.push_back(it->second);
        }
        namespace em = snug::cuda::emulated::detail;
        const std::int64_t ws = workspace_bytes();
        {
            std::lock_guard lock(em::state().mutex);
            if (em::state().sticky != cudaSuccess) return {error_code_t::CUDA_API_FAILED, "a sticky CUDA error"};
            if (!em::valid_stream_locked(handle->stream))
                return {error_code_t::CUDA_API_FAILED, "the handle's stream is not a stream"};
            const std::vector<TensorPtr> ts = all();
            for (std::size_t i = 0; i < ts.size(); ++i)
                if (!em::inside_device_locked(ptr[i], span_bytes(*ts[i])))
                    return illegal_address("tensor '" + ts[i]->get_name() + "'");
            if (ws > 0 && (workspace == nullptr || !em::inside_device_locked(workspace, static_cast<std::size_t>(ws))))
                return illegal_address("the workspace of " + std::to_string(ws) + " bytes");
        }
        if (ws > 0) std::memset(workspace, 0xFF, static_cast<std::size_t>(ws));
        if (io_ == DataType_t::BFLOAT16) run<snug::bfloat16>(ptr);
        else run<snug::half>(ptr);
        return {};
    }

private:
    enum class Node { none, forward, backward };
    enum class Stage { made, validated, operation_graph, plans, supported, built };

    TensorPtr output(const char* name) {
        auto t = std::make_shared<Tensor_attributes>();
        t->set_name(name);
        outputs_.push_back(t);
        return t;
    }

    // The graph's tensors in a fixed order: the node's inputs, then its outputs.
    std::vector<TensorPtr> all() const {
        std::vector<TensorPtr> v;
        for (const TensorPtr& t : in_) v.push_back(t);
        for (const TensorPtr& t : out_)
            if (t != nullptr) v.push_back(t);
        return v;
    }
    bool is_stats(const TensorPtr& t) const {
        return node_ == Node::forward ? t == out_[1] : t == in_[5];
    }

    std::int64_t workspace_bytes() const {
        if (node_ != Node::backward) return 0;
        const std::vector<std::int64_t>& d = in_[0]->get_dim();
        const std::int64_t s64 = (d[2] + 63) / 64 * 64;
        const std::int64_t softmax_sums = d[0] * d[1] * d[2] * 4;
        return softmax_sums + (backward_.deterministic ? d[0] * d[1] * s64 * s64 * 2 : d[0] * d[1] * d[2] * d[3] * 4);
    }

    // Bytes from a tensor's first element to one past its last.
    std::size_t span_bytes(const Tensor_attributes& t) const {
        std::int64_t last = 0;
        for (std::size_t i = 0; i < 4; ++i) last += (t.get_dim()[i] - 1) * t.get_stride()[i];
        const std::int64_t elem = t.get_data_type() == DataType_t::FLOAT || is_stats_attr(t) ? 4 : 2;
        return static_cast<std::size_t>((last + 1) * elem);
    }
    bool is_stats_attr(const Tensor_attributes& t) const {
        for (const TensorPtr& p : all())
            if (p.get() == &t) return is_stats(p);
        return false;
    }

    // Element (b, h, s, d) of tensor t at p.
    template <class E>
    static E& at(void* p, const Tensor_attributes& t, std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d) {
        const std::vector<std::int64_t>& st = t.get_stride();
        return static_cast<E*>(p)[b * st[0] + h * st[1] + s * st[2] + d * st[3]];
    }

    // Gathers the strided (b, h, s, d) tensors into snug's packed layouts,
    // runs the host flash attention, and scatters its results back.
    template <class T>
    void run(const std::vector<void*>& ptr) const {
        const std::vector<std::int64_t>& d = in_[0]->get_dim();
        const int B = static_cast<int>(d[0]), NH = static_cast<int>(d[1]), S = static_cast<int>(d[2]);
        const int hs = static_cast<int>(d[3]), C = NH * hs;
        const float scale = node_ == Node::forward ? forward_.scale : backward_.scale;
        if (scale != 1.0f / std::sqrt(static_cast<float>(hs)))
            throw snug::Error("emulated cuDNN SDPA: only the scale 1 / sqrt(d) is emulated");
        const std::size_t rows = static_cast<std::size_t>(B) * S;
        std::vector<T> qkv(rows * 3 * C);
        // (B, S, C) tensors <-> (b, h, s, d) views.
        const auto each = [&](auto&& f) {
            for (int b = 0; b < B; ++b)
                for (int h = 0; h < NH; ++h)
                    for (int s = 0; s < S; ++s)
                        for (int e = 0; e < hs; ++e) f(b, h, s, e, (static_cast<std::size_t>(b) * S + s));
        };
        for (int part = 0; part < 3; ++part)
            each([&](int b, int h, int s, int e, std::size_t row) {
                qkv[row * 3 * C + part * C + h * hs + e] = at<T>(ptr[part], *in_[part], b, h, s, e);
            });
        std::vector<float> lse(rows * NH);
        const auto stat = [&](int b, int h, int s) -> float& {
            return lse[(static_cast<std::size_t>(b) * NH + h) * S + s];
        };
        if (node_ == Node::forward) {
            std::vector<T> out(rows * C);
            snug::host::flash_attention_forward(snug::Host{}, out.data(), lse.data(), qkv.data(), B, S, C, NH);
            each([&](int b, int h, int s, int e, std::size_t row) {
                at<T>(ptr[3], *out_[0], b, h, s, e) = out[row * C + h * hs + e];
                if (e == 0) at<float>(ptr[4], *out_[1], b, h, s, 0) = stat(b, h, s);
            });
            return;
        }
        std::vector<T> out(rows * C), dout(rows * C), dqkv(rows * 3 * C);
        each([&](int b, int h, int s, int e, std::size_t row) {
            out[row * C + h * hs + e] = at<T>(ptr[3], *in_[3], b, h, s, e);
            dout[row * C + h * hs + e] = at<T>(ptr[4], *in_[4], b, h, s, e);
            if (e == 0) stat(b, h, s) = at<float>(ptr[5], *in_[5], b, h, s, 0);
        });
        std::vector<float> D(rows * NH);
        snug::host::flash_attention_backward(snug::Host{}, dqkv.data(), D.data(), dout.data(), qkv.data(), out.data(),
                                             lse.data(), B, S, C, NH);
        for (int part = 0; part < 3; ++part)
            each([&](int b, int h, int s, int e, std::size_t row) {
                at<T>(ptr[6 + part], *out_[part], b, h, s, e) = dqkv[row * 3 * C + part * C + h * hs + e];
            });
    }

    error_t advance(Stage from, Stage to, const char* call) {
        if (stage_ != from) return out_of_order(call);
        stage_ = to;
        return {};
    }
    error_t fail(error_code_t code, const std::string& why) {
        stage_ = Stage::made;
        return {code, why};
    }
    static error_t out_of_order(const char* call) {
        return {error_code_t::ATTRIBUTE_NOT_SET,
                std::string(call) + " out of order (validate, build_operation_graph, create_execution_plans, "
                                    "check_support, build_plans, then get_workspace_size and execute)"};
    }
    static error_t illegal_address(const std::string& what) {
        namespace em = snug::cuda::emulated::detail;
        if (em::state().sticky == cudaSuccess) {
            em::state().sticky = cudaErrorIllegalAddress;
            em::state().sticky_message = "cuDNN SDPA: " + what + " reaches outside device memory (an illegal "
                                         "address on a GPU)";
        }
        return {error_code_t::GRAPH_EXECUTION_FAILED, what + " reaches outside device memory"};
    }

    DataType_t io_ = DataType_t::NOT_SET, intermediate_ = DataType_t::NOT_SET, compute_ = DataType_t::NOT_SET;
    std::vector<TensorPtr> tensors_, outputs_;
    Node node_ = Node::none;
    SDPA_attributes forward_;
    SDPA_backward_attributes backward_;
    std::vector<TensorPtr> in_;   // forward: Q, K, V; backward: Q, K, V, O, dO, Stats
    std::vector<TensorPtr> out_;  // forward: O, Stats; backward: dQ, dK, dV
    Stage stage_ = Stage::made;
};

}  // namespace graph
}  // namespace cudnn_frontend
