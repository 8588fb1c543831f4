package upstream

import (
	"strings"
	"testing"

	"github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/proto/text"
)

// metaRecorder records what a meta command received.
type metaRecorder struct {
	name string
	log  *[]string
}

func (w *metaRecorder) Deliver(*binary.Frame, bool) { *w.log = append(*w.log, w.name+" binary frame") }
func (w *metaRecorder) Silent()                     { *w.log = append(*w.log, w.name+" silent") }
func (w *metaRecorder) Fail(_ binary.Status, reason string) {
	*w.log = append(*w.log, w.name+" fail "+reason)
}
func (w *metaRecorder) DeliverMeta(r *text.MetaResponse) {
	*w.log = append(*w.log, w.name+" "+string(r.Line)+"|"+string(r.Value))
}

// TestMetaRepliesMatchTheirCommands: replies go to their commands in
// order; a quiet command is answered by its own reply when memcached sends
// one (an error, NS, a VA), and completes silently at the MN of the fence
// that follows it; an O-less error line after a silent quiet command goes
// to the next command, not the quiet one.
func TestMetaRepliesMatchTheirCommands(t *testing.T) {
	c := New(Config{Addr: "127.0.0.1:1"}, nil).Meta()
	c.state = stateUp // no socket: only the matching is tested
	var log []string
	send := func(name, line string, quiet bool) {
		if err := c.ForwardMeta([]byte(line), nil, quiet, 0, &metaRecorder{name, &log}); err != nil {
			t.Fatal(err)
		}
	}
	send("a", "mg k v q\r\n", true)    // a miss: silent
	send("b", "ma s\r\n", false)       // an error line
	send("c", "ms e 1 q ME\r\n", true) // NS despite q
	send("d", "mg k2 v\r\n", false)    // a hit
	send("e", "md k q\r\n", true)      // silent
	wantOut := "mg k v q\r\nmn\r\nma s\r\nms e 1 q ME\r\nmn\r\nmg k2 v\r\nmd k q\r\nmn\r\n"
	if string(c.out) != wantOut {
		t.Fatalf("sent %q, want %q", c.out, wantOut)
	}
	replies := "MN\r\nCLIENT_ERROR cannot increment or decrement non-numeric value\r\nNS\r\nMN\r\nVA 3 kk2\r\nabc\r\nMN\r\n"
	buf := []byte(replies)
	var r text.MetaResponse
	for len(buf) > 0 {
		n, err := text.ParseMetaResponse(buf, &r)
		if err != nil || n == 0 {
			t.Fatalf("parse %q: %d %v", buf, n, err)
		}
		if err := c.matchMeta(&r); err != nil {
			t.Fatal(err)
		}
		buf = buf[n:]
	}
	want := []string{"a silent", "b CLIENT_ERROR cannot increment or decrement non-numeric value|", "c NS|", "d VA 3 kk2|abc", "e silent"}
	if strings.Join(log, "\n") != strings.Join(want, "\n") || c.n != 0 {
		t.Errorf("got\n%s\nwant\n%s\n(%d left in flight)", strings.Join(log, "\n"), strings.Join(want, "\n"), c.n)
	}
	// A reply where a fence's MN is due, or an MN for a command, is a
	// broken stream: an error, not a guess.
	send("f", "mg k v q\r\n", true)
	if err := c.matchMeta(&text.MetaResponse{Code: []byte("HD"), Line: []byte("HD")}); err != nil {
		t.Fatal(err)
	}
	if err := c.matchMeta(&text.MetaResponse{Code: []byte("HD"), Line: []byte("HD")}); err == nil {
		t.Error("an HD where the fence's MN was due was accepted")
	}
}
