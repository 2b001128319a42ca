// model_of<Config, Act, D>: the model a config builds — GPT<Act, D> for a
// GPTConfig (nn/gpt.hpp), CausalLM<Family, Act, D> for a
// CausalLMConfig<Family> (nn/causal_lm.hpp). Code written over a config (the
// planner's run-time precision, the training engine) finds its model here.
#pragma once

#include "snug/core/device.hpp"

namespace snug {

template <class Config, class Act, DeviceTag D>
struct ModelOf;  // specialised beside each model

template <class Config, class Act, DeviceTag D>
using model_of = typename ModelOf<Config, Act, D>::type;

}  // namespace snug
