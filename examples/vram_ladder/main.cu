// vram_ladder built by nvcc: the same program (main.cpp) with the CUDA backend
// compiled in, so --device auto runs the ladder on the GPU when one exists.
#include "main.cpp"
