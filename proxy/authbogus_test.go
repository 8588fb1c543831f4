package proxy

import (
	"fmt"
	"os/exec"
	"testing"
	"time"
)

// A flood of wrong passwords over many made-up user names from one address
// (the reviewer's scenario: 20 names, loopback like everyone else) must not
// refuse the correct logins of the address's real users: a pool of 32
// pylibmc connections of a user never logged in (cold), and of one whose
// password is cached, all log in and use their bucket. Before the fix every
// such login got Etmpfail: the bogus names filled the address's queue
// bound and put the whole address under penalty.
func TestAuthBogusNamesFloodSparesColdPool(t *testing.T) { authBogusFlood(t, false) }

// TestAuthBogusNamesFloodSparesCachedPool: the same, the pool user's
// password verified just before the flood.
func TestAuthBogusNamesFloodSparesCachedPool(t *testing.T) { authBogusFlood(t, true) }

func authBogusFlood(t *testing.T, cached bool) {
	if err := exec.Command("/usr/bin/python3", "-c", "import pylibmc").Run(); err != nil {
		t.Skipf("pylibmc not installed (make test installs python3-pylibmc): %v", err)
	}
	p := startProxy(t, testConfig{tail: poolTail(t)})
	if cached {
		login(t, p.Addr, poolUser).Close()
	}
	var floods []*flood
	for i := range 20 {
		floods = append(floods, startFlood(p.Addr, 1, fmt.Sprintf("u%d", i), "wrong-pw-%d"))
	}
	stats := func() (failures int64) {
		for _, f := range floods {
			failures += f.authErrors.Load()
		}
		return failures
	}
	defer func() {
		for _, f := range floods {
			f.stop()
		}
	}()
	eventually(t, 60*time.Second, "the bogus names to fail", func() bool { return stats() >= 40 })
	kv := runPoolClient(t, "py", "py", "/usr/bin/python3", "-c", pylibmcPool, p.Addr, poolUser, poolPass, fmt.Sprint(poolSize))
	checkPoolData(t, p.Addr, kv)
	if stats() < 40 {
		t.Error("the flood was not refused")
	}
}
