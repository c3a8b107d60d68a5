# A Debian package of ddp, made by CPack from the install rules above;
# scripts/package.sh configures a build for it (build-deb/) and runs
#
#   cpack -G DEB   ->  build-deb/ddp_<version>_<arch>.deb
#
# It holds what `cmake --install` puts under /usr (ddp-run, ddp-plot, the
# libraries, headers, the CMake package config, data and experiments) and
# depends on Debian's packages: the shared libraries ddp-run loads
# (dpkg-shlibdeps finds them: libtorch1.13, libgloo0, ...) and what a
# project that calls find_package(ddp) compiles against (libtorch-dev of the
# same release, libgloo-dev, libfmt-dev, nlohmann-json3-dev).
#
# Only a build that such a package can describe offers it: ddp at the top
# (not inside another project), installed to /usr (the data folder is
# compiled in), Debian's LibTorch, and no NCCL backend (CUDA's runtime and
# NCCL do not come from Debian's archive). Any other build says why at
# configure time and writes no CPack configuration.
set(ddp_deb_refused "")
if(NOT CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  set(ddp_deb_refused "CMAKE_INSTALL_PREFIX is ${CMAKE_INSTALL_PREFIX}, not /usr")
elseif(DDP_HAVE_NCCL)
  set(ddp_deb_refused "the NCCL backend is built in (its CUDA runtime and NCCL are not Debian packages)")
elseif(NOT Torch_DIR MATCHES "^/usr/(lib|share)/")
  set(ddp_deb_refused "LibTorch at ${Torch_DIR} is not Debian's libtorch-dev")
endif()
if(ddp_deb_refused)
  message(STATUS "cpack -G DEB: not offered by this build: ${ddp_deb_refused}. HINT: scripts/package.sh")
  return()
endif()
message(STATUS "cpack -G DEB: offered (ddp ${PROJECT_VERSION}, /usr, LibTorch ${Torch_VERSION})")

set(CPACK_PACKAGE_NAME "ddp")
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Data-parallel training for LibTorch in C++: ddp-run, libraries, headers")
set(CPACK_PACKAGE_DESCRIPTION "ddp runs JSON experiments on one process, every core of a machine, or a
cluster (DDP, ZeRO, FSDP over Gloo); ddp-run is its launcher, and its
libraries and CMake package (find_package(ddp)) serve C++ training programs.")
set(CPACK_PACKAGE_CONTACT "ddp maintainers <ddp@localhost>")
set(CPACK_PACKAGING_INSTALL_PREFIX "/usr")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION "devel")
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# The release ddp was built with (1.13): its libraries are libtorch.so.1.13.
string(REGEX MATCH "^([0-9]+)\\.([0-9]+)" torch_release "${Torch_VERSION}")
set(torch_major "${CMAKE_MATCH_1}")
math(EXPR torch_next_minor "${CMAKE_MATCH_2} + 1")
set(ddp_deb_depends
  "libtorch-dev (>= ${torch_release})" "libtorch-dev (<< ${torch_major}.${torch_next_minor})"
  "nlohmann-json3-dev" "libfmt-dev")
if(DDP_HAVE_GLOO)
  list(APPEND ddp_deb_depends "libgloo-dev")
endif()
list(JOIN ddp_deb_depends ", " CPACK_DEBIAN_PACKAGE_DEPENDS)
# Without OpenBLAS's threaded build LibTorch's CPU steps are ~16x slower;
# ddp-plot draws with matplotlib; ddp_torch (when built) is imported by
# python3, whose torch is python3-torch.
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "libopenblas0-pthread, python3-matplotlib")
if(DDP_HAVE_PYTHON_TORCH)
  string(APPEND CPACK_DEBIAN_PACKAGE_RECOMMENDS ", python3-torch")
endif()
include(CPack)
