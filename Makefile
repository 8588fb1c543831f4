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

.PHONY: all build run fleet test test-passes test-race test-norace test-upstream-tls deps vet bench fuzz clean

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

## test: install what the tests need, then at once (make -j: the suite
## mostly waits on sockets and timers, so its parts overlap well on two
## cores): vet, gofmt and staticcheck (vet); every test with -race
## (test-race, ./proxy first: it is the longest); the tests that skip or
## shorten under -race again without it, in full (test-norace); and, with
## TLS between the proxy and memcached (memcached -Z) and without -race,
## the proxy tests whose traffic TLS changes (test-upstream-tls): the
## upstream wire (framing across records, partial reads, reconnects,
## pipelines, large values, real clients), not the throttle's arithmetic.
## Then, alone: the fleet tests that bound rates on the real clock (each
## second within +10% of a fleet limit: they measure the machine as well
## while other tests share its cores), and, without the race detector (it
## distorts latencies), the TLS handshake flood (proxy/tlsflood_test.go).
## TESTJSON=DIR: each pass writes `go test -json` to DIR/PASS.json instead
## of its usual output (scripts/flake.sh, scripts/testtimes.sh).
FLEET_RATE_TESTS := ^TestFleet(HardLimitFollowsTheLoad|CapacityAndReservation|StoreLoss|FairPool)$$
UPSTREAM_TLS_TESTS := ^(TestMemcapable|TestGetKQBatch|TestConcurrentClientsNoCrossTalk|TestDisconnectInFlight|TestInvalidFrames|TestQuietAndLocalOrdering|TestFlexibleFramingRequest|TestMaxFrameBytes|TestMemcaslapTextThroughProxy|TestMemccpMemccatText|TestTextTranslationMatchesMemcached|TestTextDifferential|TestMeta.*|TestNamespacedKeyTooLongSwallowsData|TestPipelinedModel.*|TestChaos.*|TestUpstreamKilledUnderLoad|TestTwoServersEjection|TestReloadUnderLoad|TestTimedOutCommandMayHaveRun|TestAbandonedReadsStop|TestClosedClientCostsNeighboursNothing|TestNonReaderDoesNotStallNeighbours|TestLargeReaderNotStarvedBySmallReaders|TestPipelinedReadsNotCapped|TestPipelinedLargeGetsHoldTheHardLimit|TestUnitsCountedWhenAnswered|TestPipelinedSetThenStat|TestLibmemcachedSASLClients|TestMemjsSASLClient|TestGomemcacheSuite|TestPymemcacheThroughProxy|TestBucketsDoNotQueueBehindEachOther|TestIdleBucketConnectionsClose|TestCrossProto.*|TestTextUpstreamFailureFraming)$$
# The packages with tests that skip or shorten under -race
# (testmc.SkipUnderRace, testmc.UnderRace: simulations on one goroutine at a
# time, bcrypt at its real cost); internal/docscheck checks the list.
NORACE_PKGS := ./bucketcfg ./cmd/kvthrottle ./fleet ./throttle
# gotest NAME,ARGS: go test ARGS, or with TESTJSON its -json to $(TESTJSON)/NAME.json.
gotest = $(GO) test $(2)$(if $(TESTJSON), -json > $(TESTJSON)/$(1).json)

test: deps
	@$(MAKE) --no-print-directory WITH_VET=vet test-passes

## test-passes: make test without installing anything or vet (what
## scripts/flake.sh runs).
test-passes:
	@$(if $(TESTJSON),mkdir -p $(TESTJSON))
	@$(MAKE) --no-print-directory -j4 $(WITH_VET) test-race test-norace test-upstream-tls
	$(call gotest,fleet-rate,-race -count=1 -timeout 10m -run '$(FLEET_RATE_TESTS)' ./proxy)
	$(call gotest,tls-flood,-count=1 -timeout 5m -run '^TestTLSHandshakeFlood$$' ./proxy)

test-race:
	$(call gotest,race,-race -count=1 -parallel 4 -timeout 20m -skip '$(FLEET_RATE_TESTS)' ./proxy $$($(GO) list ./... | grep -v '/proxy$$'))

test-norace:
	$(call gotest,norace,-count=1 -timeout 10m $(NORACE_PKGS))

test-upstream-tls:
	KVTHROTTLE_TEST_UPSTREAM_TLS=1 $(call gotest,upstream-tls,-count=1 -parallel 4 -timeout 10m -run '$(UPSTREAM_TLS_TESTS)' ./proxy)

## vet: gofmt, go vet and staticcheck (its default checks).
vet:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
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
