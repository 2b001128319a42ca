// custom_layer: a model of a user's own block trained by snug's whole engine,
// the shape of program a downstream user copies. gated_residual.hpp holds the
// block (its math, its host and CUDA kernels) and its family; main() checks
// the block's backward against finite differences, then hands the command
// line to snug::train_main<TinyFamily>: every flag of train_gpt (precision,
// --accum, --checkpoint auto, --plan, --ladder, --out and --resume,
// --offload, mpirun), --layers and --channels for the shape. report.cpp
// prints. Built by nvcc (main.cu) it also runs on the GPU; built against
// snug::cuda_emulated (custom_layer_emulated), --device cuda runs the CUDA
// kernels on the CPU.
#include <cstdio>
#include <memory>

#include "gated_residual.hpp"
#include "snug/nn/gradient_check.hpp"
#include "snug/train/train_main.hpp"

// The report that prints everything (report.cpp).
std::unique_ptr<snug::Report> make_report();

int main(int argc, char** argv) {
    // The block's backward against finite differences (double, host) first:
    // fp32 math inside holds to ~1e-4 of each tensor's largest gradient.
    const snug::GradientCheck g = snug::check_gradients<tiny::TinyFamily>(tiny::GatedShape{8});
    if (!g.passes(1e-3)) {
        std::fprintf(stderr, "custom_layer: the gradient check failed:\n%s", g.summary().c_str());
        return 1;
    }
    return snug::train_main<tiny::TinyFamily>(
        argc, argv, {"custom_layer", "train a model of GatedResidual blocks (examples/custom_layer).\n", make_report});
}
