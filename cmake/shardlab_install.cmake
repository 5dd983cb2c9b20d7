# The C++ package: headers under include/shardlab, libshardlab_core.a, and the CMake package
# files, so another project writes
#   find_package(shardlab 0.1 REQUIRED)
#   target_link_libraries(app PRIVATE shardlab::core)      # or shardlab::xtensor for shardlab/xtensor.hpp
include(CMakePackageConfigHelpers)

set(SHARDLAB_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/shardlab CACHE STRING
    "Where shardlabConfig.cmake is installed, relative to the prefix")

install(TARGETS shardlab_core shardlab_xtensor EXPORT shardlabTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/cpp/include/shardlab
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.hpp")
install(EXPORT shardlabTargets NAMESPACE shardlab:: DESTINATION ${SHARDLAB_INSTALL_CMAKEDIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/shardlabConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/shardlabConfig.cmake
                              INSTALL_DESTINATION ${SHARDLAB_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/shardlabConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/shardlabConfig.cmake ${PROJECT_BINARY_DIR}/shardlabConfigVersion.cmake
        DESTINATION ${SHARDLAB_INSTALL_CMAKEDIR})
