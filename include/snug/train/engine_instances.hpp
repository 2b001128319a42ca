// The GPT engine's run loops, instantiated: include this header in exactly
// one translation unit of a program whose other files include
// engine_extern.hpp (which says why).
#pragma once

#include "snug/train/engine_extern.hpp"

namespace snug {

template RunResult run_training<Host>(const TrainOptions&, const TrainData&, const ModelSource&, const DeviceInfo&,
                                      Report&, const data::Tokenizer*, dist::Ranks&, dist::Communicator<Host>*);
template int run_evaluation<Host>(const TrainOptions&, const TrainData&, const ModelSource&, Report&,
                                  const data::Tokenizer*);
// The memory planner's measured runs on snug::Meter, one per precision
// (planner.hpp: --plan, --checkpoint auto, the ladder's predictions).
template MemoryPlan predict_training_memory<GPT<float, Meter>, precision::Fp32, GPTConfig>(const GPTConfig&,
                                                                                           const RunShape&);
template MemoryPlan predict_training_memory<GPT<bfloat16, Meter>, precision::Bf16, GPTConfig>(const GPTConfig&,
                                                                                              const RunShape&);
template MemoryPlan predict_training_memory<GPT<half, Meter>, precision::Fp16<DynamicLossScaler>, GPTConfig>(
    const GPTConfig&, const RunShape&);
template std::size_t metered_activation_peak<GPT<float, Meter>, GPTConfig>(const GPTConfig&, int, int,
                                                                           std::span<const Recompute>);
template std::size_t metered_activation_peak<GPT<bfloat16, Meter>, GPTConfig>(const GPTConfig&, int, int,
                                                                              std::span<const Recompute>);
template std::size_t metered_activation_peak<GPT<half, Meter>, GPTConfig>(const GPTConfig&, int, int,
                                                                          std::span<const Recompute>);
// The ladder's rungs (ladder.hpp), which train through run_training.
template std::vector<LadderRung> run_ladder<Host>(const TrainOptions&, const LadderOptions&, const DeviceInfo&,
                                                  const PlanTarget&, std::optional<std::size_t>, Report&);
#if defined(SNUG_CUDA_BACKEND)
template RunResult run_training<Cuda>(const TrainOptions&, const TrainData&, const ModelSource&, const DeviceInfo&,
                                      Report&, const data::Tokenizer*, dist::Ranks&, dist::Communicator<Cuda>*);
template int run_evaluation<Cuda>(const TrainOptions&, const TrainData&, const ModelSource&, Report&,
                                  const data::Tokenizer*);
template std::vector<LadderRung> run_ladder<Cuda>(const TrainOptions&, const LadderOptions&, const DeviceInfo&,
                                                  const PlanTarget&, std::optional<std::size_t>, Report&);
#endif

}  // namespace snug
