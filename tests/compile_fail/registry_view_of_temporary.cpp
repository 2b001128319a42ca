// expect: use of deleted function
// A view into a registry that is about to be destroyed is refused: the loop
// below would read freed memory (it did, once, in tests/parity).
#include "snug/nn/parameters.hpp"

int main() {
    int n = 0;
    for (const snug::ParameterTensor& t : snug::ParameterRegistry{}.tensors()) n += static_cast<int>(t.count());
    return n;
}
