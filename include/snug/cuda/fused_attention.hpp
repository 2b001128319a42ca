// Fused attention on the CUDA backend (ops/fused_attention.hpp): the engine
// interface a device tag holds (Device::fused), the one a program registers
// (registered_fused_attention: cuDNN's, snug/cuda/cudnn_attention.hpp, made in
// a translation unit the host compiler builds, as examples/cudnn_engine.cpp
// does), and the calls layers make with the device tag first:
//   fused_attention_refusal<T>(dev, B, T, C, NH)       empty when this call runs on the engine
//   fused_attention_workspace<T>(dev, pass, B, T, C, NH) its workspace, in bytes
//   fused_attention_forward / fused_attention_backward
// Nothing here includes cuDNN: kernels' translation units (nvcc's) need only
// this interface.
#pragma once

#include "snug/cuda/runtime.hpp"

#include <cstddef>
#include <string>

#include "snug/core/error.hpp"
#include "snug/core/half.hpp"
#include "snug/cuda/device.hpp"
#include "snug/ops/fused_attention.hpp"

namespace snug::cuda {

// What runs a fused attention call. Pointers are device memory, 16-byte
// aligned; `workspace` holds workspace_bytes(shape, pass). Work is queued on
// `stream`; a failure throws snug::Error naming the call and the engine's reason.
class FusedAttention : public FusedAttentionPlanner {
public:
    virtual void forward(cudaStream_t stream, const FusedAttentionShape& shape,
                         void* out,         // (B, T, C)
                         float* lse,        // (B, NH, T)
                         const void* qkv,   // (B, T, 3C)
                         void* workspace) = 0;
    virtual void backward(cudaStream_t stream, const FusedAttentionShape& shape,
                          void* dqkv,         // (B, T, 3C) overwritten
                          const void* dout,   // (B, T, C)
                          const void* qkv,    // (B, T, 3C)
                          const void* out,    // (B, T, C)
                          const float* lse,   // (B, NH, T)
                          void* workspace) = 0;
};

// The engine this program registered (nullptr: none; the program was built
// without cuDNN). A process has one, made at first use on the current device.
inline FusedAttention*& registered_fused_attention() {
    static FusedAttention* engine = nullptr;
    return engine;
}

template <class T>
FusedAttentionShape fused_attention_shape(int B, int T_, int C, int NH) {
    return {dtype_of<T>, B, T_, C, NH};
}

// Empty when dev has an engine and it takes the case, else why not.
template <FusedAttentionInput T>
std::string fused_attention_refusal(const Device& dev, int B, int T_, int C, int NH) {
    if (dev.fused == nullptr) return "this program has no fused attention engine (it was built without cuDNN)";
    return dev.fused->refusal(fused_attention_shape<T>(B, T_, C, NH));
}

// The engine, for reports.
inline std::string fused_attention_engine(const Device& dev) {
    return dev.fused != nullptr ? dev.fused->describe() : "none";
}

template <FusedAttentionInput T>
std::size_t fused_attention_workspace(const Device& dev, AttentionPass pass, int B, int T_, int C, int NH) {
    if (dev.fused == nullptr) throw Error("fused_attention_workspace: this device tag has no fused attention engine");
    return dev.fused->workspace_bytes(fused_attention_shape<T>(B, T_, C, NH), pass);
}

// Flash attention's forward (ops/flash_attention.hpp) on the engine, for a
// case it takes; workspace: fused_attention_workspace(forward) bytes.
template <FusedAttentionInput T>
void fused_attention_forward(const Device& dev, std::byte* workspace,
                             T* out,        // (B, T, C)
                             float* lse,    // (B, NH, T)
                             const T* qkv,  // (B, T, 3C)
                             int B, int T_, int C, int NH) {
    ops::check_flash_attention("fused_attention_forward", B, T_, C, NH);
    if (dev.fused == nullptr) throw Error("fused_attention_forward: this device tag has no fused attention engine");
    dev.fused->forward(dev.stream, fused_attention_shape<T>(B, T_, C, NH), out, lse, qkv, workspace);
}

// Flash attention's backward on the engine: dqkv overwritten; workspace:
// fused_attention_workspace(backward) bytes.
template <FusedAttentionInput T>
void fused_attention_backward(const Device& dev, std::byte* workspace,
                              T* dqkv,          // (B, T, 3C)
                              const T* dout,    // (B, T, C)
                              const T* qkv,     // (B, T, 3C)
                              const T* out,     // (B, T, C)
                              const float* lse, // (B, NH, T)
                              int B, int T_, int C, int NH) {
    ops::check_flash_attention("fused_attention_backward", B, T_, C, NH);
    if (dev.fused == nullptr) throw Error("fused_attention_backward: this device tag has no fused attention engine");
    dev.fused->backward(dev.stream, fused_attention_shape<T>(B, T_, C, NH), dqkv, dout, qkv, out, lse, workspace);
}

}  // namespace snug::cuda
