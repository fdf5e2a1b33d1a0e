# Registers the gtest tests of TEST_EXECUTABLE with ctest in groups (cmake -P, after each link):
# one ctest test per gtest suite, and per world size for a suite parameterized over world sizes
# ("Suite/WorldSize2"). A test per process would spend as much time starting libtorch (its
# operator registrations: ~1 s of CPU per process) as most tests take to run. ctest prints a
# group's gtest output when it fails, which names the failing test; run one test alone with
# `tests/fsdpp_tests --gtest_filter=Suite.Name/WorldSize2`.
#   -D TEST_EXECUTABLE=... -D CTEST_FILE=<script to write> -D TEST_ENVIRONMENT=<NAME=value;...>
execute_process(COMMAND "${TEST_EXECUTABLE}" --gtest_list_tests
  OUTPUT_VARIABLE listing RESULT_VARIABLE status TIMEOUT 60)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "${TEST_EXECUTABLE} --gtest_list_tests failed (${status}):\n${listing}")
endif()

string(REPLACE "\n" ";" lines "${listing}")
set(groups "")
foreach(line IN LISTS lines)
  if(line MATCHES "^([A-Za-z0-9_/]+)\\.")  # a suite: "Suite." (parameterized: "Prefix/Suite.")
    set(suite "${CMAKE_MATCH_1}")
  elseif(line MATCHES "^  ([A-Za-z0-9_/]+)")  # a test of it: "  Name" or "  Name/WorldSize2  # ..."
    set(test "${CMAKE_MATCH_1}")
    set(group "${suite}")
    if(test MATCHES "/(WorldSize[0-9]+)$")
      set(group "${suite}/${CMAKE_MATCH_1}")
    endif()
    if(NOT DEFINED "members_${group}")
      list(APPEND groups "${group}")
      set("members_${group}" "")
    endif()
    list(APPEND "members_${group}" "${suite}.${test}")
  endif()
endforeach()

# A group all of whose tests skipped themselves (e.g. Python's safetensors missing) shows as
# skipped; a group with a failure never matches (gtest lists failures after the skips).
set(all_skipped "\\[  PASSED  \\] 0 tests\\.(\n\\[  SKIPPED \\][^\n]*)+\n*$")
set(script "")
foreach(group IN LISTS groups)
  list(LENGTH "members_${group}" count)
  string(REPLACE ";" ":" filter "${members_${group}}")
  # Multi-process tests stop themselves at their own deadlines (tests/harness); this bounds the
  # group as a whole.
  math(EXPR timeout "300 + 60 * ${count}")
  string(APPEND script
    "add_test([==[${group}]==] [==[${TEST_EXECUTABLE}]==] [==[--gtest_filter=${filter}]==])\n"
    "set_tests_properties([==[${group}]==] PROPERTIES TIMEOUT ${timeout}"
    " ENVIRONMENT [==[${TEST_ENVIRONMENT}]==] SKIP_REGULAR_EXPRESSION [==[${all_skipped}]==])\n")
endforeach()
file(WRITE "${CTEST_FILE}" "${script}")
