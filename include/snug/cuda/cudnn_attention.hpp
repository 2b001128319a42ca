// cuDNN's fused SDPA as snug's fused attention engine (cuda/fused_attention.hpp,
// ops/fused_attention.hpp): causal, bf16 or fp16 I/O with fp32 statistics and
// compute, on snug's fused qkv (B, T, 3C) in place, through cuDNN's graph API
// (the header-only cudnn_frontend; under SNUG_CUDA_EMULATED its emulated twin,
// snug/cuda/emulated/cudnn_frontend.hpp, which computes with the host flash
// kernels).
//
// Graphs are built once per shape and pass (the slow part: cuDNN compiles and
// picks kernels) and cached; a case cuDNN refuses (check_support) is cached as
// its refusal, and layers take the flash kernels for it. cuDNN is opened at
// first use (NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING, as snug's CMake builds it:
// load_cudnn() below dlopens libcudnn.so.9 and hands the frontend its handle),
// so a program runs where cuDNN is missing, and every case is then refused,
// saying so. Every call into cuDNN itself goes through the frontend's shim
// (cudnn_frontend::detail), which is what makes that loading work. The backward is
// cuDNN's deterministic algorithm: the same bits every run, so that a
// checkpointed block's gradients equal a plain block's (TrainStep's promise).
// It costs workspace: cuDNN's dP buffer of about B NH T^2 2 bytes (384 MiB at
// B 16, NH 12, T 1024) while a block's attention backward runs; the planner
// counts it (the engine answers workspace_bytes for each shape).
//
// Built by the host compiler, never by nvcc (cuDNN's frontend is large and
// nvcc gains nothing from it): a program includes this header in one
// translation unit of its own and registers the engine there —
//   static const snug::cuda::CudnnRegistration cudnn;   // examples/cudnn_engine.cpp
// — and its kernels' translation units see only cuda/fused_attention.hpp.
// (That one translation unit also defines the handle the frontend finds cuDNN
// through, so a second would not link: "multiple definition of cudnn_dlhandle".)
#pragma once

#if defined(__CUDACC__)
#error "snug/cuda/cudnn_attention.hpp is for the host compiler: include it in a .cpp of its own (see its header)"
#endif

#include "snug/cuda/runtime.hpp"

#if defined(SNUG_CUDA_EMULATED)
#include "snug/cuda/emulated/cudnn_frontend.hpp"
#else
#include <cudnn_frontend.h>
#endif

#include <cmath>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>

#include "snug/core/error.hpp"
#include "snug/cuda/check.hpp"
#include "snug/cuda/fused_attention.hpp"
#include "snug/cuda/launch_observer.hpp"

#if defined(NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING) && !defined(SNUG_CUDA_EMULATED)
#include <dlfcn.h>
// The frontend calls cuDNN through this handle (cudnn_frontend_shim.h declares
// it and leaves its definition, and the opening, to the program).
void* cudnn_frontend::cudnn_dlhandle = nullptr;
#endif

namespace snug::cuda {

namespace fe = ::cudnn_frontend;

// Opens cuDNN 9 once (the dynamic loader's search: LD_LIBRARY_PATH, the
// cache, the system's directories); empty where it is open (or linked), else
// why not. cuDNN opens its own sub-libraries from its directory.
inline const std::string& load_cudnn() {
    static const std::string why = [] {
#if defined(NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING) && !defined(SNUG_CUDA_EMULATED)
        std::string errors;
        for (const char* name : {"libcudnn.so.9", "libcudnn.so"}) {
            if (void* h = dlopen(name, RTLD_NOW | RTLD_GLOBAL)) {
                fe::cudnn_dlhandle = h;
                return std::string();
            }
            const char* e = dlerror();
            errors += std::string(errors.empty() ? "" : "; ") + (e ? e : name);
        }
        return "cuDNN 9 could not be loaded (" + errors + ")";
#else
        return std::string();
#endif
    }();
    return why;
}

class CudnnAttention final : public FusedAttention {
public:
    CudnnAttention() = default;
    CudnnAttention(const CudnnAttention&) = delete;
    CudnnAttention& operator=(const CudnnAttention&) = delete;
    // The handle may outlive the CUDA context at exit: its release is not checked.
    ~CudnnAttention() override {
        graphs_.clear();
        if (handle_ != nullptr) (void)fe::detail::destroy_handle(handle_);
    }

    std::string refusal(const FusedAttentionShape& shape) override {
        std::lock_guard lock(mutex_);
        if (std::string why = built(shape, AttentionPass::forward).refusal; !why.empty()) return why;
        return built(shape, AttentionPass::backward).refusal;
    }

    std::size_t workspace_bytes(const FusedAttentionShape& shape, AttentionPass pass) override {
        std::lock_guard lock(mutex_);
        const Built& b = built(shape, pass);
        if (!b.refusal.empty()) throw Error("cuDNN SDPA " + describe(shape) + ": " + b.refusal);
        return b.workspace;
    }

    std::string describe() const override {
        const std::string frontend = "(frontend " + std::to_string(CUDNN_FRONTEND_MAJOR_VERSION) + "." +
                                     std::to_string(CUDNN_FRONTEND_MINOR_VERSION) + "." +
                                     std::to_string(CUDNN_FRONTEND_PATCH_VERSION) + ")";
        if (const std::string& why = load_cudnn(); !why.empty())
            return std::string("cuDNN fused SDPA ") + frontend + ", not loadable: " + why;
        try {
            const std::size_t v = fe::detail::get_backend_version();
            return "cuDNN " + std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
                   std::to_string(v % 100) + " fused SDPA " + frontend;
        } catch (const std::exception& e) {  // the library could not be loaded
            return std::string("cuDNN fused SDPA ") + frontend + ", not loadable: " + e.what();
        }
    }

    void forward(cudaStream_t stream, const FusedAttentionShape& shape, void* out, float* lse, const void* qkv,
                 void* workspace) override {
        const int C = shape.C;
        std::unordered_map<std::int64_t, void*> pack = {
            {q_uid, const_cast<void*>(qkv)},
            {k_uid, offset(qkv, shape, C)},
            {v_uid, offset(qkv, shape, 2 * C)},
            {o_uid, out},
            {stats_uid, lse}};
        execute(stream, shape, AttentionPass::forward, pack, workspace);
    }

    void backward(cudaStream_t stream, const FusedAttentionShape& shape, void* dqkv, const void* dout,
                  const void* qkv, const void* out, const float* lse, void* workspace) override {
        const int C = shape.C;
        std::unordered_map<std::int64_t, void*> pack = {
            {q_uid, const_cast<void*>(qkv)},
            {k_uid, offset(qkv, shape, C)},
            {v_uid, offset(qkv, shape, 2 * C)},
            {o_uid, const_cast<void*>(out)},
            {do_uid, const_cast<void*>(dout)},
            {stats_uid, const_cast<float*>(lse)},
            {dq_uid, dqkv},
            {dk_uid, offset(dqkv, shape, C)},
            {dv_uid, offset(dqkv, shape, 2 * C)}};
        execute(stream, shape, AttentionPass::backward, pack, workspace);
    }

private:
    // The graphs' tensors, by uid.
    enum Uid : std::int64_t { q_uid = 1, k_uid, v_uid, o_uid, stats_uid, do_uid, dq_uid, dk_uid, dv_uid };

    struct Built {
        std::shared_ptr<fe::graph::Graph> graph;
        std::string refusal;  // empty: usable
        std::size_t workspace = 0;
    };

    static std::string describe(const FusedAttentionShape& s) {
        // Appended piece by piece: GCC 12 warns falsely (-Wrestrict) on "(" + std::string&& at -O3.
        std::string d(1, '(');
        d += dtype_name(s.dtype);
        d += ", B " + std::to_string(s.B) + ", T " + std::to_string(s.T) + ", C " + std::to_string(s.C) + ", NH " +
             std::to_string(s.NH) + ")";
        return d;
    }

    // Element `channel` of row 0 of a (B, T, 3C) tensor of 16-bit elements.
    static void* offset(const void* p, const FusedAttentionShape&, int channel) {
        return const_cast<char*>(static_cast<const char*>(p)) + std::size_t{2} * static_cast<std::size_t>(channel);
    }

    cudnnHandle_t handle() {
        if (handle_ == nullptr) {
            if (const std::string& why = load_cudnn(); !why.empty()) throw Error(why);
            const cudnnStatus_t s = fe::detail::create_handle(&handle_);
            if (s != CUDNN_STATUS_SUCCESS) {
                handle_ = nullptr;
                throw Error(std::string("cudnnCreate: ") + fe::detail::get_error_string(s));
            }
        }
        return handle_;
    }

    // The cached graph of a shape and pass, built on first use (callers hold mutex_).
    const Built& built(const FusedAttentionShape& shape, AttentionPass pass) {
        const auto key = std::make_tuple(static_cast<int>(shape.dtype), shape.B, shape.T, shape.C, shape.NH,
                                         static_cast<int>(pass));
        const auto it = graphs_.find(key);
        if (it != graphs_.end()) return it->second;
        return graphs_.emplace(key, build(shape, pass)).first->second;
    }

    Built build(const FusedAttentionShape& s, AttentionPass pass) {
        Built b;
        if (s.dtype != DType::bf16 && s.dtype != DType::f16) {
            b.refusal = "cuDNN's SDPA takes bf16 or fp16 activations, not " + std::string(dtype_name(s.dtype));
            return b;
        }
        if (s.NH <= 0 || s.C % s.NH != 0 || s.B <= 0 || s.T <= 0) {
            b.refusal = "no SDPA for shape " + describe(s);
            return b;
        }
        const std::int64_t B = s.B, T = s.T, NH = s.NH, hs = s.C / s.NH, C = s.C;
        // (B, NH, T, hs) views: qkv rows of 3C (llm.c's strides), out and dout rows of C.
        const std::vector<std::int64_t> dim = {B, NH, T, hs};
        const std::vector<std::int64_t> qkv_stride = {T * 3 * C, hs, 3 * C, 1};
        const std::vector<std::int64_t> row_stride = {T * C, hs, C, 1};
        const std::vector<std::int64_t> stats_dim = {B, NH, T, 1}, stats_stride = {NH * T, T, 1, 1};
        const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
        auto g = std::make_shared<fe::graph::Graph>();
        g->set_io_data_type(s.dtype == DType::bf16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF)
            .set_intermediate_data_type(fe::DataType_t::FLOAT)
            .set_compute_data_type(fe::DataType_t::FLOAT);
        const auto tensor = [&](const char* name, std::int64_t uid, const std::vector<std::int64_t>& stride) {
            return g->tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dim).set_stride(stride));
        };
        auto q = tensor("Q", q_uid, qkv_stride), k = tensor("K", k_uid, qkv_stride), v = tensor("V", v_uid, qkv_stride);
        if (pass == AttentionPass::forward) {
            auto [o, stats] = g->sdpa(q, k, v,
                                      fe::graph::SDPA_attributes()
                                          .set_name("snug_attention")
                                          .set_generate_stats(true)
                                          .set_causal_mask(true)
                                          .set_attn_scale(scale));
            o->set_output(true).set_uid(o_uid).set_dim(dim).set_stride(row_stride);
            stats->set_output(true).set_uid(stats_uid).set_data_type(fe::DataType_t::FLOAT).set_dim(stats_dim)
                .set_stride(stats_stride);
        } else {
            auto o = tensor("O", o_uid, row_stride), dO = tensor("dO", do_uid, row_stride);
            auto stats = g->tensor(fe::graph::Tensor_attributes()
                                       .set_name("Stats")
                                       .set_uid(stats_uid)
                                       .set_dim(stats_dim)
                                       .set_stride(stats_stride)
                                       .set_data_type(fe::DataType_t::FLOAT));
            auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dO, stats,
                                                 fe::graph::SDPA_backward_attributes()
                                                     .set_name("snug_attention_backward")
                                                     .set_causal_mask(true)
                                                     .set_attn_scale(scale)
                                                     .set_deterministic_algorithm(true));
            dq->set_output(true).set_uid(dq_uid).set_dim(dim).set_stride(qkv_stride);
            dk->set_output(true).set_uid(dk_uid).set_dim(dim).set_stride(qkv_stride);
            dv->set_output(true).set_uid(dv_uid).set_dim(dim).set_stride(qkv_stride);
        }
        cudnnHandle_t h = nullptr;
        try {
            h = handle();
        } catch (const std::exception& e) {  // cuDNN (loaded at first use) is missing, or makes no handle
            b.refusal = e.what();
            return b;
        }
        const auto step = [&](const fe::error_t& e) {
            if (b.refusal.empty() && !e.is_good()) b.refusal = e.err_msg;
            return b.refusal.empty();
        };
        if (!step(g->validate()) || !step(g->build_operation_graph(h)) ||
            !step(g->create_execution_plans({fe::HeurMode_t::A})) || !step(g->check_support(h)) ||
            !step(g->build_plans(h)))
            return b;
        std::int64_t workspace = 0;
        if (!step(g->get_workspace_size(workspace))) return b;
        b.graph = std::move(g);
        b.workspace = static_cast<std::size_t>(workspace);
        return b;
    }

    void execute(cudaStream_t stream, const FusedAttentionShape& shape, AttentionPass pass,
                 std::unordered_map<std::int64_t, void*>& pack, void* workspace) {
        std::lock_guard lock(mutex_);
        const char* what = pass == AttentionPass::forward ? "forward" : "backward";
        const Built& b = built(shape, pass);
        if (!b.refusal.empty())
            throw Error("cuDNN SDPA " + std::string(what) + " " + describe(shape) + ": " + b.refusal);
        const cudnnStatus_t s = fe::detail::set_stream(handle(), stream);
        if (s != CUDNN_STATUS_SUCCESS)
            throw Error(std::string("cudnnSetStream: ") + fe::detail::get_error_string(s));
        fe::error_t e;
        observed(stream, [&] { e = b.graph->execute(handle(), pack, workspace); });
        if (!e.is_good())
            throw Error("cuDNN SDPA " + std::string(what) + " " + describe(shape) + ": " + e.err_msg);
        check(cudaGetLastError());
    }

    std::mutex mutex_;
    cudnnHandle_t handle_ = nullptr;
    std::map<std::tuple<int, int, int, int, int, int>, Built> graphs_;
};

// The process's cuDNN engine. Never destroyed: at exit the CUDA context may
// be gone before a static's destructor would release cuDNN's plans.
inline CudnnAttention& cudnn_attention() {
    static CudnnAttention* engine = new CudnnAttention;
    return *engine;
}

// Registers cuDNN's engine as this program's fused attention
// (registered_fused_attention): one static object of this type in one
// translation unit the host compiler builds.
struct CudnnRegistration {
    CudnnRegistration() { registered_fused_attention() = &cudnn_attention(); }
};

}  // namespace snug::cuda
