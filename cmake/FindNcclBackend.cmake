# Decides DDP_HAVE_NCCL: the CUDA toolkit and NCCL's header and library.
set(DDP_NCCL_STATUS "disabled by DDP_WITH_NCCL=OFF")
if(DDP_WITH_NCCL)
  find_package(CUDAToolkit QUIET)
  if(NOT CUDAToolkit_FOUND)
    set(DDP_NCCL_STATUS "CUDA toolkit not found")
  else()
    # PyTorch's CUDA wheels bring NCCL as a Python package next to torch/
    # (site-packages/nvidia/nccl, or nvidia/cu<major> for CUDA 13 and later)
    # whose library is only the versioned libnccl.so.2.
    get_filename_component(torch_site_packages "${Torch_DIR}/../../../.." ABSOLUTE)
    file(GLOB pip_nccl_dirs "${torch_site_packages}/nvidia/nccl" "${torch_site_packages}/nvidia/cu[0-9]*")
    find_path(DDP_NCCL_INCLUDE_DIR nccl.h
      HINTS ${CUDAToolkit_INCLUDE_DIRS} $ENV{NCCL_HOME}/include
      PATHS ${pip_nccl_dirs} PATH_SUFFIXES include)
    find_library(DDP_NCCL_LIBRARY NAMES nccl libnccl.so.2
      HINTS ${CUDAToolkit_LIBRARY_DIR} $ENV{NCCL_HOME}/lib
      PATHS ${pip_nccl_dirs} PATH_SUFFIXES lib)
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
