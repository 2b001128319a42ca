// gpt_engine.cpp built by nvcc: the run loops on snug::Cuda and snug::Host.
#include "gpt_engine.cpp"
