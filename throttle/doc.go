// Package throttle is kvthrottle's throttle engine: it decides whether a
// bucket (tenant) may run its next command now, charges the units a command
// used once it has run, and computes how long a held command must wait.
// It does no I/O and reads time only from an injectable [Clock].
//
// # Model
//
// A node ([Engine]) has a capacity; each [Bucket] has a reservation and a
// hard limit, all [Limit] values in units per second. The free pool is what
// the reservations leave of the capacity: max(0, capacity - sum of the
// finite reservations of the node's buckets), shared first come, first
// served, or in fair mode among the buckets that want more of it by
// weighted max-min ([Engine.SetFreePoolMode]; fair.go has the algorithm). Each finite rate is enforced by a gauge: a token bucket with
// continuous refill, kept as a "theoretical arrival time" (GCRA) in
// nanoseconds of the engine clock and updated with atomic operations. A
// gauge has room while what it has billed ends at most one burst after now:
// a gauge of rate r may run r*burst units ahead of its rate, plus one
// command, and idle time does not build up more room than that. Costs are
// kept to 1/65536 ns per unit and rounded up to the nanosecond per charge.
//
// [Bucket.Admit] applies the rules of DESIGN.md section 4 in order:
//
//  1. an unthrottled caller, or a bucket whose reservation is Unlimited:
//     admit;
//  2. the bucket's reservation gauge has room: admit, charge the reservation;
//  3. the free pool has no room (in fair mode: or it is not the bucket's
//     turn): hold;
//  4. the bucket's hard-limit gauge has no room: hold;
//  5. admit, charge the free pool.
//
// Every charge also counts against the bucket's hard limit. Unthrottled
// callers are never held, but their units are charged like any other (to
// the reservation if it has room, else to the free pool, even into debt), so
// they slow down their bucket's other connections and the node. A bucket
// whose reservation is Unlimited charges no gauge at all.
//
// With capacity Unlimited the free pool never holds anybody, but hard limits
// (and reservations, which then merely count) still apply. A capacity below
// the sum of the reservations leaves a free pool of zero; reservations are
// still honoured, so the node then runs above its capacity.
//
// # Charging
//
// A command is billed when it is admitted and settled once it has run.
// [Bucket.AdmitCost] bills what is known in advance: a write's units (its
// key and value are in the request), and for a read the bucket's
// **ceiling** ([ReadCost]): a class of units that bounds every value of the
// bucket's current epoch, raised before a larger value is written through
// the caller (and after the reads billed under the old class settled),
// raised by a read that brought more (a surprise), reset by a FLUSH.
// [Bucket.Settle] gives back what the command cost less, or bills what it
// cost more (a surprise, which a caller should rather pay through
// admission before it delivers the read). No read is billed below what it
// can cost, so there is no budget for reads of unknown cost: reads in
// flight are bounded only by their bills. ([Bucket.Admit] and
// [Bucket.Charge] are the same with one unit billed in advance, for
// callers that know nothing of the cost.)
//
// Rule 2 on the bucket's own gauges (its reservation and hard limit): a
// bill of c admits when max(tat, now) + c/r <= now + max(burst, c/r), the
// whole bill within the burst, or a bill larger than the burst on a gauge
// paid up. The shared free pool admits while tat - burst <= now, so that a
// large bill does not starve there.
//
// Gauges may go into debt (a big command); the debt delays the next
// admission, which is how a limit holds exactly over time. Over any window
// of length w in which the limits do not change, units billed against a
// bucket's reservation or hard limit of rate r are at most r*w +
// max(r*burst, c_max), c_max the bucket's largest bill (its ceiling, for a
// read); against the free pool at most pool*w + pool*burst + the largest
// single command. Settles only give back, but for a surprise.
//
// # Waiting
//
// A held caller gets the exact duration until the gauges that hold it have
// room: the later of the free pool and the hard limit, or the time the
// reservation has room if that is sooner. Blocking callers keep a place in
// a per-bucket FIFO line with a [Waiter], and a place behind others waits
// for room for those ahead of it too (see [Bucket.Admit]). [InfDuration]
// means only a change of limits can admit the bucket (no reservation, and a
// free pool or hard limit of zero). After changing limits, callers should
// re-try their held commands at once: waits may have become shorter.
//
// The burst must exceed the callers' wake-up latency, or throughput is lost
// while a gauge has room and nobody is awake to use it: [DefaultBurst] is
// 20 ms for a proxy that wakes held sessions within 5 ms.
//
// # Leases
//
// Every admission through the Bucket writes memory all the bucket's
// callers share (gauges, counters), which costs
// when several event loops admit for one bucket. A [Lease] (one per event
// loop per bucket, used by that loop's goroutine only) draws a chunk of
// the bucket's units in advance, as one admission of the chunk plus the
// command that needed it (billed to the domain admitted, the hard limit
// and, in fair mode, the bucket's virtual time, exactly as an admission of
// that many units), and admits the next commands from that stock while it
// covers them, nobody waits in the bucket's line and no caller of the
// bucket has been held since the draw; those admissions and their settles
// write only the lease. A chunk is 250 µs of the domain's rate (the
// reservation for Reserved; the lesser of the free pool and the hard limit
// for FreePool), at most 1/8 of its burst and 1024 units; under 2 units
// nothing is leased. A lease also counts its reads in flight, by the
// generation of the ceiling they were billed under, for a raise to wait
// on (written by the owner only).
//
// The stock goes back (refunded exactly, as Settle refunds) when a caller
// of the bucket is held (the lease gives it back at its next use or
// Expire), when somebody waits in the bucket's line, when the limits
// change or the bucket is removed, when it has gone unused for LeaseTTL
// (2 ms, as seen by the owner's calls to Expire: the proxy calls it every
// millisecond on a busy event loop, at its 50 ms tick on an idle one), and
// on Return. A stock drawn while a gauge's rate had no cost ("unlimited")
// billed that gauge nothing, and gives it nothing back. A lease's
// own caller, held, has given its stock back first. The error this
// bounds:
//
//   - billed ahead of use: at most two chunks per lease (one drawn, one
//     of bills given back by settles), until the first Expire LeaseTTL
//     after last use (or a hold, a change of limits, Return); meanwhile
//     it delays the bucket's callers elsewhere by at most those two
//     chunks at the rate, since they are units billed, not a lock;
//   - long-run rates (the ±2% rules) are unchanged: every unit drawn is
//     used or refunded. Over a window, the units billed to a gauge keep
//     their bound with one chunk more to the largest command, and the
//     units run may exceed the units billed by what the leases held when
//     the window began: with L leases per bucket, the burst bound grows
//     by 2·L chunks, at most L·burst/4 of the rate;
//   - FIFO order holds at chunk granularity: a stock is used only while
//     the line is empty, and a held caller waits at most for the chunks
//     other leases drew before it was held, until their next use or
//     Expire;
//   - fair mode: a lease with stock of the free pool admits without
//     asking for its turn: a bucket may run ahead of the lag bound (4 ms
//     of the pool) by its leases' stocks (250 µs of the lesser of pool
//     and hard limit each, at most two);
//   - Stats and the average command size lag by what leases counted
//     since their last draw, Expire or Return (the ceiling has no copy:
//     every lease reads the bucket's).
//
// # Concurrency
//
// All methods are safe for concurrent use (a Waiter, by one goroutine at a
// time; a Lease, by its owner only). Admit and Charge take no lock and do not allocate. Configuration
// changes (SetCapacity, AddBucket, SetLimits, RemoveBucket) take an
// engine-wide mutex, apply at once, and keep every gauge's debt (rescaled to
// the new rate; a change to or from Unlimited or 0 forgives it). Nothing in
// this package panics on bad input: invalid limits are errors, out-of-range
// units are clamped.
package throttle
