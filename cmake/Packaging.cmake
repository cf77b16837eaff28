# What `cmake --install BUILD --prefix P` puts under P, for programs that embed megamoe (docs/decisions/packaging.md):
#   lib/libmegamoe.so*                     the C ABI (SONAME libmegamoe.so.<major>)
#   lib/libmegamoe_{runtime,abi,cache}.a   the C++ runtime and the two layers below it
#   include/megamoe/*.h                    public headers, with the generated megamoe/Version.h
#   include/compiler/{abi,cache}/*.h       headers the public ones include, at their repository-relative paths
#   lib/cmake/megamoe/                     find_package(megamoe CONFIG): megamoe::megamoe, megamoe::runtime, ...
#   lib/pkgconfig/megamoe.pc               the C ABI for pkg-config
# and, where the compiler is built: bin/megamoe-cache, bin/megamoe-opt, and the `jit` component (megamoe::runtime_jit).
include(CMakePackageConfigHelpers)

set(MEGAMOE_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/megamoe)

set_target_properties(megamoe_runtime PROPERTIES EXPORT_NAME runtime)
set_target_properties(megamoe_abi PROPERTIES EXPORT_NAME abi)
set_target_properties(megamoe_cache PROPERTIES EXPORT_NAME cache)
install(TARGETS megamoe megamoe_runtime megamoe_abi megamoe_cache EXPORT megamoeTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT megamoeTargets NAMESPACE megamoe:: DESTINATION ${MEGAMOE_CMAKE_DIR})

install(DIRECTORY ${PROJECT_SOURCE_DIR}/runtime/include/megamoe DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
install(FILES ${PROJECT_BINARY_DIR}/include/megamoe/Version.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/megamoe)
install(FILES ${PROJECT_SOURCE_DIR}/compiler/abi/DeviceAbi.h ${PROJECT_SOURCE_DIR}/compiler/abi/KernelAbi.h
              ${PROJECT_SOURCE_DIR}/compiler/abi/Kernels.def
              ${PROJECT_SOURCE_DIR}/compiler/abi/Models.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/compiler/abi)
install(FILES ${PROJECT_SOURCE_DIR}/compiler/cache/KernelCache.h ${PROJECT_SOURCE_DIR}/compiler/cache/Json.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/compiler/cache)

if(MEGAMOE_WITH_COMPILER)
  # The installed tools find libMLIR/libLLVM where they were linked from (Debian keeps libMLIR outside ld.so's path).
  set_target_properties(megamoe-cache megamoe-opt PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
  install(TARGETS megamoe-cache megamoe-opt RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})

  # The jit component: the runtime's in-process JIT hook (tools/jit/RuntimeJit.h) and the static compiler
  # libraries under it, which link MLIR, LLVM and LLD. Their own C++ headers are not installed: they need MLIR's
  # headers and the generated dialect headers, and DSL work happens in this tree.
  set(MEGAMOE_JIT_TARGETS megamoe_runtime_jit megamoe_jit megamoe_kernels megamoe_dsl megamoe_compiler megamoe_dialect)
  set_target_properties(megamoe_runtime_jit PROPERTIES EXPORT_NAME runtime_jit)
  install(TARGETS ${MEGAMOE_JIT_TARGETS} EXPORT megamoeJitTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(EXPORT megamoeJitTargets NAMESPACE megamoe:: DESTINATION ${MEGAMOE_CMAKE_DIR})
  install(FILES ${PROJECT_SOURCE_DIR}/tools/jit/RuntimeJit.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/tools/jit)
endif()

# The MLIR and LLD packages the jit component was built against, as hints for find_dependency.
set(MEGAMOE_MLIR_DIR "${MLIR_DIR}")
set(MEGAMOE_LLD_DIR "${LLD_DIR}")
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/megamoeConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/megamoeConfig.cmake INSTALL_DESTINATION ${MEGAMOE_CMAKE_DIR})
# One SONAME per major version, so one compatibility rule for both.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/megamoeConfigVersion.cmake COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/megamoeConfig.cmake ${PROJECT_BINARY_DIR}/megamoeConfigVersion.cmake
        DESTINATION ${MEGAMOE_CMAKE_DIR})

# megamoe.pc finds its prefix from its own place (${pcfiledir}), so the tree still works after --prefix or a move.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" OR IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  message(FATAL_ERROR "megamoe.pc needs CMAKE_INSTALL_LIBDIR and CMAKE_INSTALL_INCLUDEDIR relative to the prefix")
endif()
file(RELATIVE_PATH MEGAMOE_PC_TO_PREFIX "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
string(REGEX REPLACE "/$" "" MEGAMOE_PC_TO_PREFIX "${MEGAMOE_PC_TO_PREFIX}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/megamoe.pc.in ${PROJECT_BINARY_DIR}/megamoe.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/megamoe.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
