# CMake package config for sucl's C API: find_package(sucl) gives the imported targets
#   sucl::sucl         the shared library (libsucl.so) and include/sucl.h
#   sucl::sucl_static  the static library (libsucl.a) with the system libraries it needs
# The installed tree is relocatable: paths are found from this file's place, <prefix>/lib/cmake/sucl.

get_filename_component(_sucl_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)

if(NOT TARGET sucl::sucl)
  add_library(sucl::sucl SHARED IMPORTED)
  set_target_properties(sucl::sucl PROPERTIES
    IMPORTED_LOCATION "${_sucl_prefix}/lib/libsucl.so.0"
    IMPORTED_SONAME "libsucl.so.0"
    INTERFACE_INCLUDE_DIRECTORIES "${_sucl_prefix}/include")
endif()

if(NOT TARGET sucl::sucl_static)
  find_package(Threads REQUIRED)
  add_library(sucl::sucl_static STATIC IMPORTED)
  set_target_properties(sucl::sucl_static PROPERTIES
    IMPORTED_LOCATION "${_sucl_prefix}/lib/libsucl.a"
    INTERFACE_INCLUDE_DIRECTORIES "${_sucl_prefix}/include"
    INTERFACE_LINK_LIBRARIES "Threads::Threads;dl;util;rt;m")
endif()

foreach(_sucl_file "${_sucl_prefix}/include/sucl.h" "${_sucl_prefix}/lib/libsucl.so.0")
  if(NOT EXISTS "${_sucl_file}")
    set(sucl_FOUND FALSE)
    set(sucl_NOT_FOUND_MESSAGE "sucl's install at ${_sucl_prefix} lacks ${_sucl_file}")
  endif()
endforeach()
unset(_sucl_file)
unset(_sucl_prefix)
