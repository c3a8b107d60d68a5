# A Debian package of ddp, made by CPack from the install rules above:
#
#   cmake --build build && (cd build && cpack -G DEB)   ->  build/ddp_<version>_<arch>.deb
#
# It holds what `cmake --install` puts under a prefix (ddp-run, ddp-plot, the
# libraries, headers, the CMake package config, data and experiments), under
# /usr, and depends on Debian's packages of what the libraries were built
# against, so that `apt-get install ./ddp_*.deb` brings them, and a project
# that calls find_package(ddp) finds everything it needs. The package suits
# the LibTorch it was built with: one from Debian (libtorch-dev); a package
# built against another LibTorch (a CUDA one) names no LibTorch dependency
# and says so at configure time.
set(CPACK_PACKAGE_NAME "ddp")
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "Data-parallel training for LibTorch in C++: ddp-run, libraries, headers")
set(CPACK_PACKAGE_DESCRIPTION "ddp runs JSON experiments on one process, every core or GPU of a machine, or a
cluster (DDP, ZeRO, FSDP over Gloo or NCCL); ddp-run is its launcher, and its
libraries and CMake package (find_package(ddp)) serve C++ training programs.")
set(CPACK_PACKAGE_CONTACT "ddp maintainers <ddp@localhost>")
set(CPACK_PACKAGING_INSTALL_PREFIX "/usr")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION "devel")
set(ddp_deb_depends "nlohmann-json3-dev" "libfmt-dev")
if(DDP_HAVE_GLOO)
  list(APPEND ddp_deb_depends "libgloo-dev")
endif()
if(Torch_DIR MATCHES "^/usr/(lib|share)/")
  list(PREPEND ddp_deb_depends "libtorch-dev (>= ${Torch_VERSION})")
else()
  message(STATUS "cpack -G DEB: LibTorch at ${Torch_DIR} is not Debian's; the package names no LibTorch dependency")
endif()
list(JOIN ddp_deb_depends ", " CPACK_DEBIAN_PACKAGE_DEPENDS)
# Without OpenBLAS's threaded build LibTorch's CPU steps are ~16x slower;
# ddp-plot draws with matplotlib.
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "libopenblas0-pthread, python3-matplotlib")
include(CPack)
