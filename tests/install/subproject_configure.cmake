# cmake -P script: configure tests/install/subproject, which add_subdirectory's
# attend, with the optional dependencies impossible to find.
include(${CMAKE_CURRENT_LIST_DIR}/run_or_fail.cmake)
file(REMOVE_RECURSE ${SUBPROJECT_BUILD})
run(${CMAKE_COMMAND} -S ${CMAKE_CURRENT_LIST_DIR}/subproject -B ${SUBPROJECT_BUILD} -DATTEND_SOURCE_DIR=${SOURCE_DIR}
    -DCMAKE_DISABLE_FIND_PACKAGE_CLI11=ON -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON
    -DCMAKE_DISABLE_FIND_PACKAGE_benchmark=ON -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON
    -DCMAKE_DISABLE_FIND_PACKAGE_Python3=ON)
message("subproject configured\n${last_output}")
