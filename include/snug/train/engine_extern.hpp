// The GPT engine's run loops declared `extern template`: a program that
// includes this header before the engine's other headers calls them without
// instantiating them, and links one translation unit that defines
// SNUG_ENGINE_INSTANTIATE before including it, where the same list is
// instantiated (examples/gpt_engine.cpp). One list serves both, so the two
// sides cannot drift apart.
//
// Why: run.hpp's run_training and run_evaluation, the ladder's rungs and the
// planner's Meter runs instantiate the whole engine (each family's model and
// its TrainStep in three precisions, and on snug::Cuda every kernel they
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

// Per device and family (GPT-2, Llama: train/arch.hpp).
SNUG_ENGINE_EXTERN template RunResult run_training<Host, GPTConfig>(const TrainOptions&, const TrainData&,
                                                                    const ModelSource&, const DeviceInfo&, Report&,
                                                                    const data::Tokenizer*, dist::Ranks&,
                                                                    dist::Communicator<Host>*);
SNUG_ENGINE_EXTERN template RunResult run_training<Host, LlamaConfig>(const TrainOptions&, const TrainData&,
                                                                      const ModelSourceOf<LlamaConfig>&,
                                                                      const DeviceInfo&, Report&,
                                                                      const data::Tokenizer*, dist::Ranks&,
                                                                      dist::Communicator<Host>*);
SNUG_ENGINE_EXTERN template int run_evaluation<Host, GPTConfig>(const TrainOptions&, const TrainData&,
                                                                const ModelSource&, Report&, const data::Tokenizer*);
SNUG_ENGINE_EXTERN template int run_evaluation<Host, LlamaConfig>(const TrainOptions&, const TrainData&,
                                                                  const ModelSourceOf<LlamaConfig>&, Report&,
                                                                  const data::Tokenizer*);
// The memory planner's measured runs on snug::Meter, one per family and
// precision (planner.hpp: --plan, --checkpoint auto, the ladder's predictions).
SNUG_ENGINE_EXTERN template MemoryPlan predict_memory<GPTConfig>(const PlanInput<GPTConfig>&);
SNUG_ENGINE_EXTERN template MemoryPlan predict_memory<LlamaConfig>(const PlanInput<LlamaConfig>&);
SNUG_ENGINE_EXTERN template std::size_t activation_peak<GPTConfig>(const GPTConfig&, PrecisionKind, int, int,
                                                                   std::span<const Recompute>);
SNUG_ENGINE_EXTERN template std::size_t activation_peak<LlamaConfig>(const LlamaConfig&, PrecisionKind, int, int,
                                                                     std::span<const Recompute>);
// The ladder's rungs (ladder.hpp), which train through run_training.
SNUG_ENGINE_EXTERN template std::vector<LadderRung> run_ladder<Host, GPTConfig>(
    const TrainOptions&, const LadderOptions&, const DeviceInfo&, const PlanTarget&, std::optional<std::size_t>,
    Report&);
SNUG_ENGINE_EXTERN template std::vector<LadderRung> run_ladder<Host, LlamaConfig>(
    const TrainOptions&, const LadderOptions&, const DeviceInfo&, const PlanTarget&, std::optional<std::size_t>,
    Report&);
#if defined(SNUG_CUDA_BACKEND)
SNUG_ENGINE_EXTERN template RunResult run_training<Cuda, GPTConfig>(const TrainOptions&, const TrainData&,
                                                                    const ModelSource&, const DeviceInfo&, Report&,
                                                                    const data::Tokenizer*, dist::Ranks&,
                                                                    dist::Communicator<Cuda>*);
SNUG_ENGINE_EXTERN template RunResult run_training<Cuda, LlamaConfig>(const TrainOptions&, const TrainData&,
                                                                      const ModelSourceOf<LlamaConfig>&,
                                                                      const DeviceInfo&, Report&,
                                                                      const data::Tokenizer*, dist::Ranks&,
                                                                      dist::Communicator<Cuda>*);
SNUG_ENGINE_EXTERN template int run_evaluation<Cuda, GPTConfig>(const TrainOptions&, const TrainData&,
                                                                const ModelSource&, Report&, const data::Tokenizer*);
SNUG_ENGINE_EXTERN template int run_evaluation<Cuda, LlamaConfig>(const TrainOptions&, const TrainData&,
                                                                  const ModelSourceOf<LlamaConfig>&, Report&,
                                                                  const data::Tokenizer*);
SNUG_ENGINE_EXTERN template std::vector<LadderRung> run_ladder<Cuda, GPTConfig>(
    const TrainOptions&, const LadderOptions&, const DeviceInfo&, const PlanTarget&, std::optional<std::size_t>,
    Report&);
SNUG_ENGINE_EXTERN template std::vector<LadderRung> run_ladder<Cuda, LlamaConfig>(
    const TrainOptions&, const LadderOptions&, const DeviceInfo&, const PlanTarget&, std::optional<std::size_t>,
    Report&);
#endif

}  // namespace snug

#undef SNUG_ENGINE_EXTERN
