# The ROS 2 PyPI wheels' include-directory pitfall, fixed for an interface package whose CMakeLists.txt we do not
# own (e.g. the pristine upstream composition_interfaces that ../shared/ros2_launch ships). tools/build_msgs.sh
# passes this file as -DCMAKE_PROJECT_INCLUDE, so it runs right after the package's project(); the fix itself is
# then deferred to the end of the top-level CMakeLists.txt, when rosidl_generate_interfaces has imported the
# targets. This repository's CMakeLists.txt include()s it and calls oxygen_wheel_include_fix() itself.
#
# The wheels' exported <pkg>__rosidl_generator_py targets carry include dirs of the wheel build machine
# (/opt/python/...), which CMake rejects as non-existent: drop the ones that do not exist and add the local Python
# and NumPy headers instead (the same fix as in this repository's CMakeLists.txt). A no-op where every path exists.
include_guard(GLOBAL)

function(oxygen_wheel_include_fix)
  get_property(_targets DIRECTORY "${CMAKE_SOURCE_DIR}" PROPERTY IMPORTED_TARGETS)
  set(_local_includes ${Python3_INCLUDE_DIRS} ${Python3_NumPy_INCLUDE_DIRS})
  foreach(_tgt IN LISTS _targets)
    if(NOT _tgt MATCHES "__rosidl_generator_py$" OR NOT TARGET "${_tgt}")
      continue()
    endif()
    get_target_property(_incs "${_tgt}" INTERFACE_INCLUDE_DIRECTORIES)
    if(NOT _incs)
      continue()
    endif()
    set(_kept "")
    set(_dropped FALSE)
    foreach(_inc IN LISTS _incs)
      if(_inc MATCHES "^\\$<" OR EXISTS "${_inc}")
        list(APPEND _kept "${_inc}")
      else()
        set(_dropped TRUE)
      endif()
    endforeach()
    if(_dropped)
      if(NOT _local_includes)
        find_package(Python3 REQUIRED COMPONENTS Development NumPy)
        set(_local_includes ${Python3_INCLUDE_DIRS} ${Python3_NumPy_INCLUDE_DIRS})
      endif()
      list(APPEND _kept ${_local_includes})
      list(REMOVE_DUPLICATES _kept)
      set_target_properties("${_tgt}" PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${_kept}")
    endif()
  endforeach()
endfunction()

if(CMAKE_PROJECT_INCLUDE)  # injected into a package we do not own: run at the end of its CMakeLists.txt
  cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL oxygen_wheel_include_fix)
endif()
