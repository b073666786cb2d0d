# Shared helpers: warning flags, the LibTorch precompiled header, tests.

function(asympo_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
  if(ASYMPO_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

# One precompiled header for every target that includes LibTorch: a TU that
# includes <torch/types.h> takes ~10 s to parse; with the PCH ~2.5 s. Targets
# reuse it with asympo_use_torch_pch(), which requires identical compile flags.
set(ASYMPO_TORCH_PCH_HEADERS
  <torch/types.h>
  <torch/csrc/autograd/autograd.h>
  <absl/status/status.h>
  <absl/status/statusor.h>
  <absl/strings/str_cat.h>
  <absl/strings/str_format.h>
  <vector>
  <string>
  <optional>)

function(asympo_use_torch_pch target)
  target_precompile_headers(${target} REUSE_FROM asympo_torch_pch)
endfunction()

# Sources per unity batch of a test program: measured on the 2-core machine
# (docs/security.md, "CI").
set(ASYMPO_UNITY_TEST_BATCH 8)

# asympo_add_gtest(NAME name SOURCES a.cc b.cc LIBS lib... [LABELS l...] [TORCH])
# Builds one test executable and registers each test suite with ctest (one
# process per suite, cmake/AsympoGtestSuites.cmake). TORCH tests use the
# LibTorch PCH and a main() that sets one intra-op thread
# (tests/testing/torch_test_main.cc).
function(asympo_add_gtest)
  cmake_parse_arguments(ARG "TORCH" "NAME" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SOURCES})
  target_include_directories(${ARG_NAME} PRIVATE ${PROJECT_SOURCE_DIR})
  # ASYMPO_UNITY_TESTS: the sources in batches of ASYMPO_UNITY_TEST_BATCH, each
  # batch one translation unit, so that the headers every test includes are
  # compiled once a batch. The files of a program therefore share one
  # namespace: a helper in an anonymous namespace is named for its file's
  # job, never a name another test file of the program uses.
  # A product source a test program compiles itself (one under bench/)
  # stays a translation unit of its own, compiled as the product compiles it.
  if(ASYMPO_UNITY_TESTS)
    set_target_properties(${ARG_NAME} PROPERTIES UNITY_BUILD ON
      UNITY_BUILD_BATCH_SIZE ${ASYMPO_UNITY_TEST_BATCH})
    foreach(src IN LISTS ARG_SOURCES)
      if(IS_ABSOLUTE "${src}")
        set_source_files_properties(${src} PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
      endif()
    endforeach()
  endif()
  asympo_set_warnings(${ARG_NAME})
  if(ARG_TORCH)
    target_link_libraries(${ARG_NAME} PRIVATE ${ARG_LIBS} asympo_torch_test_main GTest::gmock)
    asympo_use_torch_pch(${ARG_NAME})
  else()
    target_link_libraries(${ARG_NAME} PRIVATE ${ARG_LIBS} GTest::gmock GTest::gtest_main)
  endif()
  # One GPU per node: tests labelled gpu never run beside each other, whatever
  # ctest's -j (the NCCL watchdog tests time themselves).
  set(lock "")
  if("gpu" IN_LIST ARG_LABELS)
    set(lock gpu)
  endif()
  # One ctest test per test suite (cmake/AsympoGtestSuites.cmake), listed
  # after each build of the program. A suite keeps one core busy: two of
  # ctest's slots (tests/CMakeLists.txt, "scheduling").
  set(suites "${CMAKE_CURRENT_BINARY_DIR}/${ARG_NAME}_suites.cmake")
  string(REPLACE ";" "," labels "${ARG_LABELS}")
  add_custom_command(TARGET ${ARG_NAME} POST_BUILD
    COMMAND ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:${ARG_NAME}> -DOUT=${suites}
      -DWORKDIR=${PROJECT_BINARY_DIR} -DLABELS=${labels} -DLOCK=${lock} -DPROCESSORS=2
      -P ${PROJECT_SOURCE_DIR}/cmake/AsympoGtestSuites.cmake
    BYPRODUCTS ${suites}
    VERBATIM)
  # A program a leg did not build (deploy/run_sanitizers.sh builds a few)
  # stands as one test NAME_NOT_BUILT, which such legs leave out.
  set(include_file "${CMAKE_CURRENT_BINARY_DIR}/${ARG_NAME}_include.cmake")
  file(WRITE "${include_file}"
    "if(EXISTS \"${suites}\")\n  include(\"${suites}\")\nelse()\n"
    "  add_test(${ARG_NAME}_NOT_BUILT ${ARG_NAME}_NOT_BUILT)\nendif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${include_file})
endfunction()
