# cmake -P script: install, configure + build the consumer, run it; any failure is fatal.
include(${CMAKE_CURRENT_LIST_DIR}/run_or_fail.cmake)
file(REMOVE_RECURSE ${PREFIX} ${CONSUMER_BUILD})
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${PREFIX})
# The Python package is installed only where an interpreter looks, on request
# (pip install ., pyproject.toml), never into a prefix path no python searches.
if(EXISTS ${PREFIX}/lib/python3/dist-packages)
  message(FATAL_ERROR "cmake --install wrote ${PREFIX}/lib/python3/dist-packages, which no python searches")
endif()
run(${CMAKE_COMMAND} -S ${CONSUMER_SRC} -B ${CONSUMER_BUILD} -DCMAKE_PREFIX_PATH=${PREFIX} -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${CONSUMER_BUILD})
run(${CONSUMER_BUILD}/consumer)
message("${last_output}")
