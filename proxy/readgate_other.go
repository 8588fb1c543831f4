//go:build !linux

package proxy

import (
	"errors"

	"github.com/panjf2000/gnet/v2"
)

// readGate is unavailable off Linux (kqueue would need its own change of
// interest): held connections are closed at the input bound.
type readGate struct{ err error }

var errNoReadGate = errors.New("stopping reads is implemented for epoll only")

func newReadGate(gnet.EventLoop) readGate { return readGate{err: errNoReadGate} }

func (g *readGate) ok() bool { return false }

func (g *readGate) set(int, bool, bool) error { return g.err }
