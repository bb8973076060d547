# check_needed.cmake - fails when the shared library LIB has a DT_NEEDED entry on a CUDA
# library the host process may already hold in another version (cudart, cuBLAS/cuBLASLt,
# NCCL): spanhead links the CUDA runtime statically and opens cuBLAS and NCCL at run time.
#   cmake -DLIB=build/libspanhead.so -P cmake/check_needed.cmake
if(NOT LIB)
  message(FATAL_ERROR "check_needed: pass -DLIB=<path of libspanhead.so>")
endif()
find_program(READELF NAMES readelf llvm-readelf)
if(NOT READELF)
  message(FATAL_ERROR "check_needed: readelf not found (binutils)")
endif()
execute_process(COMMAND ${READELF} -d ${LIB} OUTPUT_VARIABLE dyn RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "check_needed: readelf -d ${LIB} failed (${rc})")
endif()
string(REGEX MATCHALL "\\(NEEDED\\)[^\n]*" needed "${dyn}")
set(bad "")
foreach(line IN LISTS needed)
  if(line MATCHES "lib(cudart|cublas|cublasLt|nccl)[.]so")
    list(APPEND bad "${line}")
  endif()
endforeach()
list(LENGTH needed n)
if(bad)
  message(FATAL_ERROR "check_needed: ${LIB} needs a CUDA library of its own:\n  ${bad}")
endif()
# An undefined cublas*/nccl*/cuda* symbol would be a call that bypasses the run-time tables
# (cublas_shim.h, nccl_shim.h) or the static runtime: dlopen(RTLD_NOW) of the library fails.
execute_process(COMMAND ${READELF} --dyn-syms -W ${LIB} OUTPUT_VARIABLE syms RESULT_VARIABLE rc)
string(REGEX MATCHALL "UND (cublas|nccl|cuda)[A-Za-z0-9_]*" und "${syms}")
if(und)
  message(FATAL_ERROR "check_needed: ${LIB} has undefined CUDA-library symbols (call them "
                      "through cublas_shim.h / nccl_shim.h):\n  ${und}")
endif()
message(STATUS "check_needed: ${LIB}: ${n} NEEDED entries, none of cudart/cuBLAS/NCCL, no "
               "undefined cublas/nccl/cuda symbol")
