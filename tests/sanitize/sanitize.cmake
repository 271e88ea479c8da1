# TRELLIS_SANITIZE: every executable links options.cpp, which gives ASan, LSan and UBSan their
# options and the checked-in suppression files (third-party libraries only), so the sanitized
# binaries behave the same under ctest, mpirun or by hand. ctest label: "sanitize" (the unit tests
# and tests/cli).
add_library(trellis_sanitize_options OBJECT ${CMAKE_SOURCE_DIR}/tests/sanitize/options.cpp)
target_compile_definitions(trellis_sanitize_options
                           PRIVATE TRELLIS_SANITIZE_DIR="${CMAKE_SOURCE_DIR}/tests/sanitize")
link_libraries(trellis_sanitize_options)
set(TRELLIS_SANITIZE_LABEL LABELS sanitize)
