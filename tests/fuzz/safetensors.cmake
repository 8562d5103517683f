# The safetensors reader on arbitrary bytes (seeds: small files written by
# tests/fuzz/corpus/safetensors/make.py, none from a downloaded model).
add_executable(fuzz_safetensors fuzz_safetensors.c)
target_link_libraries(fuzz_safetensors PRIVATE llmgw_engine_format)
target_link_options(fuzz_safetensors PRIVATE -fsanitize=fuzzer,address,undefined)
add_test(NAME fuzz/safetensors/corpus
         COMMAND fuzz_safetensors -runs=0 ${CMAKE_CURRENT_SOURCE_DIR}/corpus/safetensors)
set_tests_properties(fuzz/safetensors/corpus PROPERTIES
                     ENVIRONMENT "UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1")
