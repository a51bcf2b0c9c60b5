# ps_gtest(target [LABELS label...] [TIMEOUT seconds] [RUN_SERIAL]
#          [RESOURCE_LOCK name...] [ENVIRONMENT VAR=value...]
#          [PROPERTIES name value...])
#
# Registers every case of the GoogleTest binary `target` as a ctest test of
# its own (Suite.Case), found by asking the binary (gtest_discover_tests,
# when ctest runs), so that no case can be left out of a list kept by hand.
# A case that calls GTEST_SKIP is reported skipped, not passed.
#
# gtest_discover_tests's own PROPERTIES flattens a list value (LABELS
# "inproc;sanitize" would keep "inproc" only), so the properties are set
# here instead, by a file that ctest includes right after the discovered
# tests: list values (labels, locks, environment) stay whole.
function(ps_gtest target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "RUN_SERIAL" "TIMEOUT"
                        "LABELS;RESOURCE_LOCK;ENVIRONMENT;PROPERTIES")
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "ps_gtest(${target}): unknown arguments "
                        "${arg_UNPARSED_ARGUMENTS}")
  endif()
  set(list_var "ps_gtest_${target}_tests")
  # Listing the cases of a sanitizer build on a busy machine may take more
  # than the default 5 s.
  gtest_discover_tests(${target} DISCOVERY_MODE PRE_TEST
                       DISCOVERY_TIMEOUT 60 NO_PRETTY_TYPES NO_PRETTY_VALUES
                       TEST_LIST ${list_var})
  set(props "")
  foreach(name LABELS RESOURCE_LOCK ENVIRONMENT)
    if(arg_${name})
      string(APPEND props " ${name} [==[${arg_${name}}]==]")
    endif()
  endforeach()
  if(arg_TIMEOUT)
    string(APPEND props " TIMEOUT ${arg_TIMEOUT}")
  endif()
  if(arg_RUN_SERIAL)
    string(APPEND props " RUN_SERIAL TRUE")
  endif()
  foreach(item IN LISTS arg_PROPERTIES)
    string(APPEND props " [==[${item}]==]")
  endforeach()
  if(props STREQUAL "")
    return()
  endif()
  set(file "${CMAKE_CURRENT_BINARY_DIR}/${target}_properties.cmake")
  file(WRITE "${file}"
       "# Written by ps_gtest (cmake/PsGTest.cmake).\n"
       "if(NOT \"\${${list_var}}\" STREQUAL \"\")\n"
       "  set_tests_properties(\${${list_var}} PROPERTIES${props})\n"
       "endif()\n")
  # After gtest_discover_tests's file, which defines ${list_var}.
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${file}")
endfunction()
