// The one translation unit that instantiates train_gpt's and vram_ladder's
// run loops (snug/train/engine_extern.hpp says why, and lists them). Built by
// the host compiler for the host-only programs and the emulated one, and by
// nvcc (gpt_engine.cu) where the programs run on snug::Cuda.
#define SNUG_ENGINE_INSTANTIATE
#include "snug/train/engine_extern.hpp"
