// snug: the umbrella header. Everything a trainer composes: core types, the
// host backend, the GPT model, the optimizer, the three policies and
// TrainStep; under nvcc, or in the emulated CUDA backend (snug::cuda_emulated),
// also the CUDA backend. File formats (snug/io/) need
// nlohmann/json and are included on their own.
#pragma once

#include "snug/core/config.hpp"
#include "snug/core/device.hpp"
#include "snug/core/dtype.hpp"
#include "snug/core/error.hpp"
#include "snug/core/half.hpp"
#include "snug/core/memory.hpp"
#include "snug/core/rng.hpp"
#include "snug/core/tensor.hpp"
#include "snug/host/gemm.hpp"
#include "snug/meter/device.hpp"

#if defined(SNUG_CUDA_BACKEND)
#include "snug/cuda/blas.hpp"
#include "snug/cuda/check.hpp"
#include "snug/cuda/device.hpp"
#include "snug/cuda/memory.hpp"
#endif

#include "snug/nn/activation_peak.hpp"
#include "snug/nn/checkpointed.hpp"
#include "snug/nn/gpt.hpp"
#include "snug/nn/gradient_check.hpp"
#include "snug/nn/layer.hpp"
#include "snug/nn/layer_stack.hpp"
#include "snug/nn/llama.hpp"
#include "snug/nn/upload_weights.hpp"
#include "snug/optim/adamw.hpp"
#include "snug/optim/grad_norm.hpp"
#include "snug/precision/loss_scaler.hpp"
#include "snug/precision/policies.hpp"
#include "snug/accumulate/policies.hpp"
#include "snug/checkpoint/policies.hpp"
#include "snug/train/planner.hpp"
#include "snug/train/train_step.hpp"
