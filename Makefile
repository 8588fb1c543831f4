# kvthrottle: see README.md.
GO        ?= go
BIN       := bin/kvthrottle
CONFIG    ?= config.example.toml
FUZZTIME  ?= 30s
VERSION   := $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X main.version=$(VERSION)
# staticcheck 2026.2.2; built from the Go module proxy by `go run` (cached
# after the first run), so a fresh machine needs nothing installed.
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: all build run fleet test test-passes test-race test-proxy-bins test-proxy-race-bin test-proxy-norace-bin test-kvthrottle-bin test-race-proxy-serial test-race-proxy-serial2 test-race-proxy-serial3 test-race-proxy-parallel test-race-packages test-fleet-failover test-norace test-norace-proxy test-upstream-tls test-docs deps vet bench fuzz clean

all: build

build:
	$(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/kvthrottle

deps:
	@scripts/deps.sh

## run: build, make sure memcached runs on 127.0.0.1:11211 (one started
## here runs unprivileged and stops with the proxy), run the proxy.
run: build
	@scripts/deps.sh --server-only
	@scripts/run.sh $(BIN) $(CONFIG)

## fleet: build, then run a fleet on this machine in the foreground (Ctrl-C
## stops it): redis-server on 127.0.0.1:6390 (no persistence), memcached on
## 127.0.0.1:11290, and the three instances of deploy/fleet/ on
## 127.0.0.1:11391..11393 sharing their limits through that Redis.
fleet: build
	@scripts/deps.sh --server-only
	@scripts/fleet.sh $(BIN)

## test: install what the tests need while the proxy's test binaries
## build (apt-get waits on the network and the disk, the compiler on the
## CPU: on a fresh machine the two overlap), then at once (make -j: the suite
## mostly waits on sockets and timers, so its parts overlap well on two
## cores):
##   vet: gofmt, go vet and staticcheck;
##   test-race: every test with -race (the proxy's serial tests in three
##     processes, its parallel ones in a fourth, the other packages in a
##     fifth) but the documentation's checks;
##   test-docs: the documentation's checks (internal/docscheck), without
##     -race;
##   test-norace: the tests of NORACE_PKGS that skip or shorten under
##     -race (NORACE_TESTS), again without it, in full;
##   test-norace-proxy: without -race, the proxy's fair-sharing and fleet
##     rate tests over their full windows (under -race they measure
##     shorter ones: the race detector's time grows with every fake step);
##   test-upstream-tls: with TLS between the proxy and memcached
##     (memcached -Z) and without -race, the proxy tests whose traffic TLS
##     changes: the upstream wire (framing across records, partial reads,
##     reconnects, failures, pipelines, large values, one real client's
##     quiet batches), not the client's protocol nor the throttle's
##     arithmetic;
##   test-fleet-failover: the fleet tests against real Redis Cluster and
##     Sentinel processes (the instances on fake clocks).
## Then, alone and without the race detector (it distorts latencies), the
## TLS handshake flood (proxy/tlsflood_test.go).
## TESTJSON=DIR: each pass writes `go test -json` to DIR/PASS.json instead
## of its usual output, and its wall, user and system seconds to
## DIR/PASS.time (scripts/flake.sh, scripts/testtimes.sh).
FLEET_FAILOVER_TESTS := ^TestFleet(ClusterFailover|SentinelFailover|ClusterDown|SlotMigration|ClusterDemotedPrimary)$$
UPSTREAM_TLS_TESTS := ^(TestConcurrentClientsNoCrossTalk|TestPipelinedModel.*|TestAbandonedReadsStop|TestTwoServersEjection|TestChaos.*|TestTextUpstreamFailureFraming|TestReloadUnderLoad|TestDisconnectInFlight|TestTimedOutCommandMayHaveRun|TestUpstreamKilledUnderLoad|TestGetKQBatch|TestQuietAndLocalOrdering|TestPipelinedReadsNotCapped|TestPipelinedLargeGetsHoldTheHardLimit|TestLibmemcachedSASLClients)$$
# The packages with tests that skip or shorten under -race
# (testmc.SkipUnderRace, testmc.UnderRace: simulations on one goroutine at a
# time, bcrypt at its real cost); internal/docscheck checks the list.
NORACE_PKGS := ./bucketcfg ./cmd/kvthrottle ./fleet ./internal/textdiff ./throttle
# Of those packages, the tests that skip or shorten under -race: the pass
# without it runs these alone (the others ran in full under -race).
NORACE_TESTS := ^(TestLoadValidFixture|TestMemcachedAgainstItself|TestHashPassword|TestHashPasswordAndVersion|TestFair.*|TestSim.*|TestLeaseAccuracy|TestFIFOSimulated|TestHardLimitMixedSizes|TestBlockingReachesHardLimitWithMixedSizes|TestShareWeight|TestFIFOConcurrentForgivenessForgivesOne|TestResetDuringAppendLeavesNoStraySlot)$$
# The proxy tests that skip or shorten under -race and are not in
# UPSTREAM_TLS_TESTS: test-norace-proxy runs them in full.
PROXY_NORACE_TESTS := ^(TestFair(FreePool|SeedExamples|Newcomer)|TestFleet(HardLimitFollowsTheLoad|CapacityAndReservation|StoreLoss|FairPool|LoadThatMoves|LoadShapes|FastMovesWithinTenPercent)|TestLargeReadsDoNotHoldTheReservedNeighbour|TestPipelinedSmallGetsReachTheHardLimit|TestAdmitDisplacesOldestSingleLogin|TestAuthFloodSparesKnownUsersAndTenants|TestMemcaslapTextThroughProxy|TestTextDifferential)$$
# TESTBUILD: the build flags of make test's compiles. -trimpath keeps the
# clone's directory out of the build cache's keys, so a fresh clone (CI's
# every run) reuses what an earlier clone on the machine compiled of the
# same sources, instead of compiling every package of the module again,
# with and without -race.
TESTBUILD := -trimpath
# timed NAME: with TESTJSON (and /usr/bin/time), the pass's wall, user and
# system seconds, its children's included, to $(TESTJSON)/NAME.time
# (scripts/testtimes.sh prints them).
timed = $(if $(TESTJSON),$(if $(wildcard /usr/bin/time),/usr/bin/time -f '%e %U %S' -o $(abspath $(TESTJSON))/$(1).time))
# gotest NAME,ARGS: go test ARGS, or with TESTJSON its -json to $(TESTJSON)/NAME.json.
gotest = $(if $(TESTJSON),mkdir -p $(TESTJSON) && )$(call timed,$(1)) $(GO) test $(2)$(if $(TESTJSON), -json > $(TESTJSON)/$(1).json)
# The proxy's race pass runs in four processes at once, from one test
# binary (PROXY_RACE_BIN): the tests that call t.Parallel() first thing
# (PROXY_PARALLEL), and the others, which Go runs one at a time, split by
# name in three (PROXY_SERIAL_A: names from A to F, PROXY_SERIAL_B: G to
# R, the rest). The serial ones run one at a time within their process, so
# a test hook (a package variable) they set reaches no other test; in one
# process they were the longest pass (300 s, much of it waiting on
# sockets, children, memcached and penalties, not on the CPU), in two the
# longest still (each about 270 s of their tests' time in make test).
PROXY_PARALLEL := $(shell scripts/paralleltests.sh proxy)
PROXY_SERIAL_A := ^(Test|Fuzz|Example)[A-F]
PROXY_SERIAL_B := ^(Test|Fuzz|Example)[G-R]
PROXY_RACE_BIN := $(CURDIR)/bin/test/proxy.race.test
# The proxy's test binary without -race: the upstream-TLS pass, the full
# rate tests and the TLS handshake flood run it (one build, not three).
PROXY_BIN := $(CURDIR)/bin/test/proxy.test
# The kvthrottle binary the tests that run it as a process use
# (testmc.KvthrottleBin), built with the test binaries.
export KVTHROTTLE_TEST_BIN := $(CURDIR)/bin/test/kvthrottle
# runbin NAME,BIN,ARGS[,ENV]: the proxy test binary BIN with ARGS in ./proxy
# (as go test runs it), its environment with ENV (VAR=value ...), or with
# TESTJSON through test2json to $(TESTJSON)/NAME.json.
runbin = $(if $(TESTJSON),mkdir -p $(TESTJSON) && )cd proxy && $(4) $(call timed,$(1)) $(if $(TESTJSON),$(GO) tool test2json -p github.com/kvthrottle/kvthrottle/proxy -t $(2) -test.v=test2json,$(2)) -test.count=1 -test.parallel=4 -test.timeout=20m $(3)$(if $(TESTJSON), > $(abspath $(TESTJSON))/$(1).json)

test:
	@$(MAKE) --no-print-directory -j2 deps test-proxy-bins
	@$(MAKE) --no-print-directory WITH_VET=vet PROXY_BINS_BUILT=1 test-passes

## test-passes: make test without installing anything or vet (what
## scripts/flake.sh runs). Every pass starts at once: -j12 is more than
## their eleven jobs (a pass left waiting for a slot ends last).
test-passes:
	@$(MAKE) --no-print-directory test-proxy-bins
	@$(MAKE) --no-print-directory -j12 PROXY_BINS_BUILT=1 $(WITH_VET) test-race test-norace test-norace-proxy test-upstream-tls test-fleet-failover test-docs
	$(call runbin,tls-flood,$(PROXY_BIN),-test.run '^TestTLSHandshakeFlood$$')

## test-race: every test with -race but the failovers and the
## documentation's checks: the proxy's in four processes (see
## PROXY_PARALLEL), every other package's in a fifth.
test-race: test-race-proxy-serial test-race-proxy-serial2 test-race-proxy-serial3 test-race-proxy-parallel test-race-packages

# test-passes builds the proxy's two test binaries and KVTHROTTLE_TEST_BIN
# before anything else, at once: the passes that run the proxy's are the
# longest, so the suite ends soonest when they start first, and two passes
# building one binary at once would each compile it (PROXY_BINS_BUILT=1
# then skips this).
test-proxy-bins:
	@mkdir -p $(dir $(PROXY_RACE_BIN))
	$(if $(PROXY_BINS_BUILT),@true,@$(MAKE) --no-print-directory -j3 test-proxy-race-bin test-proxy-norace-bin test-kvthrottle-bin)

test-kvthrottle-bin:
	$(GO) build $(TESTBUILD) -o $(KVTHROTTLE_TEST_BIN) ./cmd/kvthrottle

test-proxy-race-bin:
	$(GO) test $(TESTBUILD) -race -c -o $(PROXY_RACE_BIN) ./proxy

test-proxy-norace-bin:
	$(GO) test $(TESTBUILD) -c -o $(PROXY_BIN) ./proxy

test-race-proxy-serial: test-proxy-bins
	$(call runbin,race-proxy-serial,$(PROXY_RACE_BIN),-test.run '$(PROXY_SERIAL_A)' -test.skip '$(FLEET_FAILOVER_TESTS)|$(PROXY_PARALLEL)')

test-race-proxy-serial2: test-proxy-bins
	$(call runbin,race-proxy-serial2,$(PROXY_RACE_BIN),-test.run '$(PROXY_SERIAL_B)' -test.skip '$(FLEET_FAILOVER_TESTS)|$(PROXY_PARALLEL)')

test-race-proxy-serial3: test-proxy-bins
	$(call runbin,race-proxy-serial3,$(PROXY_RACE_BIN),-test.skip '$(FLEET_FAILOVER_TESTS)|$(PROXY_PARALLEL)|$(PROXY_SERIAL_A)|$(PROXY_SERIAL_B)')

test-race-proxy-parallel: test-proxy-bins
	$(call runbin,race-proxy-parallel,$(PROXY_RACE_BIN),-test.run '$(PROXY_PARALLEL)' -test.skip '$(FLEET_FAILOVER_TESTS)')

# The real Redis Cluster and Sentinel failovers, and the other ways the
# store moves (proxy/fleet_cluster_replies_test.go): mostly waiting on Redis,
# so they overlap the other passes, and each other (t.Parallel: each test
# starts Redis processes of its own, on ports claimed across the suite; one
# after another they were the longest pass, 303 s); the instances run on
# fake clocks and the figures are asserted exactly (the real-clock ones
# are BenchmarkFleetFailover's). Without -race: under it they cost half
# as much CPU again (ClusterDown alone: 12.4 s against 8.2). The store's
# failures reach the instances under -race in the race pass:
# TestFleetDemotedPrimary (a primary demoted under them, READONLY, a new
# connection), TestFleetStartWhileStoreDown, TestFleetFlushes and
# TestFleetMetricsReloadAndFlush (a store stopped).
test-fleet-failover: test-proxy-bins
	$(call runbin,fleet-failover,$(PROXY_BIN),-test.run '$(FLEET_FAILOVER_TESTS)')

test-race-packages: test-proxy-bins
	$(call gotest,race,$(TESTBUILD) -race -count=1 -timeout 20m $$($(GO) list ./... | grep -v '/proxy$$\|/internal/docscheck$$'))

# The documentation's checks (internal/docscheck) run without -race: they
# read files and run commands, none of the product's concurrency.
test-docs:
	$(call gotest,docs,$(TESTBUILD) -count=1 -timeout 10m ./internal/docscheck)

test-norace: test-proxy-bins
	$(call gotest,norace,$(TESTBUILD) -count=1 -timeout 10m -run '$(NORACE_TESTS)' $(NORACE_PKGS))

test-norace-proxy: test-proxy-bins
	$(call runbin,norace-proxy,$(PROXY_BIN),-test.run '$(PROXY_NORACE_TESTS)')

test-upstream-tls: test-proxy-bins
	$(call runbin,upstream-tls,$(PROXY_BIN),-test.run '$(UPSTREAM_TLS_TESTS)',KVTHROTTLE_TEST_UPSTREAM_TLS=1)

## vet: gofmt, go vet and staticcheck (its default checks).
vet:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet $(TESTBUILD) ./...
	$(GO) run $(STATICCHECK) ./...

## bench: the benchmarks of DESIGN.md section 9 and issue 15's TLS ones
## (section 6), as a table (also in bench-results.md); BENCHFLAGS=-quick for
## a short run, BENCHFLAGS="-sections 6" for TLS alone, and
## BENCHFLAGS="-before-bin PATH" to measure an earlier build beside this one
## in sections 1 and 2 (before and after from one run).
bench: deps build
	$(GO) run ./internal/benchtable $(BENCHFLAGS)

## fuzz: run every fuzz target for FUZZTIME each. New interesting inputs
## are minimised for at most 1s (the default, 60s each, leaves the fuzzer
## executing nothing for most of a short run).
fuzz:
	@for pkg in $$($(GO) list ./...); do \
	  for f in $$($(GO) test -list 'Fuzz.*' $$pkg | grep '^Fuzz'); do \
	    echo "== $$pkg $$f"; $(GO) test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 1s $$pkg || exit 1; \
	  done; \
	done

clean:
	rm -rf bin
