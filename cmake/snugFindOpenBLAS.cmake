# Finds OpenBLAS's CBLAS interface (Debian: libopenblas-dev) and defines the
# imported target `snug_openblas`. Used by snug's build and by its installed
# package config, so the same library is found in both.
if(TARGET snug_openblas)
  return()
endif()
find_path(SNUG_CBLAS_INCLUDE_DIR cblas.h PATH_SUFFIXES openblas)
find_library(SNUG_OPENBLAS_LIBRARY NAMES openblas)
if(SNUG_CBLAS_INCLUDE_DIR AND SNUG_OPENBLAS_LIBRARY)
  add_library(snug_openblas INTERFACE IMPORTED)
  target_include_directories(snug_openblas INTERFACE ${SNUG_CBLAS_INCLUDE_DIR})
  target_link_libraries(snug_openblas INTERFACE ${SNUG_OPENBLAS_LIBRARY})
endif()
