// The kernels of snug::Meter (snug/meter/device.hpp): every op the host and
// CUDA backends have, doing nothing. Layers call them unqualified with the
// device tag first, so argument-dependent lookup finds these for a Meter tag
// exactly as it finds the host loops or CUDA launchers for theirs. A user's
// own kernels add a Meter overload the same way (examples/custom_layer).
#pragma once

#include "snug/meter/device.hpp"

namespace snug::meter {

// Nothing to compute and nothing to move: the arguments are what the other
// backends take, unread.
template <class... Args> void encoder_forward(const Device&, Args&&...) {}
template <class... Args> void encoder_backward(const Device&, Args&&...) {}
template <class... Args> void layernorm_forward(const Device&, Args&&...) {}
template <class... Args> void layernorm_backward(const Device&, Args&&...) {}
template <class... Args> void linear_forward(const Device&, Args&&...) {}
template <class... Args> void linear_backward(const Device&, Args&&...) {}
template <class... Args> void attention_forward(const Device&, Args&&...) {}
template <class... Args> void attention_backward(const Device&, Args&&...) {}
template <class... Args> void gelu_forward(const Device&, Args&&...) {}
template <class... Args> void gelu_backward(const Device&, Args&&...) {}
template <class... Args> void residual_forward(const Device&, Args&&...) {}
template <class... Args> void add_inplace(const Device&, Args&&...) {}
template <class... Args> void scale_inplace(const Device&, Args&&...) {}
template <class... Args> void cast(const Device&, Args&&...) {}
template <class... Args> void softmax_cross_entropy(const Device&, Args&&...) {}
template <class... Args> void unscale_and_check(const Device&, Args&&...) {}
template <class... Args> void sum_squares(const Device&, Args&&...) {}
template <class... Args> void adamw_update(const Device&, Args&&...) {}
// Transfers: a download leaves the host side as it was.
template <class... Args> void upload(const Device&, Args&&...) {}
template <class... Args> void download(const Device&, Args&&...) {}
template <class... Args> void copy(const Device&, Args&&...) {}
template <class... Args> void fill_zero(const Device&, Args&&...) {}

}  // namespace snug::meter
