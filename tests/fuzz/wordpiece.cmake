# The BERT WordPiece tokenizer on arbitrary bytes; it loads all-MiniLM-L6-v2's vocab.txt from
# $LLMGW_MODELS (default <repo>/models), or a small built-in vocabulary without it.
add_executable(fuzz_wordpiece fuzz_wordpiece.c)
target_link_libraries(fuzz_wordpiece PRIVATE llmgw_engine_text)
target_compile_definitions(fuzz_wordpiece PRIVATE LLMGW_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
target_link_options(fuzz_wordpiece PRIVATE -fsanitize=fuzzer,address,undefined)
add_test(NAME fuzz/wordpiece/corpus
         COMMAND fuzz_wordpiece -runs=0 ${CMAKE_CURRENT_SOURCE_DIR}/corpus/wordpiece)
set_tests_properties(fuzz/wordpiece/corpus PROPERTIES
                     ENVIRONMENT "UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1")
