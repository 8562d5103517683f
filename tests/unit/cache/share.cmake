# cache/share against a real redis-server (from PATH) that the test starts on a free port.
llmgw_unit_test(cache share)
set_tests_properties(cache/share PROPERTIES TIMEOUT 120)
