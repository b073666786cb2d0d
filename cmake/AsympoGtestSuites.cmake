# Registers a GoogleTest program's tests with ctest one test suite at a
# time (cmake/AsympoHelpers.cmake, asympo_add_gtest): run after each build
# of the program (cmake -P), it lists the program's tests and writes a ctest
# include file with one test per suite, named after it and run as
# `PROGRAM --gtest_filter=SUITE.*`. A process per suite rather than per
# test: most of a test's time in a process of its own was the process's
# start (LibTorch's libraries), 670 times.
#
#   cmake -DPROGRAM=... -DOUT=... -DWORKDIR=... -DLABELS=a,b -DLOCK=gpu|
#         -DPROCESSORS=2 -P AsympoGtestSuites.cmake
execute_process(COMMAND "${PROGRAM}" --gtest_list_tests
  WORKING_DIRECTORY "${WORKDIR}" OUTPUT_VARIABLE listing RESULT_VARIABLE rc TIMEOUT 60)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${PROGRAM} --gtest_list_tests failed (${rc}): ${listing}")
endif()
string(REPLACE "\n" ";" lines "${listing}")
string(REPLACE "," ";" LABELS "${LABELS}")
set(content "")
set(count 0)
foreach(line IN LISTS lines)
  # Suite lines: "Suite." or "Prefix/Suite.  # TypeParam = ..."; test lines
  # are indented; gtest_main's "Running main() from ..." is neither.
  if(line MATCHES "^([A-Za-z_][A-Za-z0-9_/]*)\\.( .*)?$")
    set(suite "${CMAKE_MATCH_1}")
    string(APPEND content
      "add_test([=[${suite}]=] [==[${PROGRAM}]==] [==[--gtest_filter=${suite}.*]==])\n"
      "set_tests_properties([=[${suite}]=] PROPERTIES WORKING_DIRECTORY [==[${WORKDIR}]==] "
      "LABELS [==[${LABELS}]==] PROCESSORS ${PROCESSORS} "
      # Skipped only when every test of the suite skipped itself.
      "SKIP_REGULAR_EXPRESSION [==[\\[  PASSED  \\] 0 tests]==]")
    if(LOCK)
      string(APPEND content " RESOURCE_LOCK ${LOCK}")
    endif()
    string(APPEND content ")\n")
    math(EXPR count "${count} + 1")
  endif()
endforeach()
if(count EQUAL 0)
  message(FATAL_ERROR "${PROGRAM} lists no test suite: ${listing}")
endif()
file(WRITE "${OUT}" "${content}")
