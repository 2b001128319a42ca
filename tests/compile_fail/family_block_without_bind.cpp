// expect: CausalLM block: needs `void bind\(snug::ParameterBinding<Act>\)`
// A user's block that is a Layer but cannot be pointed at the model's buffers:
// CausalLM's first error names the missing member.
#include "snug/nn/causal_lm.hpp"
#include "snug/nn/rmsnorm.hpp"

struct Shape1 {
    int channels = 8;
};

template <class Act, snug::DeviceTag D>
struct NoBind {
    using value_type = Act;
    using device_type = D;
    NoBind(snug::ParameterRegistry&, const std::string&, const Shape1&) {}
    snug::Shape output_shape(const snug::Shape& in) const { return in; }
    void forward(snug::Context<D>&, snug::TensorView<const Act, D>, snug::TensorView<Act, D>) {}
    void backward(snug::Context<D>&, snug::TensorView<const Act, D>, snug::TensorView<const Act, D>,
                  snug::TensorView<Act, D>) {}
};

struct Family {
    using BlockShape = Shape1;
    template <class Act, snug::DeviceTag D>
    using Block = NoBind<Act, D>;
    template <class Act, snug::DeviceTag D>
    using FinalNorm = snug::RMSNorm<Act, D>;
    static int channels(const BlockShape& s) { return s.channels; }
    static constexpr bool learned_positions = false;
    static constexpr bool tied_head = false;
};

int main() {
    snug::MemoryTracker tracker;
    snug::CausalLM<Family, float, snug::Host> model({}, tracker);
    (void)model;
}
