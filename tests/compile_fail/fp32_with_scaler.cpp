// expect: Fp32.* is not a template
// Fp32 takes no loss scaler: its gradients do not underflow.
#include "snug/precision/policies.hpp"

int main() {
    snug::precision::Fp32<snug::DynamicLossScaler> precision;
    (void)precision;
}
