# The two commands a newcomer needs (README.md): `make demo` and `make test`.
PRESET ?= release
BUILD_DIR := build/$(PRESET)

.PHONY: deps configure build test test-tsan test-asan check-thread-safety demo bench clean

deps:
	bash scripts/install-deps.sh

configure: deps
	cmake --preset $(PRESET)

build: configure
	cmake --build --preset $(PRESET)

# The whole test suite.
test: build
	ctest --preset $(PRESET)

# Tests labelled `concurrency`, under ThreadSanitizer.
test-tsan: deps
	cmake --preset tsan
	cmake --build --preset tsan --target folio_concurrency_tests
	ctest --preset tsan

# The whole suite under AddressSanitizer + UndefinedBehaviorSanitizer.
test-asan: deps
	cmake --preset asan
	cmake --build --preset asan
	ctest --preset asan

# clang's -Wthread-safety over src/ and apps/ (no tests): a lock the annotations say is needed
# and is not held fails the build.
check-thread-safety: deps
	cmake --preset thread-safety
	cmake --build --preset thread-safety

demo: build
	bash scripts/demo.sh $(BUILD_DIR)

clean:
	rm -rf build

# Every Google Benchmark binary (not part of the test suite; figures go in the issue notes).
bench: build
	for binary in $$(find $(BUILD_DIR)/bench -type f -executable -name '*bench*' | sort); do \
	  echo "== $$binary"; $$binary --benchmark_min_time=0.05 || exit 1; done
