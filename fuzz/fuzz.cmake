# libFuzzer targets (-DTRELLIS_FUZZ=ON with clang; scripts/test.sh builds them in build-fuzz).
# Only the parsers' sources are compiled, with coverage, ASan and UBSan (the top-level
# CMakeLists adds the flags); each target links -fsanitize=fuzzer. ctest runs every target over
# its seed corpus plus a short bounded fuzzing run (label "fuzz").
set(TRELLIS_FUZZ_SOURCES
    src/trellis/core/error.cpp
    src/trellis/core/philox.cpp
    src/trellis/core/atomic_file.cpp
    src/trellis/core/mapped_file.cpp
    src/trellis/io/safetensors.cpp
    src/trellis/io/checkpoint.cpp
    src/trellis/io/sharded_checkpoint.cpp
    src/trellis/io/pretrained.cpp
    src/trellis/data/shard.cpp
    src/trellis/data/doc_index.cpp
    src/trellis/data/tokenizer.cpp
    src/trellis/data/sentencepiece.cpp
    src/trellis/data/task_readers.cpp
    src/trellis/model/config.cpp
    src/trellis/model/family.cpp
    src/trellis/model/params.cpp
    src/trellis/model/families/gpt2.cpp
    src/trellis/model/families/llama.cpp
    src/trellis/model/families/encoder.cpp
    src/trellis/model/families/encdec.cpp
    src/trellis/train/config.cpp)
add_library(trellis_parsers STATIC ${TRELLIS_FUZZ_SOURCES})
target_include_directories(trellis_parsers PUBLIC src ${CMAKE_SOURCE_DIR})
target_link_libraries(trellis_parsers PUBLIC fmt::fmt nlohmann_json::nlohmann_json
                      PkgConfig::TOMLPP PkgConfig::PCRE2 PkgConfig::SENTENCEPIECE ZLIB::ZLIB)

# Seconds of fuzzing per target in ctest (after the whole seed corpus has run once).
set(TRELLIS_FUZZ_SECONDS 10 CACHE STRING "seconds each fuzz target runs in ctest")
enable_testing()
file(GLOB TRELLIS_FUZZ_TARGETS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/fuzz/fuzz_*.cpp)
add_custom_target(fuzz_all)
foreach(src ${TRELLIS_FUZZ_TARGETS})
  get_filename_component(name ${src} NAME_WE)
  string(REGEX REPLACE "^fuzz_" "" target ${name})
  add_executable(${name} ${src})
  target_link_libraries(${name} PRIVATE trellis_parsers)
  target_link_options(${name} PRIVATE -fsanitize=fuzzer)
  add_dependencies(fuzz_all ${name})
  # A scratch copy of the corpus: libFuzzer adds the inputs it finds to its first directory.
  set(work ${CMAKE_BINARY_DIR}/fuzztmp/${target})
  add_test(NAME fuzz.${target}
           COMMAND ${CMAKE_SOURCE_DIR}/fuzz/run_fuzzer.sh $<TARGET_FILE:${name}>
                   ${CMAKE_SOURCE_DIR}/fuzz/corpus/${target} ${work} ${TRELLIS_FUZZ_SECONDS})
  set_tests_properties(fuzz.${target} PROPERTIES TIMEOUT 300 LABELS fuzz)
endforeach()
