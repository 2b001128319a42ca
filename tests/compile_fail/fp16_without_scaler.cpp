// expect: Scaler must be a loss scaler
// fp16 training without loss scaling underflows: Fp16 needs a LossScaler.
#include "snug/precision/policies.hpp"

int main() {
    snug::precision::Fp16<int> precision;
    (void)precision;
}
