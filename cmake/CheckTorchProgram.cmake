# ddp_check_torch_program(NAME SOURCE WHAT): whether SOURCE, a small program
# using a part of LibTorch that not every LibTorch ships or builds with (c10d
# internals), compiles and links against the LibTorch found. Sets the cache
# entries DDP_HAVE_<NAME> (true or false) and DDP_<NAME>_STATUS ("WHAT builds
# against LibTorch V", or "WHAT does not build ...: <the first error>"), and
# checks again only when the LibTorch or the C++ standard changes.
function(ddp_check_torch_program name source what)
  set(key "${Torch_DIR}|${Torch_VERSION}|${CMAKE_CXX_STANDARD}")
  if("${DDP_${name}_CHECKED}" STREQUAL "${key}" AND DEFINED DDP_${name}_STATUS)
    return()
  endif()
  message(STATUS "Checking whether ${what} builds here")
  string(TOLOWER "${name}" folder)
  try_compile(builds ${PROJECT_BINARY_DIR}/CMakeFiles/${folder}_check
    SOURCES ${source}
    LINK_LIBRARIES ${TORCH_LIBRARIES}
    CXX_STANDARD ${CMAKE_CXX_STANDARD}
    CXX_STANDARD_REQUIRED ON
    OUTPUT_VARIABLE output)
  if(builds)
    set(status "builds against LibTorch ${Torch_VERSION}")
  else()
    # The compiler's or linker's first complaint, e.g. a missing header.
    string(REGEX MATCH "[^\n]*(error:|undefined reference)[^\n]*" first_error "${output}")
    string(REPLACE "\"" "'" first_error "${first_error}")
    string(REPLACE "\\" "/" first_error "${first_error}")
    string(REPLACE "@" "" first_error "${first_error}")
    string(STRIP "${first_error}" first_error)
    set(status "does not build against LibTorch ${Torch_VERSION}: ${first_error}")
  endif()
  set(DDP_HAVE_${name} ${builds} CACHE INTERNAL "")
  set(DDP_${name}_STATUS "${what} ${status}" CACHE INTERNAL "")
  set(DDP_${name}_CHECKED "${key}" CACHE INTERNAL "")
endfunction()
