# ctest: install this build into a prefix inside the build tree, then configure, build and run
# tests/cpp/consumer (a separate project using find_package(shardlab)) against that prefix.
set(_prefix ${PROJECT_BINARY_DIR}/consumer/prefix)
add_test(NAME package.install
         COMMAND ${CMAKE_COMMAND} --install ${PROJECT_BINARY_DIR} --prefix ${_prefix} --config $<CONFIG>)
set_tests_properties(package.install PROPERTIES FIXTURES_SETUP shardlab_installed)
add_test(NAME package.find_package
         COMMAND ${CMAKE_CTEST_COMMAND} --build-and-test ${PROJECT_SOURCE_DIR}/tests/cpp/consumer
                 ${PROJECT_BINARY_DIR}/consumer/build
                 --build-generator ${CMAKE_GENERATOR}
                 --build-options -DCMAKE_PREFIX_PATH=${_prefix}
                                 -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER}
                                 -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE}
                 --test-command consumer)
set_tests_properties(package.find_package PROPERTIES FIXTURES_REQUIRED shardlab_installed)
