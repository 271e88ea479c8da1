# GEMM backend: oneDNN's dnnl_sgemm. Measured on this AVX-512 machine (bench/gemm_paths.cpp,
# bench/RESULTS.md) it matches OpenBLAS's best kernels without relying on OPENBLAS_CORETYPE,
# which this environment pins to the slower Haswell path.
find_package(dnnl CONFIG REQUIRED)
add_library(trellis_blas INTERFACE)
target_link_libraries(trellis_blas INTERFACE DNNL::dnnl)
