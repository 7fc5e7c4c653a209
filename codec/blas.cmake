# BLAS for the PowerSGD codec's GEMMs (codec/src/codecs/powersgd.cpp), through the CBLAS interface.
# OpenBLAS is preferred (Debian: libopenblas-dev): the codec then pins it to one thread, so encoded
# bytes do not depend on the core count. Any other CBLAS found by FindBLAS works too.
#
# Linked by absolute path, like HDF5, so the installed static libgcz carries the dependency without
# the package config having to find it again.
find_package(PkgConfig REQUIRED)
pkg_check_modules(GCZ_OPENBLAS QUIET openblas)
if(GCZ_OPENBLAS_FOUND)
  target_include_directories(gcz PRIVATE ${GCZ_OPENBLAS_INCLUDE_DIRS})
  target_link_libraries(gcz PRIVATE ${GCZ_OPENBLAS_LINK_LIBRARIES})
  target_compile_definitions(gcz PRIVATE GCZ_HAVE_OPENBLAS=1)
else()
  find_package(BLAS REQUIRED)
  target_link_libraries(gcz PRIVATE ${BLAS_LIBRARIES})
endif()
message(STATUS "gcz: BLAS ${GCZ_OPENBLAS_LINK_LIBRARIES}${BLAS_LIBRARIES}")
