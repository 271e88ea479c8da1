# The folders of src/trellis as libraries, lowest first. trellis_layer(<folder> ...) builds every
# .cpp under src/trellis/<folder>/ into the static library trellis_<folder>, linked to the folders
# its line names: PUBLIC where the folder's headers include them, PRIVATE where only its sources
# do. A line names only folders above it, so the graph has no cycle. scripts/check_layers.py
# (ctest layers.check) reads these lines and fails on any include they do not allow: a folder's
# files include only its own headers and those of the folders its line names. Why this order:
# docs/design.md, "Layers and folders".
function(trellis_layer name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "PUBLIC;PRIVATE")
  file(GLOB_RECURSE sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/trellis/${name}/*.cpp)
  list(FILTER sources EXCLUDE REGEX "${TRELLIS_NOT_IN_LAYERS}")
  add_library(trellis_${name} STATIC ${sources})
  target_include_directories(trellis_${name} PUBLIC ${PROJECT_SOURCE_DIR}/src)
  list(TRANSFORM arg_PUBLIC PREPEND trellis_)
  list(TRANSFORM arg_PRIVATE PREPEND trellis_)
  target_link_libraries(trellis_${name} PUBLIC ${arg_PUBLIC} PRIVATE ${arg_PRIVATE})
endfunction()

# Sources no layer builds: the binary's main, and the MPI backend when it is off.
set(TRELLIS_NOT_IN_LAYERS "src/trellis/cli/main\\.cpp$")
if(NOT TRELLIS_WITH_MPI)
  string(APPEND TRELLIS_NOT_IN_LAYERS "|src/trellis/comm/mpi_.*\\.cpp$")
endif()

trellis_layer(core)
trellis_layer(kernels PUBLIC core)
trellis_layer(comm PRIVATE core)
trellis_layer(tensor_parallel PUBLIC kernels PRIVATE core comm)
trellis_layer(model PUBLIC core kernels tensor_parallel)
trellis_layer(optim PUBLIC model PRIVATE core)
trellis_layer(data PUBLIC core PRIVATE model)
trellis_layer(io PUBLIC model PRIVATE core data)
trellis_layer(eval PRIVATE core)
trellis_layer(parallel PUBLIC core comm tensor_parallel model PRIVATE kernels)
trellis_layer(plan PUBLIC core model parallel PRIVATE kernels comm tensor_parallel optim)
trellis_layer(train PUBLIC comm model optim data io parallel
                    PRIVATE core kernels tensor_parallel eval plan)
trellis_layer(cli PUBLIC model io PRIVATE core kernels comm data eval plan train)

# Outside libraries, each linked by the folders whose files include it. Every folder compiles with
# OpenMP, as when src/ was one library: a `#pragma omp` in a header compiled without the flag
# would run serially without a word.
target_link_libraries(trellis_core PUBLIC fmt::fmt OpenMP::OpenMP_CXX)
target_link_libraries(trellis_kernels PRIVATE trellis_blas)
target_link_libraries(trellis_model PUBLIC nlohmann_json::nlohmann_json)
target_link_libraries(trellis_data PRIVATE nlohmann_json::nlohmann_json PkgConfig::PCRE2
                      PkgConfig::SENTENCEPIECE ZLIB::ZLIB)
target_link_libraries(trellis_io PUBLIC nlohmann_json::nlohmann_json)
target_link_libraries(trellis_eval PUBLIC nlohmann_json::nlohmann_json)
target_link_libraries(trellis_plan PUBLIC nlohmann_json::nlohmann_json)
target_link_libraries(trellis_train PUBLIC nlohmann_json::nlohmann_json PRIVATE PkgConfig::TOMLPP)
target_link_libraries(trellis_cli PUBLIC CLI11::CLI11 PRIVATE PkgConfig::TOMLPP)
if(TRELLIS_WITH_MPI)
  target_link_libraries(trellis_comm PRIVATE MPI::MPI_C)
  # Public: the tests and benchmarks of the MPI backend ask for it too.
  target_compile_definitions(trellis_comm PUBLIC TRELLIS_WITH_MPI=1)
endif()

# What the binary, the tests and the benchmarks link: every layer, and the outside libraries that
# tests and benchmarks call directly.
add_library(trellis_lib INTERFACE)
target_link_libraries(trellis_lib INTERFACE trellis_cli trellis_train trellis_plan trellis_parallel
                      trellis_eval trellis_io trellis_data trellis_optim trellis_model
                      trellis_tensor_parallel trellis_comm trellis_kernels trellis_core
                      trellis_blas ZLIB::ZLIB)
if(TRELLIS_WITH_MPI)
  target_link_libraries(trellis_lib INTERFACE MPI::MPI_C)
endif()
