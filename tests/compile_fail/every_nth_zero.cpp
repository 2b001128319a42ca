// expect: K must be at least 1
#include "snug/checkpoint/policies.hpp"

int main() {
    snug::checkpoint::EveryNth<0> policy;
    (void)policy;
}
