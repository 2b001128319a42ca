# The emulated backend's shared-memory checker (include/snug/cuda/emulated/
# shared_check.hpp: reads of shared memory no thread wrote, races between
# barriers) needs every access of a kernel instrumented:
#   - loads and stores: Clang's -fsanitize-coverage=func,trace-loads,trace-stores;
#   - copies (struct assignments, memcpy, memmove, memset), which that leaves
#     out: AddressSanitizer turns each into a call, and
#     -asan-memory-access-callback-prefix=snug_asan_ sends it to the hooks
#     shared_check.hpp defines (why there is no other way: that header's top).
#
# snug_enable_emulated_checks(target [BUILD_INTERFACE]): the flags on
# `target`'s interface, so whatever links it is checked; BUILD_INTERFACE keeps
# them out of the installed package's export. `target` must be one that only
# programs with the emulator link (snug::cuda_emulated): the renamed copy
# hooks are defined by the emulator's headers, so a program that never
# includes them would not link. snug's own build calls it on
# snug_cuda_emulated when SNUG_EMULATED_CHECKS is on; snugConfig.cmake calls
# it on snug::cuda_emulated for a project that finds snug with
# SNUG_EMULATED_CHECKS on, so that project's own kernels are checked too.
function(snug_enable_emulated_checks target)
  cmake_parse_arguments(arg "BUILD_INTERFACE" "" "" ${ARGN})
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "SNUG_EMULATED_CHECKS needs Clang (its -fsanitize-coverage=trace-loads,trace-stores), "
                        "not ${CMAKE_CXX_COMPILER_ID}: configure with -DCMAKE_CXX_COMPILER=clang++-19, say")
  endif()
  set(link_flags -fsanitize-coverage=func,trace-loads,trace-stores -fsanitize=address)
  set(compile_flags ${link_flags} -mllvm=-asan-memory-access-callback-prefix=snug_asan_)
  set(compile_flags "$<$<COMPILE_LANGUAGE:CXX>:${compile_flags}>")
  if(arg_BUILD_INTERFACE)
    set(compile_flags "$<BUILD_INTERFACE:${compile_flags}>")
    set(link_flags "$<BUILD_INTERFACE:${link_flags}>")
  endif()
  target_compile_options(${target} INTERFACE ${compile_flags})
  target_link_options(${target} INTERFACE ${link_flags})
endfunction()
