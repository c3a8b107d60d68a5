# Writes the ctest entries `unit.<file>`: the quick cases of each test file
# of ddp_tests, run together in one process (see tests/CMakeLists.txt). Run
# after every link of ddp_tests, so a file whose cases are all [solo] gets
# no entry, and a file that gains a quick case gets one.
#
#   cmake -D TEST_EXECUTABLE=... -D CTEST_FILE=... -P unit_groups.cmake
execute_process(COMMAND "${TEST_EXECUTABLE}" "-#" --list-tags "~[solo]~[.]"
  OUTPUT_VARIABLE listing RESULT_VARIABLE result)
if(result LESS 0)
  message(FATAL_ERROR "unit_groups: ${TEST_EXECUTABLE} --list-tags failed (${result}): ${listing}")
endif()
set(script "")
string(REGEX MATCHALL "\\[#test_[A-Za-z0-9_]+\\]" tags "${listing}")
foreach(tag ${tags})
  string(REGEX REPLACE "^\\[#(.*)\\]$" "\\1" stem "${tag}")
  string(APPEND script
    "add_test(unit.${stem} \"${TEST_EXECUTABLE}\" \"-#\" [==[[#${stem}]~[solo]~[.]]==] -w NoTests)\n"
    "set_tests_properties(unit.${stem} PROPERTIES TIMEOUT 300 FAIL_REGULAR_EXPRESSION \"SKIPPED:\")\n")
endforeach()
if(script STREQUAL "")
  message(FATAL_ERROR "unit_groups: ${TEST_EXECUTABLE} lists no quick case in any file: ${listing}")
endif()
file(WRITE "${CTEST_FILE}" "${script}")
