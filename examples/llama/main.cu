// llama_cuda: main.cpp built by nvcc, on snug::Cuda. Exits 77 without a GPU
// (--plan needs none).
#include "main.cpp"
