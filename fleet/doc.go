// Package fleet makes the limits of many kvthrottle instances hold for the
// fleet as a whole (DESIGN.md section 10), through a shared Redis store.
//
// # Model
//
// Each instance admits from its own throttle engine exactly as a single
// instance does: no store round trip on the request path. What changes is
// which limits that engine enforces. For every fleet limit (each bucket's
// reservation and hard limit, and the free pool: the capacity less the
// finite reservations) the instance enforces its share, a rate in units per
// second, and the shares held by the live instances never add up to more
// than the limit.
//
// Once per grant period (and early when a load moves, below) each instance
// makes one call of a Lua script ([Store]) carrying all of its buckets:
// its running totals of units used (the store adds what is new to the
// fleet's totals), and its demand for each bucket. The script records the demand and answers with the caller's
// new shares, computed in the store, atomically, with Redis's own clock:
//
//   - Demand. A bucket whose callers wait here (a mean of at least half a
//     caller held over the last period, sampled 20 times, or non-blocking
//     callers refused) is saturated: it wants all it can get, weighted by
//     how many callers wait, as one proxy would serve them one waiting
//     connection after another. Any other bucket wants 1.25 times its rate
//     over the last period plus 2 units/s, with weight 1. The free pool's
//     demand is the sum over the instance's buckets of what each wants
//     beyond its reservation share, at most its hard limit less its
//     reservation.
//   - Shares. The limit is divided by weighted max-min (water-filling): a
//     demand below the common level gets what it asks for, the rest is split
//     by weight, and what nobody asks for is split by weight among all, so
//     an instance whose load grows has room at once.
//   - Fair sharing. An instance whose free_pool is "fair" also reports,
//     per bucket, what it wants of the free pool and the bucket's weight.
//     Its free pool share is then computed bucket by bucket: the fleet's
//     free pool is split among the buckets by weighted max-min over their
//     fleet-wide demand (the sum of the live instances', at most the
//     bucket's hard limit less its reservation), each bucket's share among
//     the instances by their demands as above, at most what the other
//     instances do not hold of it ([BucketGrant].Pool), and the instance's
//     free pool share is the sum of its buckets', clamped as below. The
//     instance splits its pool in proportion to them.
//   - Clamping. The caller's share is at most the limit less the shares the
//     other live instances hold. A share moves from one instance to another
//     only when the first calls and lowers its own and then the second calls:
//     the split follows a change of load within two periods, and the sum of
//     the shares never exceeds the limit.
//   - Load that moves. An instance also calls at a tick, before its period,
//     when a bucket's load arrived (callers held, last report not
//     saturated), left (a saturated bucket with nobody held whose usage over
//     the last tick fell: it asks for the idle headroom at the lowest weight
//     and gets none of the surplus) or was cut (callers held, and the
//     others' holdings cut its hard share by more than a fifth: the reply
//     says so). A failed call is made again at the next tick for two
//     periods after the last good call. At most five such calls per period
//     (move.go). The split then follows a moved load within a tick or two.
//     No bound changes: no debt, and the clamp holds at every call.
//   - Steadiness. A saturated instance whose new share would be at most a
//     tenth below its current one keeps it. Demand measured from waiting
//     callers is noisy, and a share that moves is unused for up to a
//     period; without this a fleet of two saturated instances ran 7% under
//     its capacity. A real shift of load moves more than a tenth.
//   - Leases. An instance's shares count for one period and a quarter (at
//     least 50 ms more, each instance by its own period) after its last
//     call; an instance that dies strands that much of its shares and no
//     more. An instance gone for an hour is forgotten.
//   - Agreement. Each limit is the lowest any live instance reports, so
//     instances whose configurations disagree (a file changed on one, a
//     change on its way) never share out more than the lowest.
//   - Names. Two live instances under one name would overwrite each
//     other's entries and each take a share as if alone: the script
//     answers "conflict" to a run of a name other than the live one,
//     unless it is starting (sequence number 1), and that instance moves
//     to a name of its own (the configured one, "~" and its epoch) and
//     reports [ErrNameTaken], so both count and the limits hold.
//   - Records the script did not write (junk in the fleet's keys) are
//     dropped or ignored, never trusted; a state version that is not a
//     number means the store is seeded again.
//   - Retries. Each call carries the instance's epoch and a sequence
//     number: a call not newer than one already recorded changes nothing,
//     and usage travels as running totals since the epoch began, so a lost
//     reply never counts usage twice. A store found empty (restarted) starts
//     a new epoch, so it counts only what is used from then on.
//
// # Accuracy
//
// Within a period in which the limits and the shares do not change, each
// instance enforces its share with the engine's own accuracy, so the fleet
// admits at most the limit plus one engine burst per instance. Shares move
// to where the load is within two periods; until then the fleet may admit
// less than its limit, never more. Two things can make it admit more, each
// bounded: a lost reply (the script ran, the caller timed out) that
// lowered its instance's share leaves that instance on its older share
// until its next call, so the fleet may run over by that difference for a
// period (about a tick while the store answers: a failed call is made
// again at the next tick); and a limit lowered by an admin change reaches
// every instance within one period, each keeping its earlier share
// meanwhile. Early calls (load that moves) add nothing to these: the fleet
// runs over the limit in no 1 s window when a bucket's whole load moves
// between two instances every second or half second, also with replies
// lost (TestSimLoadThatMoves, TestSimLoadThatMovesLostReplies, exact on a
// fake clock). Measured
// through three real instances (proxy/fleet_test.go): a hard limit of 3000
// split 6:3:1 and flipped within 0.5% over 10 s, at most +2% in any second.
//
// # Store loss
//
// A failed call leaves the last shares in force. Once the last good call is
// three periods old, the loss policy applies: Share enforces each fleet
// limit divided by the number of instances alive at the last contact, Open
// each fleet limit as a lone instance would. Under Share each part is at
// first capped by the instance's last share, for three more periods: the
// instances' last good calls were up to a period apart, so they fall back
// at different times, and an instance with little demand that took its
// whole part while the others still held their shares would run the fleet
// over the limit (12% in a 1 s window in TestSimStoreLoss without the cap).
// The number of instances Share divides by is the most the store counted
// alive at any of the last six good calls, not only the last: a store
// back for a moment has forgotten the instances whose leases ran out, and
// tells the first caller it is alone (TestSimStoreFlap: 5/3 of the limit
// once the store was lost again). The first good call puts the
// store's shares back in force. Clients see none of it: admission never
// waits for the store.
//
// A store found empty (restarted) is seeded again, under a new id. After
// a silence (no instance called within its lease: the whole fleet lost the
// store, or it is new or emptied), for one lease from the first call after
// it, the callers leave room for the instances they knew of and that are
// not back yet (the most any caller since then knew of, kept in the store:
// a caller's own count drops at its first good call; [Config.Instances]
// for one just started), an expect-th of each limit each: they may still
// hold their last shares or their fallback parts. The instances reach the
// store at their first call after it is back (softDial), so each is back
// within a period of the first (TestSimStoreBackInstancesApart). An
// instance that starts while the store is down divides the limits by the
// same number under Share.
//
// The store's lease (1.25 periods) is shorter than the three periods an
// instance keeps its shares: an instance cut off from the store alone
// while the others reach it keeps its share while the others take it back
// after its lease, so the fleet may run over by that share for about 1.75
// periods, and under Share by the limit divided by the instances for as
// long as the partition lasts: Share assumes the whole fleet lost the
// store, and no instance can tell a partition from the store's loss, nor
// its peers a dead instance from a partitioned one.
//
// # State
//
// The fleet's state document (the runtime limits set by the admin opcodes,
// and the key namespaces' epochs) lives in the store under a token
// "id:version" (the id names one life of the store); each sync returns it
// when the caller's token differs, and [Fleet.Update] changes it with
// compare-and-set. An empty store is seeded from the first instance's
// state. A document the instance cannot adopt is offered again at every
// sync; one read before the instance's own Update landed is dropped (it
// is older than what the instance has).
//
// # Sources
//
// From CockroachDB's distributed token bucket: each instance admits from a
// local bucket refilled by grants of a rate lasting a period, with one
// store request per period carrying its consumption, and shares computed
// centrally from what every instance asks for. From Bucket4j's delayed
// synchronisation: admission never waits for the store; usage is reported
// in batches. From gubernator's GLOBAL behaviour: the store owns the
// authoritative counts and instances act on a recent copy. What is new
// here: shares of several nested limits at once (reservation, hard limit,
// free pool), clamped so that their sum never exceeds a limit, and demand
// weighted by waiting callers so a fleet splits a limit as one proxy would.
package fleet
