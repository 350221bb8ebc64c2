# Everything a fresh machine needs: Python 3.11+, and Java 17 with Maven (the Spark connector,
# and the Apache Pulsar broker the suite also runs against).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The broker's classpath, resolved once by Maven (jars cached in ~/.m2); also the stamp.
PULSAR_CLASSPATH := apache-pulsar/classpath.txt
# Apache Pulsar's own pulsar-admin (pulsar-client-tools), which the suite drives Magnetar with.
PULSAR_ADMIN_CLASSPATH := apache-pulsar/pulsar-admin/classpath.txt

# The Spark connector's native reader (Rust, no crates: seconds to build, nothing to download).
# Optional: without cargo, or when the build fails, the connector reads through the Python
# client and says so once. Moved into place, so that running readers keep the file they loaded.
NATIVE_READER := magnetar/spark_connector/_native_reader.so
NATIVE_SOURCES := native/spark_reader/Cargo.toml $(wildcard native/spark_reader/src/*.rs)

# JavaScript functions' answers from V8 (C, see native/v8_answers): optional like the reader;
# without a C compiler, calls into V8 are answered through mini-racer's Python callback.
V8_ANSWERS := magnetar/instance/javascript/_v8_answers.so

# Output sends through pulsar-client's C API (C, see native/output_sends): optional too; without
# a C compiler, the instance sends through pulsar-client's Python producer (slower).
OUTPUT_SENDS := magnetar/instance/_output_sends.so

# Magnetar's own modules compiled once (the editable install leaves them as source): where
# PYTHONDONTWRITEBYTECODE is set, as in many CI and container images, every worker, CLI and
# localrun process would otherwise compile them again, about 0.4 s of CPU each on 2 cores.
BYTECODE := $(VENV)/.bytecode

.PHONY: install apache-pulsar browser nftables guest-vm demo test test-docker lint docs bench clean

install: $(STAMP) $(PULSAR_CLASSPATH) $(PULSAR_ADMIN_CLASSPATH) $(NATIVE_READER) $(V8_ANSWERS) \
	$(OUTPUT_SENDS) $(BYTECODE) nftables

apache-pulsar: $(PULSAR_CLASSPATH) $(PULSAR_ADMIN_CLASSPATH)

# Each pom's runtime classpath, written beside it.
$(PULSAR_CLASSPATH) $(PULSAR_ADMIN_CLASSPATH): %/classpath.txt: %/pom.xml
	@command -v java >/dev/null || { echo "Apache Pulsar (for the tests) needs Java 17:" \
		"install a JDK (apt-get install openjdk-17-jdk-headless) and run make again"; exit 1; }
	@command -v mvn >/dev/null || { echo "Fetching Apache Pulsar (for the tests) needs Maven:" \
		"install it (apt-get install maven) and run make again"; exit 1; }
	cd $* && mvn -q -B dependency:build-classpath -Dmdep.includeScope=runtime \
		-Dmdep.outputFile=classpath.tmp
	mv $*/classpath.tmp $@

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "Magnetar needs Python 3.11 or newer (found: $$($(PYTHON) --version))"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

$(BYTECODE): $(STAMP) $(shell find magnetar -name '*.py')
	$(BIN)/python -m compileall -q magnetar
	touch $@

$(NATIVE_READER): $(NATIVE_SOURCES)
	@if ! command -v cargo >/dev/null; then \
		echo "No cargo: the Spark connector will read through the Python client (install" \
			"Rust from https://rustup.rs and run make again for its native reader)"; \
	elif cargo build --release --quiet --manifest-path native/spark_reader/Cargo.toml \
			--target-dir build/native; then \
		cp "$$(ls build/native/release/libmagnetar_spark_reader.so \
			build/native/release/libmagnetar_spark_reader.dylib 2>/dev/null | head -1)" $@.tmp \
		&& mv $@.tmp $@; \
	else \
		echo "The native reader did not build: the Spark connector will read through the" \
			"Python client"; \
	fi

$(V8_ANSWERS): native/v8_answers/v8_answers.c
	@if ! command -v cc >/dev/null; then \
		echo "No C compiler: JavaScript functions' calls into V8 will be answered through" \
			"Python (install gcc and run make again for the native answers)"; \
	elif cc -O2 -Wall -shared -fPIC -o $@.tmp $< -lpthread; then \
		mv $@.tmp $@; \
	else \
		echo "The native V8 answers did not build: calls into V8 will be answered through" \
			"Python"; \
	fi

# Against the venv's Python headers: an extension module, unlike the V8 answers.
$(OUTPUT_SENDS): native/output_sends/output_sends.c $(STAMP)
	@if ! command -v cc >/dev/null; then \
		echo "No C compiler: instances will send through pulsar-client's Python producer" \
			"(install gcc and run make again for the native sends)"; \
	elif cc -O2 -Wall -shared -fPIC -o $@.tmp $< \
			-I"$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" \
			-ldl; then \
		mv $@.tmp $@; \
	else \
		echo "The native sends did not build: instances will send through pulsar-client's" \
			"Python producer"; \
	fi

# The web console's tests drive Debian's chromium through Playwright (which is given the system
# browser: it downloads none). Installed when make runs as root with apt; otherwise they skip.
browser:
	@if command -v chromium >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	else \
		echo "No chromium, and not root with apt-get to install it: the console's browser" \
			"tests will be skipped (install it: apt-get install chromium)"; \
	fi

# A root worker holds what isolated instances reach on the network with nftables
# (magnetar/worker/instance_network.py): nft is installed when make runs as root with apt;
# without it such a worker logs that instances are not held, and those tests skip.
nftables:
	@if command -v nft >/dev/null || [ -x /usr/sbin/nft ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables; \
	else \
		echo "No nft, and not root with apt-get to install it: a root worker's instances" \
			"will reach this host's services (install it: apt-get install nftables)"; \
	fi

# The cgroup v2 tests boot a Linux guest (tests/guest_vm.py): Debian's QEMU and static busybox,
# installed when make runs as root with apt, and Debian's kernel, of which the image and the
# modules the guest loads are unpacked into build/guest-kernel. Without them those tests skip.
GUEST_KERNEL := build/guest-kernel
GUEST_MODULES := drivers/virtio net/9p fs/9p fs/netfs fs/fscache
guest-vm:
	@if command -v qemu-system-x86_64 >/dev/null && [ -x /bin/busybox ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			--no-install-recommends qemu-system-x86 busybox-static; \
	else \
		echo "No QEMU, and not root with apt-get to install it: the cgroup v2 tests will be" \
			"skipped (install it: apt-get install qemu-system-x86 busybox-static)"; \
	fi
	@if [ -d $(GUEST_KERNEL)/boot ] || ! command -v apt-get >/dev/null; then :; else \
		package=$$(apt-cache depends linux-image-amd64 | sed -n 's/.*Depends: //p' | head -1); \
		rm -rf $(GUEST_KERNEL).tmp && mkdir -p $(GUEST_KERNEL).tmp && \
		(cd $(GUEST_KERNEL).tmp && apt-get download -qq "$$package" 2>/dev/null) && \
		dpkg-deb --fsys-tarfile $(GUEST_KERNEL).tmp/"$$package"_*.deb | tar -x -C $(GUEST_KERNEL).tmp \
			--wildcards './boot/vmlinuz-*' \
			$(foreach folder,$(GUEST_MODULES),'./lib/modules/*/kernel/$(folder)/*') && \
		rm $(GUEST_KERNEL).tmp/*.deb && mv $(GUEST_KERNEL).tmp $(GUEST_KERNEL) || \
		echo "Debian's kernel could not be fetched: the cgroup v2 tests will be skipped"; \
	fi

demo: install
	$(BIN)/python scripts/demo.py

test: install browser guest-vm
	$(BIN)/python -m pytest

# With a Docker engine: docker compose up (tests/docker), and the Apache Pulsar suites against
# the apachepulsar/pulsar image instead of the standalone Maven fetched; fails if no engine answers.
test-docker: install
	MAGNETAR_REQUIRE_DOCKER=1 $(BIN)/python -m pytest tests/docker -m docker
	$(BIN)/python -m pytest --brokers apache --apache-pulsar docker

lint: install
	$(BIN)/ruff check magnetar tests bench scripts
	$(BIN)/ruff format --check magnetar tests bench scripts
	$(BIN)/mypy

# The documentation site, into site/; strict, so a broken link fails (tests/test_docs.py too).
docs: install
	$(BIN)/mkdocs build --strict

# Every benchmark; each writes JSON under bench/results and prints its comparison.
BENCHES := instance_throughput cluster_latency metadata_replay scheduler_scale state_throughput \
	state_materialize state_query js_throughput spark_read_throughput balanced_failover \
	window_throughput async_throughput dependency_start broker_heal chaos latency abuse \
	shared_prefetch

bench: install
	@for b in $(BENCHES); do echo "== bench/$$b.py"; $(BIN)/python bench/$$b.py || exit 1; done

clean:
	rm -rf $(VENV) build site bench/results .pytest_cache .mypy_cache .ruff_cache .hypothesis \
		$(PULSAR_CLASSPATH) $(PULSAR_ADMIN_CLASSPATH) $(NATIVE_READER) $(V8_ANSWERS) $(OUTPUT_SENDS)
