# The local semantic-cache store (cache/store.c). The test includes store.c itself to reach its
# statics, and runs threads.
llmgw_unit_test(cache store)
target_link_libraries(test_cache_store PRIVATE Threads::Threads)
