# The router classifier's weights parser on arbitrary bytes (seeds: small hand-written weights
# files in corpus/router_weights).
add_executable(fuzz_router_weights fuzz_router_weights.c)
target_link_libraries(fuzz_router_weights PRIVATE llmgw_router m)
target_link_options(fuzz_router_weights PRIVATE -fsanitize=fuzzer,address,undefined)
add_test(NAME fuzz/router_weights/corpus
         COMMAND fuzz_router_weights -runs=0 ${CMAKE_CURRENT_SOURCE_DIR}/corpus/router_weights)
set_tests_properties(fuzz/router_weights/corpus PROPERTIES
                     ENVIRONMENT "UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1")
