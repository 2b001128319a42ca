# The emulated backend's shared-memory checker (include/snug/cuda/emulated/
# shared_check.hpp: reads of shared memory no thread wrote, races between
# barriers) needs every load and store instrumented, which Clang does with
# -fsanitize-coverage=func,trace-loads,trace-stores.
#
# snug_enable_emulated_checks(target): the flags on `target`'s interface, so
# whatever links it is checked. snug's own build calls it for its programs
# when SNUG_EMULATED_CHECKS is on; snugConfig.cmake calls it on
# snug::cuda_emulated for a project that finds snug with SNUG_EMULATED_CHECKS
# on, so that project's own kernels are checked too.
function(snug_enable_emulated_checks target)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "SNUG_EMULATED_CHECKS needs Clang (its -fsanitize-coverage=trace-loads,trace-stores), "
                        "not ${CMAKE_CXX_COMPILER_ID}: configure with -DCMAKE_CXX_COMPILER=clang++-19, say")
  endif()
  set(flags -fsanitize-coverage=func,trace-loads,trace-stores)
  target_compile_options(${target} INTERFACE $<$<COMPILE_LANGUAGE:CXX>:${flags}>)
  target_link_options(${target} INTERFACE ${flags})
endfunction()
