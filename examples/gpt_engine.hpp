// The run loops of train_gpt and vram_ladder, compiled once per backend.
//
// run.hpp's run_training<Dev> and run_evaluation<Dev> instantiate the whole
// engine: the GPT and its TrainStep in three precisions, and on snug::Cuda
// every kernel they launch. Under nvcc that is minutes per program. This
// header declares those instantiations extern, so a command line that
// includes it compiles in a fraction of that; gpt_engine.cpp (gpt_engine.cu
// under nvcc) defines them once, in the object library snug_gpt_engine that
// both programs link (examples/CMakeLists.txt).
//
// A trainer of your own needs neither file: without this header the program
// instantiates what it calls, as with any header-only library. With it, link
// one translation unit that includes gpt_engine.cpp, built with the same
// backend and the same compile definitions as the program.
#pragma once

#include "snug/train/ladder.hpp"
#include "snug/train/planner.hpp"
#include "snug/train/run.hpp"

namespace snug {

extern template RunResult run_training<Host>(const TrainOptions&, const TrainData&, const ModelSource&,
                                             const DeviceInfo&, Report&, const data::Tokenizer*, dist::Ranks&,
                                             dist::Communicator<Host>*);
extern template int run_evaluation<Host>(const TrainOptions&, const TrainData&, const ModelSource&, Report&,
                                         const data::Tokenizer*);
// The memory planner's measured runs on snug::Meter, one per precision
// (planner.hpp: --plan, --checkpoint auto, the ladder's predictions).
extern template MemoryPlan predict_training_memory<GPT<float, Meter>, precision::Fp32, GPTConfig>(const GPTConfig&,
                                                                                                  const RunShape&);
extern template MemoryPlan predict_training_memory<GPT<bfloat16, Meter>, precision::Bf16, GPTConfig>(const GPTConfig&,
                                                                                                     const RunShape&);
extern template MemoryPlan predict_training_memory<GPT<half, Meter>, precision::Fp16<DynamicLossScaler>, GPTConfig>(
    const GPTConfig&, const RunShape&);
extern template std::size_t metered_activation_peak<GPT<float, Meter>, GPTConfig>(const GPTConfig&, int, int,
                                                                                  std::span<const Recompute>);
extern template std::size_t metered_activation_peak<GPT<bfloat16, Meter>, GPTConfig>(const GPTConfig&, int, int,
                                                                                     std::span<const Recompute>);
extern template std::size_t metered_activation_peak<GPT<half, Meter>, GPTConfig>(const GPTConfig&, int, int,
                                                                                 std::span<const Recompute>);
// The ladder's rungs (ladder.hpp), which train through run_training.
extern template std::vector<LadderRung> run_ladder<Host>(const TrainOptions&, const LadderOptions&, const DeviceInfo&,
                                                         const PlanTarget&, std::optional<std::size_t>, Report&);
#if defined(SNUG_CUDA_BACKEND)
extern template RunResult run_training<Cuda>(const TrainOptions&, const TrainData&, const ModelSource&,
                                             const DeviceInfo&, Report&, const data::Tokenizer*, dist::Ranks&,
                                             dist::Communicator<Cuda>*);
extern template int run_evaluation<Cuda>(const TrainOptions&, const TrainData&, const ModelSource&, Report&,
                                         const data::Tokenizer*);
extern template std::vector<LadderRung> run_ladder<Cuda>(const TrainOptions&, const LadderOptions&, const DeviceInfo&,
                                                         const PlanTarget&, std::optional<std::size_t>, Report&);
#endif

}  // namespace snug
