// expect: checkpoint::Selective needs a model whose blocks recompute selectively
// A model that says its blocks cannot recompute selectively is refused
// checkpoint::Selective when the step is compiled, not at its first update.
#include "snug/nn/gpt.hpp"
#include "snug/train/train_step.hpp"

struct NoSelectiveGPT : snug::GPT<float, snug::Host> {
    using GPT::GPT;
    static constexpr bool supports_selective() { return false; }
};

using Step = snug::TrainStep<NoSelectiveGPT, snug::precision::Fp32, snug::accumulate::None, snug::checkpoint::Selective>;

int main() { return sizeof(Step) > 0 ? 0 : 1; }
