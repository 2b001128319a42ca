# Driven by ctest (tests/CMakeLists.txt): installs snug from the build tree
# into a scratch prefix, then configures, builds and runs tests/downstream
# twice: against the installed package and through add_subdirectory.
file(REMOVE_RECURSE ${SCRATCH})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}\n${out}")
  endif()
endfunction()

run(${CMAKE_COMMAND} --install ${SNUG_BINARY_DIR} --prefix ${SCRATCH}/prefix)
foreach(mode package subdirectory)
  run(${CMAKE_COMMAND} -S ${SNUG_SOURCE_DIR}/tests/downstream -B ${SCRATCH}/${mode} -G ${GENERATOR}
      -DCMAKE_PREFIX_PATH=${SCRATCH}/prefix -DSNUG_MODE=${mode} -DSNUG_SOURCE_DIR=${SNUG_SOURCE_DIR}
      -DSNUG_WITH_CUDA=OFF)
  run(${CMAKE_COMMAND} --build ${SCRATCH}/${mode})
  run(${SCRATCH}/${mode}/downstream)
endforeach()

# The installed package under Clang with the shared-memory checker on: the
# project's own kernel is checked (where clang++-19 is installed).
if(CLANG_CXX)
  run(${CMAKE_COMMAND} -S ${SNUG_SOURCE_DIR}/tests/downstream -B ${SCRATCH}/checked -G ${GENERATOR}
      -DCMAKE_PREFIX_PATH=${SCRATCH}/prefix -DSNUG_MODE=package -DSNUG_WITH_CUDA=OFF
      -DCMAKE_CXX_COMPILER=${CLANG_CXX} -DSNUG_EMULATED_CHECKS=ON)
  run(${CMAKE_COMMAND} --build ${SCRATCH}/checked --target checked_kernel)
  run(${SCRATCH}/checked/checked_kernel)
  message(STATUS "the installed package's shared-memory checker caught the downstream kernel's unwritten read")
endif()
