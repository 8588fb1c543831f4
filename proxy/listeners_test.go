package proxy

import (
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// TestListenerBindsBucket: a connection to a [[listener]] belongs to the
// listener's bucket without authenticating (DESIGN.md section 12), while
// proxy.listen still requires authentication; SASL on a listener lands
// in the user's bucket as anywhere; a reload may not change listeners.
func TestListenerBindsBucket(t *testing.T) {
	t.Parallel()
	l := testmc.FreeAddr(t)
	tail := tenantTail(t) + fmt.Sprintf("[[listener]]\nlisten = %q\nbucket = \"bob\"\n", l)
	p := startProxy(t, testConfig{proxy: `default_bucket = ""`, tail: tail})
	stOf := func(r *mcclient.Response, err error) mc.Status { t.Helper(); return status(t, r, err) }

	main := dial(t, p.Addr)
	defer main.Close()
	if st := stOf(main.Set([]byte("k"), []byte("v"))); st != mc.StatusEaccess {
		t.Errorf("SET on proxy.listen without authentication: %v, want Eaccess", st)
	}

	viaL := dial(t, l)
	defer viaL.Close()
	if st := stOf(viaL.Set([]byte("k"), []byte("from-listener"))); st != mc.StatusSuccess {
		t.Fatalf("SET on the listener without authentication: %v", st)
	}
	bob := login(t, p.Addr, "bob")
	defer bob.Close()
	if r, err := bob.Get([]byte("k")); err != nil || r.Status() != mc.StatusSuccess || string(r.Value) != "from-listener" {
		t.Errorf("bob reads %v %v; want the listener's value (its bucket is bob's)", r, err)
	}
	alice := login(t, l, "alice") // SASL on the listener: alice's bucket
	defer alice.Close()
	if st := stOf(alice.Get([]byte("k"))); st != mc.StatusKeyEnoent {
		t.Errorf("alice, authenticated on the listener, reads bob's key: %v", st)
	}
	if st := stOf(viaL.Do(mcclient.Request{Opcode: mc.OpSelectBucket, Key: []byte("alice")})); st != mc.StatusEaccess {
		t.Errorf("an unauthenticated listener connection selects another bucket: %v, want Eaccess", st)
	}

	cfg, err := bucketcfg.Parse([]byte(testConfig{proxy: `default_bucket = ""`, tail: tenantTail(t)}.render(p.Addr, []string{p.MC.Addr}, p.StatePath)))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Reload(cfg); err == nil || !strings.Contains(err.Error(), "[[listener]]") {
		t.Errorf("a reload dropping the listener: %v, want it refused", err)
	}
}

func TestListenerTableMatch(t *testing.T) {
	t.Parallel()
	tab := newListenerTable([]bucketcfg.Listener{
		{Listen: ":7000", Bucket: "any"},
		{Listen: "127.0.0.2:7000", Bucket: "two"},
		{Listen: "[::1]:7001", Bucket: "six"},
		{Listen: "localhost:7002", Bucket: "named"},
	})
	for _, c := range []struct {
		ip   string
		port int
		want string
	}{
		{"127.0.0.2", 7000, "two"}, {"10.1.2.3", 7000, "any"}, {"::ffff:127.0.0.2", 7000, "two"},
		{"::1", 7001, "six"}, {"127.0.0.1", 7001, ""}, {"127.0.0.1", 7002, "named"}, {"127.0.0.1", 11311, ""},
	} {
		if got := tab.bucketOf(&net.TCPAddr{IP: net.ParseIP(c.ip), Port: c.port}); got != c.want {
			t.Errorf("%s:%d: %q, want %q", c.ip, c.port, got, c.want)
		}
	}
}
