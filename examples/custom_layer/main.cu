// main.cpp built by nvcc: the same program, which also runs on snug::Cuda
// (--device cuda or auto), the block's CUDA kernels and snug's.
#include "main.cpp"
