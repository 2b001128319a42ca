// Test support for the CUDA-against-host model tests (GPT, Llama, any
// TrainableModel): one training pass from fp32 weights and host token ids —
// the loss and every parameter gradient, copied to the host — and the
// comparison of a device pass with the host's. Only for translation units
// that may use the CUDA backend (real or emulated).
//
// Tolerances: fp32 (TF32 off) loss within 1e-5 relative, each tensor's
// gradient within 1e-4 of its largest host value; 16-bit: loss within 1e-2
// relative, whole-gradient cosine similarity > 0.99 (the backends round the
// same 16-bit values in different orders).
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

#include "snug/core/buffer.hpp"
#include "snug/nn/parameters.hpp"
#include "snug/snug.hpp"
#include "support/cuda_run.hpp"
#include "support/host_run.hpp"

namespace snug::test {

struct PassResult {
    float loss;
    std::vector<float> grads;
};

// Model (device_type Host or Cuda) built from `config`, loaded with `weights`,
// every block recomputing as `mode`: forward with targets and backward over
// tokens (B, T), dloss = 1 / (B T). Checks that no activation is left.
template <class Model, class Config>
PassResult training_pass(const Config& config, const std::vector<float>& weights,
                         const std::vector<std::int32_t>& tokens,   // (B, T)
                         const std::vector<std::int32_t>& targets,  // (B, T)
                         int B, int T, Recompute mode = Recompute::none) {
    using D = typename Model::device_type;
    using Run = std::conditional_t<std::is_same_v<D, Host>, HostRun, CudaRun>;
    Run run;
    Model model(config, run.tracker);
    model.load_weights(run.ctx.device, weights);
    model.zero_grad(run.ctx.device);
    const std::vector<Recompute> plan(static_cast<std::size_t>(model.num_blocks()), mode);
    model.set_recompute(plan);
    Buffer<std::int32_t, D> tok(run.tracker, MemoryCategory::temporaries, tokens.size(), "tokens");
    Buffer<std::int32_t, D> tgt(run.tracker, MemoryCategory::temporaries, targets.size(), "targets");
    upload(run.ctx.device, tok.data(), tokens.data(), static_cast<std::int64_t>(tokens.size()));
    upload(run.ctx.device, tgt.data(), targets.data(), static_cast<std::int64_t>(targets.size()));
    const float loss = model.forward(run.ctx, tok.data(), tgt.data(), B, T, 1.0f / float(B * T));
    model.backward(run.ctx, tok.data());
    std::vector<float> grads(static_cast<std::size_t>(model.num_parameters()));
    download(run.ctx.device, grads.data(), model.gradients(), model.num_parameters());
    CHECK(run.tracker.current(MemoryCategory::activations) == 0);
    return {loss, grads};
}

// A device pass against the host's, with the tolerances above; Act is the
// model's activation type.
template <class Act>
void check_pass_close(const PassResult& device, const PassResult& host, std::span<const ParameterTensor> tensors) {
    if constexpr (std::is_same_v<Act, float>) {
        CHECK(std::abs(device.loss - host.loss) / host.loss < 1e-5);
        for (const ParameterTensor& t : tensors) {
            double max_abs = 0, max_ref = 0;
            for (std::int64_t i = t.offset; i < t.offset + t.count(); ++i) {
                const auto k = static_cast<std::size_t>(i);
                max_abs = std::max(max_abs, double(std::abs(device.grads[k] - host.grads[k])));
                max_ref = std::max(max_ref, double(std::abs(host.grads[k])));
            }
            INFO(t.name << ": max abs " << max_abs << " of max " << max_ref);
            CHECK(max_ref > 0.0);
            CHECK(max_abs <= 1e-4 * max_ref);
        }
    } else {
        CHECK(std::abs(device.loss - host.loss) / host.loss < 1e-2);
        double dot = 0, nh = 0, nd = 0;
        for (std::size_t i = 0; i < host.grads.size(); ++i) {
            dot += double(host.grads[i]) * device.grads[i];
            nh += double(host.grads[i]) * host.grads[i];
            nd += double(device.grads[i]) * device.grads[i];
        }
        CHECK(dot / std::sqrt(nh * nd) > 0.99);
    }
}

}  // namespace snug::test
