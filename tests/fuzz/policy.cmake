# The routing policy parser on arbitrary YAML, and routing with the input as the prompt (seeds:
# our own policies; a valid classifier weights file is written to a temporary directory).
add_executable(fuzz_policy fuzz_policy.c)
target_link_libraries(fuzz_policy PRIVATE llmgw_router)
target_link_options(fuzz_policy PRIVATE -fsanitize=fuzzer,address,undefined)
add_test(NAME fuzz/policy/corpus
         COMMAND fuzz_policy -runs=0 ${CMAKE_CURRENT_SOURCE_DIR}/corpus/policy)
set_tests_properties(fuzz/policy/corpus PROPERTIES
                     ENVIRONMENT "UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1")
