# cmake -P script: configure + build the consumer against the build tree
# (attend_DIR=<build>, no install), run it; any failure is fatal.
include(${CMAKE_CURRENT_LIST_DIR}/run_or_fail.cmake)
file(REMOVE_RECURSE ${CONSUMER_BUILD})
run(${CMAKE_COMMAND} -S ${CONSUMER_SRC} -B ${CONSUMER_BUILD} -Dattend_DIR=${BUILD_DIR} -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${CONSUMER_BUILD})
run(${CONSUMER_BUILD}/consumer)
message("${last_output}")
