# Script tests: every tests/{reference,cli,parallel}/test_*.py runs under Debian's python3 (the one
# python3-torch installs into) with the trellis binary and a scratch directory in the environment.
find_program(TRELLIS_SYSTEM_PYTHON NAMES python3 PATHS /usr/bin NO_DEFAULT_PATH)
file(GLOB TRELLIS_SCRIPT_TESTS CONFIGURE_DEPENDS
     ${CMAKE_SOURCE_DIR}/tests/reference/test_*.py
     ${CMAKE_SOURCE_DIR}/tests/cli/test_*.py
     ${CMAKE_SOURCE_DIR}/tests/parallel/test_*.py)
foreach(script ${TRELLIS_SCRIPT_TESTS})
  get_filename_component(name ${script} NAME_WE)
  get_filename_component(group ${script} DIRECTORY)
  get_filename_component(group ${group} NAME)
  add_test(NAME ${group}.${name} COMMAND ${TRELLIS_SYSTEM_PYTHON} ${script})
  set_tests_properties(${group}.${name} PROPERTIES TIMEOUT 900 ENVIRONMENT
    "TRELLIS_BIN=$<TARGET_FILE:trellis>;TRELLIS_TMP=${CMAKE_BINARY_DIR}/testtmp/${group}.${name};TRELLIS_SOURCE=${CMAKE_SOURCE_DIR};PYTHONPATH=${CMAKE_SOURCE_DIR}/tests;${TRELLIS_TEST_ENV}")
  # One network-namespace cluster at a time: test_calibrate_nodes times its links, and a second
  # cluster's job on the same 2 cores would be in those times.
  file(READ ${script} source)
  # (a SlurmCluster is a NetnsCluster with Slurm's daemons in it)
  string(REGEX MATCH "(Netns|Slurm)Cluster\\(" uses_netns "${source}")
  if(uses_netns)
    set_tests_properties(${group}.${name} PROPERTIES RESOURCE_LOCK netns_cluster)
  endif()
  # Under TRELLIS_SANITIZE the CLI tests run the sanitized binary (label "sanitize"); the
  # reference and multi-rank tests run in the normal build only, and so do test_big_corpus and
  # test_streaming_prepare (their bounds are the release binary's peak RSS, which ASan's shadow
  # memory and quarantine inflate; test_prepare_tasks and test_shards_v2 run prepare under ASan)
  # and test_launch_chaos (96 s under ASan on 2 cores, near the whole label's 108 s of wall
  # time; test_launch runs the supervisor's restarts under ASan) and test_plan (57 s
  # under ASan; the planner's enumeration, cost and memory model and machine files run under ASan
  # in the unit tests Planner* and ValidateRun*) and test_run_bench_peer (it runs no trellis
  # binary). Times with TRELLIS_TEST_ENV's passive OpenMP waits (bench/RESULTS.md, "CI time:
  # OpenMP threads that spin").
  set(not_sanitized test_big_corpus test_streaming_prepare test_launch_chaos test_plan
      test_run_bench_peer)
  if(TRELLIS_SANITIZE AND group STREQUAL "cli" AND NOT name IN_LIST not_sanitized)
    set_tests_properties(${group}.${name} PROPERTIES LABELS sanitize)
  endif()
endforeach()

# The vectorised exp/tanh behind softmax and cross-entropy: libm's double value rounded to the
# nearest float (tanh's near-ties within 5e-5 ulp of halfway excepted) over a sweep of float bit
# patterns, special values exact; GELU's float-lane exp within 2 ulps.
add_test(NAME kernels.simd_math_check COMMAND simd_math_check)
set_tests_properties(kernels.simd_math_check PROPERTIES TIMEOUT 120 ENVIRONMENT ${TRELLIS_TEST_ENV})

# The bf16 kernels again as a CPU without AVX-512 runs them (the emulated GEMM), on any machine.
add_test(NAME kernels.bf16_on_avx2 COMMAND trellis_tests --gtest_filter=Bf16.*)
set_tests_properties(kernels.bf16_on_avx2 PROPERTIES TIMEOUT 120 ENVIRONMENT
                     "TRELLIS_ISA=avx2;${TRELLIS_TEST_ENV}")
