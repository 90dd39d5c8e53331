# Included by ctest after the discovered tests (TEST_INCLUDE_FILES): the policy comparison reads the results
# that the nine fp32 and int8 runs publish and launches only those missing, so it runs after them; otherwise
# a fresh clone's suite (no timings yet) may start it first and train all nine runs twice.
set(lw_policy_runs ${lw_policy_test_TESTS})
list(FILTER lw_policy_runs INCLUDE REGEX "^policy [a-z]+ over (fp32|int8):")
set(lw_policy_comparison ${lw_policy_test_TESTS})
list(FILTER lw_policy_comparison INCLUDE REGEX "^policy comparison:")
list(LENGTH lw_policy_runs lw_runs)
list(LENGTH lw_policy_comparison lw_comparisons)
if(lw_runs EQUAL 9 AND lw_comparisons EQUAL 1)
  set_tests_properties("${lw_policy_comparison}" PROPERTIES DEPENDS "${lw_policy_runs}")
elseif(DEFINED lw_policy_test_TESTS)
  message(FATAL_ERROR "tests/cmake/policy_order.cmake: expected 9 policy runs over fp32 or int8 and one "
    "comparison in lw_policy_test, found ${lw_runs} and ${lw_comparisons}")
endif()
