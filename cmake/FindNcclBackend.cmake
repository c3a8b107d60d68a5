# Decides DDP_HAVE_NCCL: the CUDA toolkit and NCCL's header and library.
set(DDP_NCCL_STATUS "disabled by DDP_WITH_NCCL=OFF")
if(DDP_WITH_NCCL)
  find_package(CUDAToolkit QUIET)
  if(NOT CUDAToolkit_FOUND)
    set(DDP_NCCL_STATUS "CUDA toolkit not found")
  else()
    find_path(DDP_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} $ENV{NCCL_HOME}/include)
    find_library(DDP_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} $ENV{NCCL_HOME}/lib)
    if(DDP_NCCL_INCLUDE_DIR AND DDP_NCCL_LIBRARY)
      set(DDP_HAVE_NCCL 1)
      set(DDP_NCCL_STATUS "CUDA ${CUDAToolkit_VERSION}, NCCL at ${DDP_NCCL_LIBRARY}")
    else()
      set(DDP_NCCL_STATUS "NCCL not found in the CUDA toolkit (set NCCL_HOME)")
    endif()
  endif()
endif()

# A CUDA build of LibTorch lets the backend order itself after torch's
# current stream; Debian's CPU-only build does not have c10_cuda.
set(DDP_TORCH_HAS_CUDA 0)
if(CAFFE2_USE_CUDA OR TARGET c10_cuda OR TARGET torch_cuda)
  set(DDP_TORCH_HAS_CUDA 1)
endif()
