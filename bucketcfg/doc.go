// Package bucketcfg is the configuration model of kvthrottle.
//
// It owns:
//
//   - [Config], the TOML configuration file of DESIGN.md section 6, loaded with
//     [Load] or [Parse] and strictly validated (unknown keys and bad values
//     are rejected with an error naming the key);
//   - [User] and password verification ([Config.Authenticate], [HashPassword]),
//     and [AuthCache], which remembers recently verified passwords (as keyed MACs);
//   - the JSON bodies of the admin opcodes 0x2a ([ParseBucketProperties], with
//     the weight; [ParseBucketThrottle], the limits alone) and
//     0x2c ([ParseNodeThrottle]);
//   - the persisted runtime state ([State], [LoadState], [State.Save]) and how
//     it overrides the file ([Effective]).
//
// Every rate (capacity, reservation, hard limit) is a [throttle.Limit], whose
// TOML and JSON forms (a non-negative integer or "unlimited") and error
// messages that type defines; this package adds the key names.
//
// The package does no network I/O; it reads and writes files only in [Load],
// [LoadState] and [State.Save]. Values returned by this package are plain data:
// a *Config is safe for concurrent reads once returned and must not be
// modified afterwards; a *State is not safe for concurrent use (the proxy
// serialises admin changes).
//
// Secrets: neither passwords nor password hashes ever appear in an error
// message, in a String method or in JSON produced by this package.
package bucketcfg
