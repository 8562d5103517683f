# The sentence encoder (issue 4): safetensors, WordPiece and BERT against sentence-transformers'
# golden data, and the batching worker. Both read all-MiniLM-L6-v2 from $LLMGW_MODELS (default
# <repo>/models) and fail without it.
llmgw_engine_test(encoder bert)
target_compile_definitions(test_engine_bert PRIVATE LLMGW_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
target_link_libraries(test_engine_bert PRIVATE PkgConfig::CJSON)
llmgw_engine_test(encoder encoder)
target_compile_definitions(test_engine_encoder PRIVATE LLMGW_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
set_tests_properties(engine/bert engine/encoder PROPERTIES TIMEOUT 600)
# On a CUDA device: the golden cosines and pooling; skipped (exit 77) without one.
add_test(NAME engine/bert_cuda COMMAND test_engine_bert)
set_tests_properties(engine/bert_cuda PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77 LABELS cuda
                     ENVIRONMENT LLMGW_TEST_DEVICE=cuda)
if(LLMGW_CUDA_SIM)   # on the simulator (tests/cudasim/, slow): the first 8 golden texts
  set_tests_properties(engine/bert_cuda PROPERTIES ENVIRONMENT
                       "LLMGW_TEST_DEVICE=cuda;LLMGW_BERT_TEXTS=8")
endif()
# The same two on the shadow CPU (kernels/shadow.h): the device path of the encoder, checked.
add_test(NAME engine/bert_shadow COMMAND test_engine_bert)
# "heavy" as engine/golden_shadow is: the shadow backend's own faults catch a host access, and the
# sanitized run already checks the encoder's path in engine/bert.
set_tests_properties(engine/bert_shadow PROPERTIES TIMEOUT 600 LABELS heavy
                     ENVIRONMENT LLMGW_TEST_DEVICE=shadow)
