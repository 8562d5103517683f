# The cache verifier's token blobs (from Redis) and weights files on arbitrary bytes (seeds:
# corpus/cache_verifier, written by corpus/cache_verifier/make.py).
add_executable(fuzz_cache_verifier fuzz_cache_verifier.c)
target_link_libraries(fuzz_cache_verifier PRIVATE llmgw_cache m)
target_link_options(fuzz_cache_verifier PRIVATE -fsanitize=fuzzer,address,undefined)
add_test(NAME fuzz/cache_verifier/corpus
         COMMAND fuzz_cache_verifier -runs=0 ${CMAKE_CURRENT_SOURCE_DIR}/corpus/cache_verifier)
set_tests_properties(fuzz/cache_verifier/corpus PROPERTIES
                     ENVIRONMENT "UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1")
