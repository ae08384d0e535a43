# Backends as folders. A backend folder's CMakeLists.txt calls
#
#   attend_add_backend(<name> SOURCES a.cpp b.cpp ... [LINK <libraries>])
#
# and its code defines attend::backends::register_<name>(detail::BuiltinBackends&)
# (src/runtime/builtin.h). attend_link_backends(<target> <name>...) puts those
# backends' objects into <target> and generates the function that registers
# them, so the runtime includes no backend header. Adding a backend is one new
# folder plus its name in ATTEND_BACKENDS (src/CMakeLists.txt). LINK names
# libraries every target holding the backend's objects must link (its objects
# carry no link dependencies of their own), e.g. the CUDA runtime.

function(attend_add_backend name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LINK" ${ARGN})
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "attend_add_backend(${name}): SOURCES is empty")
  endif()
  add_library(attend_backend_${name} OBJECT ${ARG_SOURCES})
  target_include_directories(attend_backend_${name} PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(attend_backend_${name} PRIVATE OpenMP::OpenMP_CXX attend_warnings ${ARG_LINK})
  set_target_properties(attend_backend_${name} PROPERTIES ATTEND_LINK "${ARG_LINK}")
endfunction()

function(attend_link_backends target)
  set(ATTEND_BACKEND_DECLS "")
  set(ATTEND_BACKEND_CALLS "")
  foreach(name IN LISTS ARGN)
    if(NOT TARGET attend_backend_${name})
      message(FATAL_ERROR "backend '${name}' has no folder that called attend_add_backend(${name})")
    endif()
    target_sources(${target} PRIVATE $<TARGET_OBJECTS:attend_backend_${name}>)
    get_target_property(link attend_backend_${name} ATTEND_LINK)
    if(link)
      # PRIVATE: a static library still passes them on as link-only
      # dependencies, without their include directories.
      target_link_libraries(${target} PRIVATE ${link})
    endif()
    string(APPEND ATTEND_BACKEND_DECLS "void register_${name}(detail::BuiltinBackends& list);\n")
    string(APPEND ATTEND_BACKEND_CALLS "  backends::register_${name}(list);\n")
  endforeach()
  set(generated ${CMAKE_CURRENT_BINARY_DIR}/${target}_builtin_backends.cpp)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/builtin_backends.cpp.in ${generated} @ONLY)
  target_sources(${target} PRIVATE ${generated})
endfunction()
