package proxy

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
)

// TestMetaKeyEchoFramedExactly: a key stored through the binary protocol
// may hold "\r\n", and memcached echoes it raw to an mg with k (asked for
// in base64). The echo must be read as one token: before, the key's bytes
// after its "\r\n" were taken for the next reply, so a tenant forged the
// replies of the commands after its own on the shared meta connection
// (with upstream.conns_per_bucket off, another tenant's), then brought the
// connection down. Both a pipeline on the attacker's connection and a
// victim's on another connection of the bucket get memcached's replies.
func TestMetaKeyEchoFramedExactly(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, upstream string }{{"per bucket", ""}, {"shared", "conns_per_bucket = false"}} {
		t.Run(tc.name, func(t *testing.T) {
			p := startProxy(t, testConfig{loops: 1, upstream: tc.upstream})
			forged := "VA 6 kvictim\r\nPWNED!"
			evil := "x\r\n" + strings.Repeat("Z", len(forged))
			bc, err := mcclient.Dial(p.Addr)
			if err != nil {
				t.Fatal(err)
			}
			defer bc.Close()
			if r, err := bc.Set([]byte(evil), []byte(forged)); err != nil || r.Err() != nil {
				t.Fatalf("binary set: %v %v", err, r)
			}
			victim := dialText(t, p.Addr)
			if got := metaExchange(t, victim, "ms victim 6\r\nsecret\r\nmn\r\n"); got != "HD\r\nMN\r\n" {
				t.Fatalf("victim's ms: %q", got)
			}
			attacker := dialText(t, p.Addr)
			k64 := base64.StdEncoding.EncodeToString([]byte(evil))
			got := metaExchange(t, attacker, "mg "+k64+" b k v\r\n"+strings.Repeat("mg victim v\r\n", 3)+"me "+k64+" b\r\nmn\r\n")
			want := "VA 20 k" + evil + "\r\n" + forged + "\r\n" + strings.Repeat("VA 6\r\nsecret\r\n", 3)
			if !strings.HasPrefix(got, want) || !strings.HasPrefix(got[len(want):], "ME "+evil+" exp=-1 ") || !strings.HasSuffix(got, "\r\nMN\r\n") {
				t.Fatalf("attacker's pipeline got\n%q\nwant\n%q, then its ME line and MN", got, want)
			}
			if got := metaExchange(t, victim, "mg victim v\r\nmn\r\n"); got != "VA 6\r\nsecret\r\nMN\r\n" {
				t.Errorf("victim after the attack: %q", got)
			}
		})
	}
}

// TestMetaEchoKeyForm: memcached echoes an item's key as it was stored,
// base64 only when stored with a base64 key, whatever the command asks;
// the client gets the form memcached gives, without the namespace.
func TestMetaEchoKeyForm(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{})
	c := dialText(t, p.Addr)
	for _, tc := range []struct{ in, want string }{
		{"ms k8 2\r\nhi\r\nme azg= b\r\n", "HD\r\nME k8 exp=-1 "},           // stored plain, asked in base64
		{"ms azk= 2 b\r\nhi\r\nme k9\r\n", "HD\r\nME azk= exp=-1 "},         // stored in base64, asked plain
		{"mg azg= b k v\r\n", "VA 2 kk8\r\nhi\r\n"},                         // k: plain echo, no b
		{"mg k9 k v\r\n", "VA 2 kazk= b\r\nhi\r\n"},                         // k: base64 echo with b
		{"ms a\\x20b 1 T0\r\nx\r\nmg YSBi b k\r\n", "HD\r\nEN kYSBi b\r\n"}, // a miss echoes the key asked
	} {
		if got := metaExchange(t, c, tc.in+"mn\r\n"); !strings.HasPrefix(got, tc.want) || strings.Contains(got, "default") {
			t.Errorf("%q: got %q, want %q...", tc.in, got, tc.want)
		}
	}
}

// TestNamespacedKeyTooLongSwallowsData: a key memcached takes (250 bytes
// at most) but that the bucket's namespace makes too long is refused, and
// its data block is swallowed with it: the client sent one, and read as
// commands a value could delete or flush the tenant's keys. Before, only
// the line was skipped (as memcached does for keys over 250 bytes), and
// pymemcache's set of a 249-byte key with the value "delete victim"
// deleted victim.
func TestNamespacedKeyTooLongSwallowsData(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{})
	long := strings.Repeat("K", 249)
	in := "set victim 0 0 1\r\nv\r\n" +
		"set " + long + " 0 0 15 noreply\r\ndelete victim\r\n\r\n" +
		"set " + long + " 0 0 13\r\ndelete victim\r\n" +
		"ms " + long + " 15\r\nmd victim q\r\nmn\r\n" +
		"get victim\r\nmn\r\n"
	want := "STORED\r\n" + string(errBadCommandLine) + string(errBadCommandLine) + "VALUE victim 0 1\r\nv\r\nEND\r\nMN\r\n"
	if got := metaExchange(t, dialText(t, p.Addr), in); got != want {
		t.Errorf("got\n%q\nwant\n%q", got, want)
	}
}

// TestLongMetaLineClosesOnlyItsClient: a meta command line memcached
// would read whole when it arrives in one piece, but that the namespace
// makes longer than memcached reliably reads (2 KiB, its read buffer at
// 16 KiB), closes the client's connection as memcached may close it;
// before, it went upstream and memcached reset the shared connection,
// failing other tenants' commands.
func TestLongMetaLineClosesOnlyItsClient(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{loops: 1, upstream: "conns_per_bucket = false"})
	other := dialText(t, p.Addr)
	if got := metaExchange(t, other, "ms k1 2\r\nhi\r\nmn\r\n"); got != "HD\r\nMN\r\n" {
		t.Fatalf("ms: %q", got)
	}
	long := dialText(t, p.Addr)
	line := "mg k1 v P" + strings.Repeat("x", 16383-len("mg k1 v P\r\n")) + "\r\n"
	if got := metaExchange(t, long, "mg k1 v\r\n"+line+"mg k1 v\r\n"); got != "VA 2\r\nhi\r\n" {
		t.Errorf("the long line's client got %q, want the reply before it, then the close", got)
	}
	for i := 0; i < 3; i++ {
		if got := metaExchange(t, other, "mg k1 v\r\nmn\r\n"); got != "VA 2\r\nhi\r\nMN\r\n" {
			t.Fatalf("another client after the long line: %q", got)
		}
	}
}
