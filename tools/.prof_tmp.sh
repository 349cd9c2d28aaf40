set -u
rm -rf build-carry && mkdir -p build-carry && tar -C build-carry -xJf build-carry.tar.xz
timeout 120 build-carry/tests/sfmoe_gpu_tests --gtest_filter='CudaQuantize.TensorSinglePass*:CudaQuantize.EveryRecipe*' 2>&1 | grep -E '^\[  (PASSED|FAILED)|FAILED|Failure' | head -10
SFMOE_BENCH_FILTER="fp8 tensor" timeout 200 build-carry/bench/sfmoe_bench_quantize 2>&1 | tail -24
