// train_gpt: the main job. Trains a GPT-2-style model with every knob that
// decides memory and speed on the command line, logs each update (one JSON
// line per step, a progress display, a summary table) and samples text at the
// end. With no arguments it trains a small model on the built-in synthetic
// corpus (20-60 s on two CPU cores) and prints its validation loss next
// to the corpus's exact entropy floor.
//
// Also: --resume a saved training state (--out DIR keeps DIR/state.snug,
// saved every --save-every updates, at the end, and on Ctrl-C);
// --init-from an llm.c model file or a Hugging Face GPT-2 directory;
// --eval-only; --save-model (llm.c) and --export-hf at the end; --plan (what
// fits a budget, from the memory planner, before anything is allocated);
// --ladder (the VRAM ladder, examples/vram_ladder).
//
// Built by g++ from this file it runs on the host backend; built by nvcc
// (main.cu includes this file) it also runs on snug::Cuda, and --device auto
// picks the GPU when one exists.
//
// This file is only a main: snug::train_main (snug/train/train_main.hpp)
// is the command line and calls the engine in include/snug/train/ (run.hpp,
// run_plan.hpp, ladder.hpp). A trainer of your own can start from a copy of
// it, or call train_main<YourFamily> (examples/custom_layer). What the engine
// reports is printed by the TextReport that report.cpp makes: a file of its
// own, always compiled by the host compiler, because the text is formatted
// with fmt and nvcc cannot compile fmt.
//
// Data parallel: `mpirun -np N train_gpt ...` trains on N ranks (built with
// MPI, Debian's libopenmpi-dev): each rank trains on its --batch sequences of
// every micro-step, rank 0 prints and writes the files (README: launching).
// On GPUs each rank takes its machine's GPU number local-rank and the
// gradients are summed by NCCL; elsewhere (host, emulated GPU) through MPI.
//
// Exit codes: 0 done, 1 runtime error (file, numerics), 2 bad command line or
// configuration (also --device cuda without a GPU), 3 out of the memory
// budget (or of host memory), 130 stopped by Ctrl-C (after saving the state).
#include <memory>

#include "snug/train/engine_extern.hpp"  // the run loops, instantiated once (examples/gpt_engine.cpp); first
#include "snug/train/train_main.hpp"

// The report that prints everything (report.cpp).
std::unique_ptr<snug::Report> make_report();

int main(int argc, char** argv) {
    return snug::train_main(argc, argv,
                            {"train_gpt",
                             "train a GPT-2-style model (or a Llama: --arch llama) and measure what each "
                             "memory/speed choice costs.\nWith no arguments: a small model (2 layers, 4 heads, 128 "
                             "channels; B 32, T 32, 1000 updates, fp32) on the\nbuilt-in synthetic corpus.\n",
                             make_report});
}
