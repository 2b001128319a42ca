// train_gpt built by nvcc: the same program (main.cpp) with the CUDA backend
// compiled in, so --device auto trains on the GPU when one exists and on the
// host otherwise.
#include "main.cpp"
