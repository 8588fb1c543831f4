//go:build linux

package proxy

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"strconv"

	"github.com/panjf2000/gnet/v2"
	"github.com/panjf2000/gnet/v2/pkg/netpoll"
	"golang.org/x/sys/unix"
)

// readGate turns the reading of a loop's client sockets off and on, by
// changing their interest in the loop's epoll instance (readgate.go says
// why). Only its loop uses it.
type readGate struct {
	epfd int   // the loop's epoll descriptor; -1: no gate (see err)
	err  error // why there is no gate, or why it stopped working
}

// pollerType is the type gnet v2 (v2.9.8, default build) gives
// eventloop.poller.
var pollerType = reflect.TypeOf((*netpoll.Poller)(nil))

// newReadGate finds the epoll descriptor of gnet event loop el and checks
// it, once, when the loop starts. gnet v2.9.8 exports no way to stop
// reading a connection, nor its loop's poller: the descriptor is the int
// field fd of the *netpoll.Poller in the unexported field poller of the
// loop, read here by reflection (read only: nothing of gnet is written
// through it). Each step is checked, and any surprise (another gnet
// version or layout, the poll_opt build whose events carry a pointer
// instead of the descriptor, a descriptor that is not an epoll instance)
// leaves the loop without a gate: held connections then fall back to
// being closed at the input bound (checkBuffered), which is safe, and the
// loop says so in its log.
func newReadGate(el gnet.EventLoop) readGate {
	fd, err := loopEpoll(el)
	if err != nil {
		return readGate{epfd: -1, err: err}
	}
	return readGate{epfd: fd}
}

func loopEpoll(el gnet.EventLoop) (int, error) {
	v := reflect.ValueOf(el)
	if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
		return -1, fmt.Errorf("gnet event loop is a %T, not a pointer to a struct", el)
	}
	p := v.Elem().FieldByName("poller")
	if !p.IsValid() || p.Type() != pollerType || p.IsNil() {
		return -1, errors.New("gnet event loop has no poller of type *netpoll.Poller")
	}
	// The default build's Poller has an eventfd beside the epoll
	// descriptor; the poll_opt build has a pointer there, and registers
	// pointers as the events' data, which a change here would overwrite.
	fd, efd := p.Elem().FieldByName("fd"), p.Elem().FieldByName("efd")
	if !fd.IsValid() || fd.Kind() != reflect.Int || !efd.IsValid() || efd.Kind() != reflect.Int {
		return -1, errors.New("gnet's netpoll.Poller is not the default epoll layout (fields fd and efd)")
	}
	epfd := int(fd.Int())
	link, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(epfd))
	if err != nil {
		return -1, fmt.Errorf("gnet poller descriptor %d: %w", epfd, err)
	}
	if link != "anon_inode:[eventpoll]" {
		return -1, fmt.Errorf("gnet poller descriptor %d is %q, not an epoll instance", epfd, link)
	}
	return epfd, nil
}

// ok reports whether the gate can stop reading.
func (g *readGate) ok() bool { return g.err == nil }

// set makes the loop watch socket fd for input when read is true, and for
// room to write when write is true, level-triggered, as gnet registers
// it (netpoll.ReadEvents, netpoll.WriteEvents, with fd as the event's
// data). Errors and hang-ups are reported whatever the interest. An error
// stops the gate from stopping reads on this loop from then on (g.err);
// set may still turn reading back on.
func (g *readGate) set(fd int, read, write bool) error {
	if g.epfd < 0 {
		return g.err
	}
	var ev uint32
	if read {
		ev |= netpoll.ReadEvents
	}
	if write {
		ev |= netpoll.WriteEvents
	}
	if err := unix.EpollCtl(g.epfd, unix.EPOLL_CTL_MOD, fd, &unix.EpollEvent{Events: ev, Fd: int32(fd)}); err != nil {
		err = fmt.Errorf("epoll_ctl(%d, MOD, %d, %#x): %w", g.epfd, fd, ev, err)
		g.err = err
		return err
	}
	return nil
}
