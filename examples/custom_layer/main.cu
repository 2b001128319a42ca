// custom_layer_cuda: main.cpp built by nvcc. Under nvcc the program's
// device tag is snug::Cuda, so the same TinyLM runs GatedResidual's CUDA
// kernels and snug's CUDA kernels and cuBLASLt GEMMs. Exits 77 without a GPU.
#include "main.cpp"
