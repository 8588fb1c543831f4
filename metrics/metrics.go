// Package metrics exposes kvthrottle's Prometheus metrics (DESIGN.md section 7)
// and its small HTTP side server (/metrics, /healthz, /readyz).
//
// The hot path pays (almost) nothing: counters and gauges are not updated here
// but read from a [Source] when Prometheus scrapes, by a custom collector.
// Only the two histograms (throttle wait time and upstream request duration)
// are pushed, through [prometheus.Observer] children that the proxy looks up
// once per bucket or server and caches; Observe on them is lock-free and does
// not allocate. The upstream histogram, observed once per response, is
// sharded: each event loop has its own counters for a server
// ([Metrics.UpstreamLoopObserver]), summed at scrape time, so loops on
// different cores never write the same cache line.
//
// Metric names, types and label names are a contract (DESIGN.md section 7):
//
//	kvthrottle_commands_total{bucket}                         counter
//	kvthrottle_units_total{bucket,kind="read"|"write"}        counter
//	kvthrottle_throttled_total{bucket}                        counter
//	kvthrottle_rejected_total{bucket}                         counter
//	kvthrottle_throttle_wait_seconds{bucket}                  histogram
//	kvthrottle_bucket_reserved_units{bucket}                  gauge
//	kvthrottle_bucket_hard_limit_units{bucket}                gauge
//	kvthrottle_bucket_weight{bucket}                          gauge
//	kvthrottle_node_capacity_units                            gauge
//	kvthrottle_free_pool_units                                gauge
//	kvthrottle_connections{bucket}                            gauge
//	kvthrottle_upstream_up{server}                            gauge
//	kvthrottle_upstream_request_duration_seconds{server}      histogram
//	kvthrottle_auth_total{mechanism,result}                   counter
//
// and in fleet mode (DESIGN.md section 10):
//
//	kvthrottle_fleet_store_up                                 gauge
//	kvthrottle_fleet_instances                                gauge
//	kvthrottle_fleet_grant_units{bucket}                      gauge
//	kvthrottle_fleet_reserved_grant_units{bucket}             gauge
//	kvthrottle_fleet_free_pool_grant_units                    gauge
//	kvthrottle_fleet_units_per_second{bucket}                 gauge
//	kvthrottle_fleet_sync_duration_seconds                    histogram
//
// plus the standard go_* and process_* collectors and
// promhttp_metric_handler_errors_total{cause} (scrape errors).
package metrics

import (
	"math"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metric names (DESIGN.md section 7, contract).
const (
	NameCommands        = "kvthrottle_commands_total"
	NameUnits           = "kvthrottle_units_total"
	NameThrottled       = "kvthrottle_throttled_total"
	NameRejected        = "kvthrottle_rejected_total"
	NameThrottleWait    = "kvthrottle_throttle_wait_seconds"
	NameReserved        = "kvthrottle_bucket_reserved_units"
	NameHardLimit       = "kvthrottle_bucket_hard_limit_units"
	NameWeight          = "kvthrottle_bucket_weight"
	NameNodeCapacity    = "kvthrottle_node_capacity_units"
	NameFreePool        = "kvthrottle_free_pool_units"
	NameConnections     = "kvthrottle_connections"
	NameUpstreamUp      = "kvthrottle_upstream_up"
	NameUpstreamEjected = "kvthrottle_upstream_ejected"
	NameUpstreamLatency = "kvthrottle_upstream_request_duration_seconds"
	NameAuth            = "kvthrottle_auth_total"

	NameFleetStoreUp       = "kvthrottle_fleet_store_up"
	NameFleetInstances     = "kvthrottle_fleet_instances"
	NameFleetGrant         = "kvthrottle_fleet_grant_units"
	NameFleetReservedGrant = "kvthrottle_fleet_reserved_grant_units"
	NameFleetFreePoolGrant = "kvthrottle_fleet_free_pool_grant_units"
	NameFleetUnitsRate     = "kvthrottle_fleet_units_per_second"
	NameFleetSync          = "kvthrottle_fleet_sync_duration_seconds"
)

// Label names and the values of the kind label of [NameUnits].
const (
	LabelBucket = "bucket"
	LabelKind   = "kind"
	LabelServer = "server"
	LabelMech   = "mechanism"
	LabelResult = "result"
	KindRead    = "read"
	KindWrite   = "write"
)

// waitBuckets are the upper bounds, in seconds, of kvthrottle_throttle_wait_seconds:
// 100 us (below the engine's 5 ms wake-up accuracy) up to 10 s, roughly 1-2.5-5
// per decade. Longer waits land in +Inf.
var waitBuckets = []float64{
	0.0001, 0.00025, 0.0005,
	0.001, 0.0025, 0.005,
	0.01, 0.025, 0.05,
	0.1, 0.25, 0.5,
	1, 2.5, 5, 10,
}

// upstreamBuckets are the upper bounds, in seconds, of
// kvthrottle_upstream_request_duration_seconds: 50 us (a local memcached
// round trip) up to 2 s (the default upstream timeout).
var upstreamBuckets = []float64{
	0.00005, 0.0001, 0.00025, 0.0005,
	0.001, 0.0025, 0.005,
	0.01, 0.025, 0.05,
	0.1, 0.25, 0.5,
	1, 2,
}

// BucketSnapshot is one bucket's state at scrape time.
//
// Counters (Commands, ReadUnits, WriteUnits, Throttled, Rejected) are totals
// since the bucket was created in this process and must never decrease while
// a bucket of that Name exists; Prometheus treats a decrease as a counter reset.
type BucketSnapshot struct {
	// Name is the bucket name, the value of the bucket label. Names must be
	// unique within one AppendBuckets call and valid UTF-8.
	Name string
	// Reserved and HardLimit are the bucket's limits in units per second;
	// math.Inf(1) when unlimited (a negative value, such as a converted
	// throttle.Unlimited, is exported as +Inf too).
	Reserved, HardLimit float64
	// Weight is the weight of the bucket's share of the free pool in fair
	// mode (DESIGN.md section 13), 1 and up; 0 is exported as 1, the
	// default.
	Weight int
	// Commands counts metered commands executed (admitted and charged).
	Commands uint64
	// ReadUnits and WriteUnits count units charged (DESIGN.md section 4).
	ReadUnits, WriteUnits uint64
	// Throttled counts commands that were held before running.
	Throttled uint64
	// Rejected counts commands answered EWouldThrottle (non-blocking mode).
	Rejected uint64
	// Connections is the number of client connections currently using the bucket.
	Connections int64
}

// UpstreamSnapshot is one upstream memcached server's state at scrape time.
type UpstreamSnapshot struct {
	// Server is the server's address as configured ("host:port"), the value
	// of the server label. Unique within one AppendUpstreams call.
	Server string
	// Up is true when the proxy currently has a usable connection to the
	// server (or expects to: it is not marked down by the health checks).
	Up bool
	// Ejected is true while the server is ejected after repeated failures
	// (upstream.eject_after_failures): its keys go to the other servers.
	Ejected bool
}

// AuthCount is how many authentications of one mechanism ended with one
// result since the process started.
type AuthCount struct {
	// Mechanism is the value of the mechanism label: "PLAIN",
	// "SCRAM-SHA256", "SCRAM-SHA512", "text" (memcached's text
	// authentication) or "other" (a mechanism the proxy does not offer).
	Mechanism string
	// Result is the value of the result label: "success", "failure"
	// (wrong credentials), "refused" (not checked: too many in progress,
	// or the proxy is stopping) or "invalid" (not checked: malformed,
	// unsupported, or not allowed on the connection).
	Result string
	Count  uint64
}

// FleetSnapshot is fleet mode as one instance sees it at scrape time.
type FleetSnapshot struct {
	// StoreUp is true when the last call to the store succeeded.
	StoreUp bool
	// Instances is the number of instances alive at the last contact.
	Instances int
	// FreePoolGrant is this instance's share of the fleet's free pool, in
	// units per second; +Inf (or negative) when unlimited.
	FreePoolGrant float64
}

// FleetBucket is one bucket's fleet figures at scrape time, in units per
// second; +Inf (or negative) for an unlimited share.
type FleetBucket struct {
	Name string
	// HardLimitGrant and ReservedGrant are the shares of the bucket's fleet
	// hard limit and reservation this instance enforces now.
	HardLimitGrant, ReservedGrant float64
	// FleetUnitsPerSecond is the whole fleet's usage over the last grant
	// period; negative until known (then not exported).
	FleetUnitsPerSecond float64
}

// FleetSource is implemented by a Source that may run in fleet mode; its
// methods follow the rules of Source.
type FleetSource interface {
	// AppendFleet reports fleet mode and appends one FleetBucket per
	// bucket to dst; ok is false outside fleet mode (nothing is exported).
	AppendFleet(dst []FleetBucket) (snap FleetSnapshot, out []FleetBucket, ok bool)
}

// Source is the proxy's side of the metrics: it is read when Prometheus
// scrapes, from the HTTP server's goroutines, possibly by several scrapes at
// once, so every method must be safe for concurrent use with the proxy's event
// loops and with itself. The methods should be cheap (atomic loads) and must
// not block on the event loops.
type Source interface {
	// AppendBuckets appends one snapshot per existing bucket to dst and
	// returns the extended slice. dst is scratch space reused across scrapes;
	// the implementation must not retain it.
	AppendBuckets(dst []BucketSnapshot) []BucketSnapshot
	// NodeCapacity is the node capacity in units per second, math.Inf(1)
	// (or any negative value) when unlimited.
	NodeCapacity() float64
	// FreePool is the free pool rate in units per second,
	// max(0, capacity - sum of finite reservations); math.Inf(1) (or any
	// negative value) when the capacity is unlimited.
	FreePool() float64
	// AppendUpstreams appends one snapshot per configured upstream server to
	// dst and returns the extended slice, under the same rules as AppendBuckets.
	AppendUpstreams(dst []UpstreamSnapshot) []UpstreamSnapshot
	// AppendAuth appends the authentication counts (one per mechanism and
	// result, each pair once) to dst, under the same rules as AppendBuckets.
	AppendAuth(dst []AuthCount) []AuthCount
}

// Metrics owns kvthrottle's private Prometheus registry, its two histograms
// and, once [Metrics.Serve] is called, the HTTP server. Its methods are safe
// for concurrent use.
type Metrics struct {
	reg      *prometheus.Registry
	wait     *prometheus.HistogramVec
	upstream *shardedHistogram
	sync     prometheus.Histogram
	scrape   http.Handler // /metrics

	mu  sync.Mutex
	srv *server // non-nil while Serve runs
}

// New builds the registry: a collector that reads src at every scrape, the Go
// and process collectors, and the histograms kvthrottle_throttle_wait_seconds
// and kvthrottle_upstream_request_duration_seconds. src may be nil (then only
// the histograms and the runtime metrics are exported). New panics only on a
// programming error in this package (an invalid metric definition).
func New(src Source) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    NameThrottleWait,
			Help:    "Time in seconds a held (throttled) command waited before it was released to run.",
			Buckets: waitBuckets,
		}, []string{LabelBucket}),
		upstream: newShardedHistogram(NameUpstreamLatency,
			"Time in seconds from sending a request to an upstream memcached server to receiving its response.",
			LabelServer, upstreamBuckets),
	}
	m.sync = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    NameFleetSync,
		Help:    "Time in seconds of each call to the fleet store (fleet mode only).",
		Buckets: upstreamBuckets,
	})
	cs := []prometheus.Collector{
		m.wait,
		m.upstream,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	}
	if src != nil {
		cs = append(cs, newSourceCollector(src))
		if fs, ok := src.(FleetSource); ok {
			cs = append(cs, &fleetCollector{src: fs, sync: m.sync})
		}
	}
	m.reg.MustRegister(cs...)
	m.scrape = promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		// A broken metric must not hide all the others; the error is counted
		// in promhttp_metric_handler_errors_total, registered in m.reg.
		ErrorHandling:       promhttp.ContinueOnError,
		Registry:            m.reg,
		MaxRequestsInFlight: maxScrapesInFlight,
	})
	return m
}

// maxScrapesInFlight bounds concurrent /metrics requests; more get 503.
const maxScrapesInFlight = 4

// Registry returns the private registry, for registering further collectors
// or for gathering in tests. Everything [Metrics.Handler] serves on /metrics
// comes from it.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// WaitObserver returns the kvthrottle_throttle_wait_seconds{bucket} child.
// The caller looks it up once per bucket, caches it, and calls
// Observe(seconds) each time a held command is released; Observe is lock-free
// and does not allocate. After [Metrics.ForgetBucket] a cached observer still
// works but is no longer exported: drop it and ask again. A bucket name that
// is not valid UTF-8 gets an observer that discards everything.
func (m *Metrics) WaitObserver(bucket string) prometheus.Observer {
	o, err := m.wait.GetMetricWithLabelValues(bucket)
	if err != nil {
		return discard{}
	}
	return o
}

// UpstreamLoopObserver returns an observer of
// kvthrottle_upstream_request_duration_seconds{server}, whose Observe takes
// a round trip in seconds, that only one goroutine, the event loop
// numbered loop, ever calls: it writes counters of
// its own (no atomic read-modify-write, no cache line shared with other
// loops), added to the series at scrape time. The same server and loop get
// the same counters until [Metrics.ForgetUpstream]; after that a cached
// observer still works but is no longer exported. Calling Observe on it
// from two goroutines at once loses observations (it never panics).
func (m *Metrics) UpstreamLoopObserver(server string, loop int) prometheus.Observer {
	return m.upstream.owned(server, loop)
}

// FleetSyncObserver returns kvthrottle_fleet_sync_duration_seconds; Observe
// takes a store call's duration in seconds. It is exported only when the
// Source is a FleetSource in fleet mode.
func (m *Metrics) FleetSyncObserver() prometheus.Observer { return m.sync }

// ForgetBucket drops the per-bucket histogram series of a removed bucket. The
// gauges and counters need no forgetting: they come from the [Source] and
// vanish when the source stops reporting the bucket. Forgetting an unknown
// bucket is a no-op.
func (m *Metrics) ForgetBucket(bucket string) {
	m.wait.DeleteLabelValues(bucket)
}

// ForgetUpstream drops the histogram series of an upstream server that is no
// longer configured (for example after a reload). Forgetting an unknown
// server is a no-op.
func (m *Metrics) ForgetUpstream(server string) {
	m.upstream.forget(server)
}

// discard is the Observer returned for label values Prometheus cannot accept.
type discard struct{}

func (discard) Observe(float64) {}

// sourceCollector turns a Source into metrics at scrape time.
type sourceCollector struct {
	src Source

	mu        sync.Mutex // guards the scratch slices across concurrent scrapes
	buckets   []BucketSnapshot
	upstreams []UpstreamSnapshot
	auth      []AuthCount
}

var (
	descCommands = prometheus.NewDesc(NameCommands,
		"Metered commands executed by the bucket (count of commands) since the process started.",
		[]string{LabelBucket}, nil)
	descUnits = prometheus.NewDesc(NameUnits,
		"Throttling units charged to the bucket (count of units of read_unit_size or write_unit_size bytes), by kind read or write.",
		[]string{LabelBucket, LabelKind}, nil)
	descThrottled = prometheus.NewDesc(NameThrottled,
		"Commands of the bucket that were held by the throttle before running (count of commands).",
		[]string{LabelBucket}, nil)
	descRejected = prometheus.NewDesc(NameRejected,
		"Commands of the bucket refused by the throttle: EWouldThrottle in non-blocking mode, or Etmpfail past throttle.max_hold (count of commands).",
		[]string{LabelBucket}, nil)
	descReserved = prometheus.NewDesc(NameReserved,
		"Guaranteed reservation of the bucket in units per second; +Inf when unlimited.",
		[]string{LabelBucket}, nil)
	descHardLimit = prometheus.NewDesc(NameHardLimit,
		"Hard limit of the bucket in units per second; +Inf when unlimited.",
		[]string{LabelBucket}, nil)
	descWeight = prometheus.NewDesc(NameWeight,
		"Weight of the bucket's share of the free pool when throttle.free_pool is \"fair\", relative to the other buckets' weights (a ratio, no unit; 1 by default; no effect in \"fcfs\" mode).",
		[]string{LabelBucket}, nil)
	descNodeCapacity = prometheus.NewDesc(NameNodeCapacity,
		"Node capacity in units per second; +Inf when unlimited.",
		nil, nil)
	descFreePool = prometheus.NewDesc(NameFreePool,
		"Free pool shared first come first served, in units per second: max(0, capacity - sum of finite reservations); +Inf when the capacity is unlimited.",
		nil, nil)
	descConnections = prometheus.NewDesc(NameConnections,
		"Client connections currently using the bucket (count of connections).",
		[]string{LabelBucket}, nil)
	descUpstreamUp = prometheus.NewDesc(NameUpstreamUp,
		"Whether the upstream memcached server is usable: 1 up, 0 down (boolean).",
		[]string{LabelServer}, nil)
	descAuth = prometheus.NewDesc(NameAuth,
		"SASL and text authentications by mechanism and result: success, failure (wrong credentials), refused (not checked: too many in progress, or stopping), invalid (malformed, unsupported or not allowed) (count of authentications).",
		[]string{LabelMech, LabelResult}, nil)
	descUpstreamEjected = prometheus.NewDesc(NameUpstreamEjected,
		"Whether the upstream memcached server is ejected after repeated failures, its keys served by the others: 1 ejected, 0 in service (boolean).",
		[]string{LabelServer}, nil)
)

func newSourceCollector(src Source) *sourceCollector { return &sourceCollector{src: src} }

// Describe implements prometheus.Collector; the collector is "checked": every
// metric it sends has one of these descriptors.
func (c *sourceCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		descCommands, descUnits, descThrottled, descRejected,
		descReserved, descHardLimit, descWeight, descNodeCapacity, descFreePool,
		descConnections, descUpstreamUp, descUpstreamEjected, descAuth,
	} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *sourceCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()

	send := func(d *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) {
		m, err := prometheus.NewConstMetric(d, t, v, labels...)
		if err != nil {
			m = prometheus.NewInvalidMetric(d, err)
		}
		ch <- m
	}

	c.buckets = c.src.AppendBuckets(c.buckets[:0])
	for i := range c.buckets {
		b := &c.buckets[i]
		send(descCommands, prometheus.CounterValue, float64(b.Commands), b.Name)
		send(descUnits, prometheus.CounterValue, float64(b.ReadUnits), b.Name, KindRead)
		send(descUnits, prometheus.CounterValue, float64(b.WriteUnits), b.Name, KindWrite)
		send(descThrottled, prometheus.CounterValue, float64(b.Throttled), b.Name)
		send(descRejected, prometheus.CounterValue, float64(b.Rejected), b.Name)
		send(descReserved, prometheus.GaugeValue, limit(b.Reserved), b.Name)
		send(descHardLimit, prometheus.GaugeValue, limit(b.HardLimit), b.Name)
		send(descWeight, prometheus.GaugeValue, float64(max(b.Weight, 1)), b.Name)
		send(descConnections, prometheus.GaugeValue, float64(b.Connections), b.Name)
	}
	clear(c.buckets) // do not pin names of removed buckets

	send(descNodeCapacity, prometheus.GaugeValue, limit(c.src.NodeCapacity()))
	send(descFreePool, prometheus.GaugeValue, limit(c.src.FreePool()))

	c.upstreams = c.src.AppendUpstreams(c.upstreams[:0])
	for _, u := range c.upstreams {
		up := 0.0
		if u.Up {
			up = 1
		}
		send(descUpstreamUp, prometheus.GaugeValue, up, u.Server)
		ejected := 0.0
		if u.Ejected {
			ejected = 1
		}
		send(descUpstreamEjected, prometheus.GaugeValue, ejected, u.Server)
	}
	clear(c.upstreams)

	c.auth = c.src.AppendAuth(c.auth[:0])
	for _, a := range c.auth {
		send(descAuth, prometheus.CounterValue, float64(a.Count), a.Mechanism, a.Result)
	}
}

// limit normalises a limit for export. +Inf means unlimited; so do a
// negative value (throttle.Unlimited is -1, a source may pass it through), -Inf
// and NaN, none of which is a meaningful limit.
func limit(v float64) float64 {
	if v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		return math.Inf(1)
	}
	return v
}

var (
	descFleetStoreUp = prometheus.NewDesc(NameFleetStoreUp,
		"Whether the last call to the fleet store succeeded: 1 yes, 0 no (boolean).", nil, nil)
	descFleetInstances = prometheus.NewDesc(NameFleetInstances,
		"Instances of the fleet alive at the last contact with the store (count of instances).", nil, nil)
	descFleetGrant = prometheus.NewDesc(NameFleetGrant,
		"This instance's current share of the bucket's fleet hard limit, in units per second; +Inf when unlimited.",
		[]string{LabelBucket}, nil)
	descFleetReservedGrant = prometheus.NewDesc(NameFleetReservedGrant,
		"This instance's current share of the bucket's fleet reservation, in units per second; +Inf when unlimited.",
		[]string{LabelBucket}, nil)
	descFleetFreePoolGrant = prometheus.NewDesc(NameFleetFreePoolGrant,
		"This instance's current share of the fleet's free pool, in units per second; +Inf when unlimited.", nil, nil)
	descFleetUnitsRate = prometheus.NewDesc(NameFleetUnitsRate,
		"Units the whole fleet charged to the bucket per second over the last grant period.",
		[]string{LabelBucket}, nil)
)

// fleetCollector exports fleet mode's figures; it exports nothing (not even
// the sync histogram) outside fleet mode.
type fleetCollector struct {
	src  FleetSource
	sync prometheus.Histogram

	mu      sync.Mutex
	buckets []FleetBucket
}

// Describe implements prometheus.Collector.
func (c *fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descFleetStoreUp, descFleetInstances, descFleetGrant,
		descFleetReservedGrant, descFleetFreePoolGrant, descFleetUnitsRate} {
		ch <- d
	}
	c.sync.Describe(ch)
}

// Collect implements prometheus.Collector.
func (c *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	snap, buckets, ok := c.src.AppendFleet(c.buckets[:0])
	c.buckets = buckets
	if !ok {
		return
	}
	send := func(d *prometheus.Desc, v float64, labels ...string) {
		m, err := prometheus.NewConstMetric(d, prometheus.GaugeValue, v, labels...)
		if err != nil {
			m = prometheus.NewInvalidMetric(d, err)
		}
		ch <- m
	}
	up := 0.0
	if snap.StoreUp {
		up = 1
	}
	send(descFleetStoreUp, up)
	send(descFleetInstances, float64(snap.Instances))
	send(descFleetFreePoolGrant, limit(snap.FreePoolGrant))
	for _, b := range buckets {
		send(descFleetGrant, limit(b.HardLimitGrant), b.Name)
		send(descFleetReservedGrant, limit(b.ReservedGrant), b.Name)
		if b.FleetUnitsPerSecond >= 0 {
			send(descFleetUnitsRate, b.FleetUnitsPerSecond, b.Name)
		}
	}
	clear(c.buckets)
	c.sync.Collect(ch)
}
