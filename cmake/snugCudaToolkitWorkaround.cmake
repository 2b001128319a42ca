# Included before find_package(CUDAToolkit). CMake 3.25's FindCUDAToolkit
# (Debian 12's) sets a deprecation property on CUDA::nvToolsExt whenever the
# project requires CMake 3.25 or newer, but CUDA 13 no longer ships
# libnvToolsExt, so that target is never made and the configure fails with
# "set_property could not find TARGET CUDA::nvToolsExt". Where the library is
# absent, an empty imported target of that name lets the module finish (snug
# does not link it; NVTX 3 is header-only: CUDA::nvtx3). Where it exists the
# module makes the real target as usual.
if(NOT TARGET CUDA::nvToolsExt)
  set(snug_cuda_hints $ENV{CUDA_PATH} /usr/local/cuda)
  if(CMAKE_CUDA_COMPILER)
    get_filename_component(snug_nvcc_dir "${CMAKE_CUDA_COMPILER}" DIRECTORY)
    list(PREPEND snug_cuda_hints "${snug_nvcc_dir}/..")
  endif()
  find_library(SNUG_NVTOOLSEXT_LIBRARY NAMES nvToolsExt nvToolsExt64_1 nvToolsExt64
               HINTS ${snug_cuda_hints} PATH_SUFFIXES lib64 lib lib/x64)
  mark_as_advanced(SNUG_NVTOOLSEXT_LIBRARY)
  if(NOT SNUG_NVTOOLSEXT_LIBRARY)
    add_library(CUDA::nvToolsExt INTERFACE IMPORTED)
  endif()
endif()
