// What the modules of nn/ (Linear, RMSNorm, SwiGLUMLP, CausalSelfAttention)
// share. A module is a piece of a block, not a Layer of its own:
//   - its constructor declares its tensors into a ParameterRegistry under a
//     name prefix and keeps their offsets;
//   - bind(ParameterBinding) points it at the model's buffers once the model
//     has allocated them (parameters in Act, gradients in fp32);
//   - forward/backward take raw (N, features) pointers; the block owns the
//     activations passed in and out and the arena marks. A module that keeps
//     something of its own for backward (normalisation statistics, attention
//     probabilities) pushes it onto the arena the block hands it; the block
//     releases it with the rest of its activations.
#pragma once

namespace snug {

// The two buffers a registry's offsets point into.
template <class Act>
struct ParameterBinding {
    Act* params;   // working weights, the registry's layout
    float* grads;  // their fp32 gradients, the same layout
};

}  // namespace snug
