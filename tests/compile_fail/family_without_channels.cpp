// expect: CausalLM family: needs `static int channels\(const BlockShape&\)`
// A family that does not say its blocks' width: CausalLM's first error names
// the missing member.
#include "snug/nn/causal_lm.hpp"
#include "snug/nn/llama_block.hpp"
#include "snug/nn/rmsnorm.hpp"

struct Family {
    using BlockShape = snug::LlamaBlockShape;
    template <class Act, snug::DeviceTag D>
    using Block = snug::LlamaBlock<Act, D>;
    template <class Act, snug::DeviceTag D>
    using FinalNorm = snug::RMSNorm<Act, D>;
    static constexpr bool learned_positions = false;
    static constexpr bool tied_head = false;
};

int main() {
    snug::MemoryTracker tracker;
    snug::CausalLM<Family, float, snug::Host> model({}, tracker);
    (void)model;
}
