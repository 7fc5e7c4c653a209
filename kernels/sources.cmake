# The CUDA backend: included by the top-level CMakeLists.txt when a CUDA compiler is found (it also
# defines GCZ_HAVE_CUDA and links CUDA::cudart_static). It replaces codec/src/cuda_unavailable.cpp.
target_sources(gcz PRIVATE
  kernels/cast.cu
  kernels/cuda_cast_codec.cpp
  kernels/cuda_kernel_rates.cu
  kernels/cuda_runtime.cu)

# Whole-program compilation (no device link step), the static runtime, C++20 like the host code (the CUDA
# standard follows CXX_STANDARD). CMake < 3.26 does not know nvcc's C++20 flag, so name it here.
if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
set_target_properties(gcz PROPERTIES
  CUDA_SEPARABLE_COMPILATION OFF
  CUDA_RUNTIME_LIBRARY Static
  CUDA_STANDARD 20
  CUDA_STANDARD_REQUIRED ON)
# --fmad=false: no multiply and add fused into one rounding, as -ffp-contract=off does for the host code,
# so that device arithmetic rounds as the codec specifications (and the CPU code) do.
# The tests' device code (tests/unit/shared_math_device.cu) is compiled with the same options.
set(GCZ_CUDA_OPTIONS -Xcompiler=-Wall,-Wextra --fmad=false)
target_compile_options(gcz PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${GCZ_CUDA_OPTIONS}>)

# Named in device_status()'s message when the device cannot load the kernels.
string(REPLACE ";" "," GCZ_CUDA_ARCH_LIST "${CMAKE_CUDA_ARCHITECTURES}")
set_property(SOURCE kernels/cuda_runtime.cu APPEND PROPERTY
  COMPILE_DEFINITIONS "GCZ_CUDA_ARCHITECTURES=\"${GCZ_CUDA_ARCH_LIST}\"")
