// expect: the model's activation type must be the precision policy's compute type
// A bf16 policy over an fp32 model: the types must agree.
#include "snug/nn/gpt.hpp"
#include "snug/train/train_step.hpp"

using Step = snug::TrainStep<snug::GPT<float, snug::Host>, snug::precision::Bf16, snug::accumulate::None,
                             snug::checkpoint::None>;

int main() { return sizeof(Step) > 0 ? 0 : 1; }
