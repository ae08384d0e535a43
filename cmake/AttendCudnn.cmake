# The cudnn backend's switch (src/backends/cudnn): AUTO builds it when CUDA is
# enabled and both cuDNN's headers (cudnn.h, cudnn_version.h; the CUDA toolkit
# ships them) and the header-only cudnn-frontend C++ API (cudnn_frontend.h)
# are found; ON requires them; OFF never builds it. Nothing is linked: the
# backend opens libcudnn.so.9 at run time (dlopen), so a library built here
# loads on machines without cuDNN and the backend then declines with a reason.
#
# cudnn-frontend comes from PyPI (nvidia-cudnn-frontend, whose wheel carries
# the C++ headers under site-packages/include; scripts/cudnn-frontend.sh
# installs it). It is looked for in CUDNN_FRONTEND_INCLUDE_DIR (cache or
# environment), in the directory that script installs to, and through
# python3's importlib.metadata (any environment where the wheel is installed).
# Sets ATTEND_WITH_CUDNN, ATTEND_CUDNN_INCLUDE_DIR, CUDNN_FRONTEND_INCLUDE_DIR
# and ATTEND_CUDNN_HEADER_VERSION (cudnnGetVersion()'s encoding, 91900 = 9.19.0).
set(ATTEND_CUDNN AUTO CACHE STRING "Build the cudnn backend: AUTO (when CUDA, cudnn.h and cudnn_frontend.h are found), ON, OFF")
set(CUDNN_FRONTEND_INCLUDE_DIR "$ENV{CUDNN_FRONTEND_INCLUDE_DIR}" CACHE PATH "Directory holding cudnn_frontend.h (empty: search)")
string(TOUPPER "${ATTEND_CUDNN}" attend_cudnn_mode)
if(NOT attend_cudnn_mode STREQUAL "AUTO")
  set(attend_cudnn_mode OFF)
  if(ATTEND_CUDNN)
    set(attend_cudnn_mode ON)
  endif()
endif()

set(ATTEND_WITH_CUDNN FALSE)
set(attend_cudnn_missing "")
if(NOT attend_cudnn_mode STREQUAL "OFF")
  if(NOT ATTEND_WITH_CUDA)
    set(attend_cudnn_missing "the cuda backend (ATTEND_CUDA) is not built")
  else()
    find_path(ATTEND_CUDNN_INCLUDE_DIR cudnn_version.h HINTS ${CUDAToolkit_INCLUDE_DIRS} $ENV{CUDNN_PATH}/include)
    if(NOT CUDNN_FRONTEND_INCLUDE_DIR OR NOT EXISTS "${CUDNN_FRONTEND_INCLUDE_DIR}/cudnn_frontend.h")
      # The wheel's files, listed by its own metadata: no import of the
      # package (which would load CUDA libraries), whatever environment holds it.
      set(attend_fe_hint "")
      # find_program, not find_package(Python3): the Python binding picks its own interpreter.
      find_program(ATTEND_CUDNN_PYTHON3 NAMES python3)
      if(ATTEND_CUDNN_PYTHON3)
        execute_process(
          COMMAND ${CMAKE_COMMAND} -E env "PYTHONPATH=$ENV{HOME}/.cache/attend/cudnn-frontend"
                  ${ATTEND_CUDNN_PYTHON3} -c
                  "import importlib.metadata as m, os\nd = m.distribution('nvidia-cudnn-frontend')\nf = [p for p in d.files if str(p).endswith('include/cudnn_frontend.h')]\nprint(os.path.dirname(d.locate_file(f[0])) if f else '')"
          OUTPUT_VARIABLE attend_fe_hint OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
      endif()
      unset(CUDNN_FRONTEND_INCLUDE_DIR CACHE)
      find_path(CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h
                HINTS ${attend_fe_hint} $ENV{HOME}/.cache/attend/cudnn-frontend/include)
    endif()
    if(NOT ATTEND_CUDNN_INCLUDE_DIR)
      set(attend_cudnn_missing "cudnn_version.h (cuDNN's headers) was not found")
    elseif(NOT CUDNN_FRONTEND_INCLUDE_DIR)
      set(attend_cudnn_missing "cudnn_frontend.h was not found (bash scripts/cudnn-frontend.sh installs it, or set CUDNN_FRONTEND_INCLUDE_DIR)")
    else()
      file(STRINGS "${ATTEND_CUDNN_INCLUDE_DIR}/cudnn_version.h" attend_cudnn_defs REGEX "#define CUDNN_(MAJOR|MINOR|PATCHLEVEL) ")
      foreach(part MAJOR MINOR PATCHLEVEL)
        string(REGEX MATCH "CUDNN_${part} ([0-9]+)" _ "${attend_cudnn_defs}")
        set(attend_cudnn_${part} "${CMAKE_MATCH_1}")
      endforeach()
      math(EXPR ATTEND_CUDNN_HEADER_VERSION "${attend_cudnn_MAJOR} * 10000 + ${attend_cudnn_MINOR} * 100 + ${attend_cudnn_PATCHLEVEL}")
      if(attend_cudnn_MAJOR LESS 9)
        set(attend_cudnn_missing "cuDNN ${attend_cudnn_MAJOR}.${attend_cudnn_MINOR} headers: the backend needs cuDNN 9")
      else()
        set(ATTEND_WITH_CUDNN TRUE)
      endif()
    endif()
  endif()
  if(attend_cudnn_mode STREQUAL "ON" AND NOT ATTEND_WITH_CUDNN)
    message(FATAL_ERROR "ATTEND_CUDNN=ON but ${attend_cudnn_missing}")
  endif()
endif()
if(ATTEND_WITH_CUDNN)
  message(STATUS "attend: cudnn backend TRUE (cuDNN headers ${attend_cudnn_MAJOR}.${attend_cudnn_MINOR}.${attend_cudnn_PATCHLEVEL} in ${ATTEND_CUDNN_INCLUDE_DIR}, cudnn-frontend in ${CUDNN_FRONTEND_INCLUDE_DIR})")
elseif(attend_cudnn_missing)
  message(STATUS "attend: cudnn backend FALSE (${attend_cudnn_missing})")
else()
  message(STATUS "attend: cudnn backend FALSE")
endif()
