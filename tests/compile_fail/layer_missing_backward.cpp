// expect: LayerBackward
// A user layer without backward cannot be checkpointed; the message names the missing part.
#include "snug/nn/checkpointed.hpp"

struct ForwardOnly {
    using value_type = float;
    using device_type = snug::Host;
    snug::Shape output_shape(const snug::Shape& in) const { return in; }
    void forward(snug::Context<snug::Host>&, snug::TensorView<const float>, snug::TensorView<float>) {}
};

int main() {
    snug::Checkpointed<ForwardOnly> layer(ForwardOnly{});
    (void)layer;
}
