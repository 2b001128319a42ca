// The GPT engine's run loops declared `extern template`: a program that
// includes this header before the engine's other headers calls them without
// instantiating them, and links one translation unit that defines
// SNUG_ENGINE_INSTANTIATE before including it, where the same list is
// instantiated (examples/gpt_engine.cpp). One list serves both, so the two
// sides cannot drift apart.
//
// Why: run.hpp's run_training<Dev> and run_evaluation<Dev>, the ladder's
// rungs and the planner's Meter runs instantiate the whole engine (the GPT
// and its TrainStep in three precisions, and on snug::Cuda every kernel they
// launch): minutes of nvcc per program. train_gpt and vram_ladder share one
// such object (examples/gpt_engine.cpp; 174 s of nvcc), and each main then
// compiles in about 36 s instead of 203. A trainer of your own needs neither
// header: without them the program instantiates what it calls, as with any
// header-only library. With them, build both translation units with the same
// backend and compile definitions, or the two sides disagree.
#pragma once

#include "snug/train/ladder.hpp"
#include "snug/train/planner.hpp"
#include "snug/train/run.hpp"

// `extern template` here, `template` in the translation unit that instantiates.
#if defined(SNUG_ENGINE_INSTANTIATE)
#define SNUG_ENGINE_EXTERN
#else
#define SNUG_ENGINE_EXTERN extern
#endif

namespace snug {

SNUG_ENGINE_EXTERN template RunResult run_training<Host>(const TrainOptions&, const TrainData&, const ModelSource&,
                                             const DeviceInfo&, Report&, const data::Tokenizer*, dist::Ranks&,
                                             dist::Communicator<Host>*);
SNUG_ENGINE_EXTERN template int run_evaluation<Host>(const TrainOptions&, const TrainData&, const ModelSource&, Report&,
                                         const data::Tokenizer*);
// The memory planner's measured runs on snug::Meter, one per precision
// (planner.hpp: --plan, --checkpoint auto, the ladder's predictions).
SNUG_ENGINE_EXTERN template MemoryPlan predict_training_memory<GPT<float, Meter>, precision::Fp32, GPTConfig>(const GPTConfig&,
                                                                                                  const RunShape&);
SNUG_ENGINE_EXTERN template MemoryPlan predict_training_memory<GPT<bfloat16, Meter>, precision::Bf16, GPTConfig>(const GPTConfig&,
                                                                                                     const RunShape&);
SNUG_ENGINE_EXTERN template MemoryPlan predict_training_memory<GPT<half, Meter>, precision::Fp16<DynamicLossScaler>, GPTConfig>(
    const GPTConfig&, const RunShape&);
SNUG_ENGINE_EXTERN template std::size_t metered_activation_peak<GPT<float, Meter>, GPTConfig>(const GPTConfig&, int, int,
                                                                                  std::span<const Recompute>);
SNUG_ENGINE_EXTERN template std::size_t metered_activation_peak<GPT<bfloat16, Meter>, GPTConfig>(const GPTConfig&, int, int,
                                                                                     std::span<const Recompute>);
SNUG_ENGINE_EXTERN template std::size_t metered_activation_peak<GPT<half, Meter>, GPTConfig>(const GPTConfig&, int, int,
                                                                                 std::span<const Recompute>);
// The ladder's rungs (ladder.hpp), which train through run_training.
SNUG_ENGINE_EXTERN template std::vector<LadderRung> run_ladder<Host>(const TrainOptions&, const LadderOptions&, const DeviceInfo&,
                                                         const PlanTarget&, std::optional<std::size_t>, Report&);
#if defined(SNUG_CUDA_BACKEND)
SNUG_ENGINE_EXTERN template RunResult run_training<Cuda>(const TrainOptions&, const TrainData&, const ModelSource&,
                                             const DeviceInfo&, Report&, const data::Tokenizer*, dist::Ranks&,
                                             dist::Communicator<Cuda>*);
SNUG_ENGINE_EXTERN template int run_evaluation<Cuda>(const TrainOptions&, const TrainData&, const ModelSource&, Report&,
                                         const data::Tokenizer*);
SNUG_ENGINE_EXTERN template std::vector<LadderRung> run_ladder<Cuda>(const TrainOptions&, const LadderOptions&, const DeviceInfo&,
                                                         const PlanTarget&, std::optional<std::size_t>, Report&);
#endif

}  // namespace snug

#undef SNUG_ENGINE_EXTERN
