package textdiff

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// fence is written after every batch that does not close its connection:
// memcached answers it with "MN\r\n" once everything before it is
// answered, so a batch is complete when its last MN has been read.
const fence = "mn\r\n"

// maxBlock caps the data block length Run believes a reply announces, so
// that a broken server cannot make it allocate without bound.
const maxBlock = 64 << 20

// Options configures Run. The zero value is usable.
type Options struct {
	// Timeout bounds each batch on each side: writing it and reading all
	// of its replies (default 10 s).
	Timeout time.Duration
	// DialTimeout bounds each connection attempt (default 5 s).
	DialTimeout time.Duration
	// KeepTTL compares the t (remaining TTL) tokens of meta replies as
	// they are. By default a positive t is rounded to the nearest
	// thousand seconds, since the generator's TTLs are whole thousands
	// and the value memcached reports depends on how many seconds passed
	// since the item was stored.
	KeepTTL bool
	// CASByIdentity compares CAS values (a gets reply's, a meta reply's c
	// token) by identity instead of by value: each side's values are
	// numbered in the order they first appear, and the numbers compared.
	// A proxy that carries out flush_all without sending it to memcached
	// (kvthrottle moves the bucket to a new namespace) leaves memcached's
	// CAS counter one behind at each flush, since a flush_all takes a CAS
	// value of its own; the values then differ while every equality
	// between them holds.
	CASByIdentity bool
	// Quote caps the bytes of a reply or a command quoted in a Diff
	// (default 300).
	Quote int
	// FailAddrs are addresses ("host:port") of the second server at
	// which every command that needs its backend fails (a proxy whose
	// memcached never answers, a bucket whose budget is spent). Each
	// failure batch (Batch.Fails) goes to the next of them in turn, on a
	// connection kept for it, while the first server gets the batch's Alt
	// commands on its usual connection (see the package doc). A stream
	// with failure batches needs at least one.
	FailAddrs []string
}

// Report is what Run found.
type Report struct {
	// Commands and Batches count what was sent to both sides, including
	// the batch with the difference; Conns counts connections per side.
	Commands, Batches, Conns int
	// BytesSent is the number of bytes written to each side, fences
	// included; RepliesA and RepliesB the reply bytes read.
	BytesSent, RepliesA, RepliesB int64
	// Diff is the first difference, or nil when every reply matched.
	Diff *Diff
}

// Diff describes the first difference between the two sides.
type Diff struct {
	// Batch is the index of the batch in the stream; First and Last the
	// indexes (in the whole stream) of its first and last command.
	Batch, First, Last int
	// Cmd is the index of the command the first differing reply most
	// likely belongs to (exact unless the batch holds quiet, noreply or
	// malformed commands before it, whose number of replies Run does not
	// know), Kind its generator case and Command its text, quoted and
	// truncated.
	Cmd     int
	Kind    string
	Command string
	// Offset is the offset of the first differing byte in the batch's
	// (normalized) replies.
	Offset int
	// A and B are both sides' replies from the start of the reply the
	// difference falls in (or from shortly before the difference, in a
	// long reply), quoted and truncated.
	A, B string
	// EndA and EndB say how reading each side's replies ended: "fenced"
	// (all replies read), "closed" (the server closed the connection),
	// "timeout" or an error.
	EndA, EndB string
}

// String formats the difference for a test log.
func (d *Diff) String() string {
	return fmt.Sprintf("batch %d (commands %d..%d): first difference at reply byte %d, likely command %d (%s) %s\n  A (%s): %s\n  B (%s): %s",
		d.Batch, d.First, d.Last, d.Offset, d.Cmd, d.Kind, d.Command, d.EndA, d.A, d.EndB, d.B)
}

// side is one server's connection and what Run learned from its replies.
type side struct {
	addr string
	conn net.Conn
	br   *bufio.Reader
	cas  map[string]uint64 // latest CAS value seen per key
	// casIDs numbers the CAS values seen, in order of appearance
	// (Options.CASByIdentity).
	casIDs map[string]int
}

// outcome is one side's answer to one batch.
type outcome struct {
	reply  []byte // normalized replies
	groups []int  // end offsets of reply groups in reply
	end    string
	sent   int
}

// Run sends stream to the servers at addrA and addrB ("host:port") and
// compares their replies byte for byte, batch by batch: each batch is
// written in one write per side, followed by a fence (an mn) unless it
// closes the connection, and both sides' replies are read until the fence
// is answered, or until the server closes the connection when the batch
// ends with a command that closes it. Connections are opened as the
// stream asks, one at a time per side. It stops at the first difference
// and describes it in Report.Diff. Its error is for what is not a
// difference: a failed dial, a cancelled ctx, or both sides timing out
// alike (a stream that expects replies a server never gives). Run may be
// called concurrently with other Runs; it owns every goroutine it starts
// and returns only after they are done.
func Run(ctx context.Context, addrA, addrB string, stream *Stream, opts Options) (Report, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Second
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 5 * time.Second
	}
	if opts.Quote <= 0 {
		opts.Quote = 300
	}
	sides := [2]*side{newSide(addrA), newSide(addrB)}
	fails := make([]*side, len(opts.FailAddrs))
	for i, a := range opts.FailAddrs {
		fails[i] = newSide(a)
	}
	defer func() {
		for _, s := range append(sides[:], fails...) {
			if s.conn != nil {
				_ = s.conn.Close()
			}
		}
	}()
	var rep Report
	first, failed := 0, 0
	needConn := true
	for bi := range stream.Batches {
		b := &stream.Batches[bi]
		if err := ctx.Err(); err != nil {
			return rep, fmt.Errorf("textdiff: batch %d: %w", bi, err)
		}
		if b.NewConn || needConn {
			for _, s := range sides {
				if err := s.dial(ctx, opts.DialTimeout); err != nil {
					return rep, fmt.Errorf("textdiff: batch %d: %w", bi, err)
				}
			}
			rep.Conns++
		}
		run := sides
		if b.Fails {
			if len(fails) == 0 {
				return rep, fmt.Errorf("textdiff: batch %d is a failure batch, and Options.FailAddrs names no address for it", bi)
			}
			run[1] = fails[failed%len(fails)]
			failed++
			if run[1].conn == nil {
				if err := run[1].dial(ctx, opts.DialTimeout); err != nil {
					return rep, fmt.Errorf("textdiff: batch %d: %w", bi, err)
				}
			}
		}
		var outs [2]outcome
		var wg sync.WaitGroup
		ca, cb := run[0].conn, run[1].conn
		stop := context.AfterFunc(ctx, func() {
			_ = ca.SetDeadline(time.Unix(1, 0))
			_ = cb.SetDeadline(time.Unix(1, 0))
		})
		for i, s := range run {
			wg.Add(1)
			go func() {
				defer wg.Done()
				outs[i] = s.exec(b, i == 0, time.Now().Add(opts.Timeout), &opts)
			}()
		}
		wg.Wait()
		stop()
		rep.Batches++
		rep.Commands += len(b.Cmds)
		rep.BytesSent += int64(outs[0].sent)
		rep.RepliesA += int64(len(outs[0].reply))
		rep.RepliesB += int64(len(outs[1].reply))
		a, bb := &outs[0], &outs[1]
		if !bytes.Equal(a.reply, bb.reply) || a.end != bb.end {
			rep.Diff = describe(bi, first, b, a, bb, opts.Quote)
			return rep, nil
		}
		if err := ctx.Err(); err != nil {
			return rep, fmt.Errorf("textdiff: batch %d: %w", bi, err)
		}
		if a.end == "timeout" {
			return rep, fmt.Errorf("textdiff: batch %d (commands %d..%d): both sides timed out after %q: the stream expects replies memcached does not give",
				bi, first, first+len(b.Cmds)-1, clip(a.reply, opts.Quote))
		}
		if a.end != "fenced" && a.end != "closed" {
			return rep, fmt.Errorf("textdiff: batch %d: both sides: %s", bi, a.end)
		}
		needConn = a.end == "closed"
		if b.Fails && bb.end == "closed" {
			_ = run[1].conn.Close()
			run[1].conn = nil
		}
		first += len(b.Cmds)
	}
	return rep, nil
}

func newSide(addr string) *side {
	return &side{addr: addr, cas: map[string]uint64{}, casIDs: map[string]int{}}
}

// dial replaces s's connection by a new one.
func (s *side) dial(ctx context.Context, timeout time.Duration) error {
	if s.conn != nil {
		_ = s.conn.Close()
		s.conn = nil
	}
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(ctx, "tcp", s.addr)
	if err != nil {
		return fmt.Errorf("dial %s: %w", s.addr, err)
	}
	s.conn = c
	s.br = bufio.NewReaderSize(c, 64<<10)
	return nil
}

// wire returns the bytes of b as written to s: its commands (in a
// failure batch, their Alt forms when first: s is the first server) with
// their CAS placeholders filled in from s's replies, then the fence unless
// the batch closes the connection. It also returns how many MN replies
// complete the batch.
func (s *side) wire(b *Batch, first bool) ([]byte, int) {
	var out []byte
	mns := 0
	for i := range b.Cmds {
		c := &b.Cmds[i]
		text, data := c.Text, c.Data
		if b.Fails && first && c.Alt != nil {
			text, data = c.Alt, c.AltData
		}
		if c.isMN() { // its Alt too (a failing retrieval's)
			mns++
		}
		if c.CASKey == "" {
			out = append(out, text...)
		} else {
			v, ok := s.cas[c.CASKey]
			if !ok {
				v = 987654321
			}
			v += uint64(c.CASDelta)
			out = append(out, bytes.Replace(text, []byte(CASPlaceholder), strconv.AppendUint(nil, v, 10), 1)...)
		}
		if data != nil {
			out = append(append(out, data...), "\r\n"...)
		}
	}
	if b.Closes() {
		return out, 0
	}
	return append(out, fence...), mns + 1
}

// exec writes b to s's connection and reads the replies, all before
// deadline; first: s is the first server (see wire).
func (s *side) exec(b *Batch, first bool, deadline time.Time, opts *Options) outcome {
	data, wantMN := s.wire(b, first)
	o := outcome{sent: len(data)}
	_ = s.conn.SetDeadline(deadline)
	werr := make(chan error, 1)
	go func() {
		_, err := s.conn.Write(data)
		werr <- err
	}()
	o.end = s.read(&o, wantMN, opts, b.Fails)
	if err := <-werr; err != nil && o.end == "fenced" {
		o.end = "write: " + err.Error()
	}
	return o
}

// read reads reply units into o until the wantMN-th MN (or, if wantMN is
// 0, until the connection closes) and returns how it ended. In a failure
// batch (fails), every error line reads as failureLine.
func (s *side) read(o *outcome, wantMN int, opts *Options, fails bool) string {
	mns := 0
	for {
		line, err := readLine(s.br)
		if err != nil {
			o.reply = append(o.reply, line...)
			if len(line) > 0 {
				o.groups = append(o.groups, len(o.reply))
			}
			return endOf(err)
		}
		hdr := line
		f := strings.Fields(string(line))
		n, isBlock := blockLen(f)
		s.learnCAS(f)
		if !opts.KeepTTL {
			hdr = roundTTLs(hdr, f)
		}
		if opts.CASByIdentity {
			hdr = s.casIdentities(hdr, f)
		}
		if fails && (bytes.HasPrefix(line, []byte("CLIENT_ERROR ")) || bytes.HasPrefix(line, []byte("SERVER_ERROR "))) {
			hdr = []byte(failureLine)
		}
		o.reply = append(o.reply, hdr...)
		if isBlock {
			blk := make([]byte, n+2)
			k, err := io.ReadFull(s.br, blk)
			o.reply = append(o.reply, blk[:k]...)
			if err != nil {
				o.groups = append(o.groups, len(o.reply))
				return endOf(err)
			}
		}
		if !bytes.HasPrefix(line, []byte("VALUE ")) {
			o.groups = append(o.groups, len(o.reply))
		}
		if string(line) == "MN\r\n" {
			mns++
			if wantMN > 0 && mns == wantMN {
				return "fenced"
			}
		}
	}
}

// failureLine is what an error line of a failure batch reads as: the
// servers compared fail its commands for different reasons, in their own
// words, but frame the failures alike.
const failureLine = "<CLIENT_ERROR or SERVER_ERROR line>\r\n"

// readLine returns the next line, its LF included, however long.
func readLine(br *bufio.Reader) ([]byte, error) {
	var out []byte
	for {
		b, err := br.ReadSlice('\n')
		out = append(out, b...)
		if err == bufio.ErrBufferFull {
			continue
		}
		return out, err
	}
}

// endOf names how a read error ended a batch.
func endOf(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, net.ErrClosed):
		return "closed"
	case errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	default:
		return "error: " + err.Error()
	}
}

// blockLen reports whether a reply line, split into fields f, heads a
// data block (VALUE or VA), and the block's length without its CRLF.
func blockLen(f []string) (int, bool) {
	var tok string
	switch {
	case len(f) >= 4 && f[0] == "VALUE":
		tok = f[3]
	case len(f) >= 2 && f[0] == "VA":
		tok = f[1]
	default:
		return 0, false
	}
	n, err := strconv.Atoi(tok)
	if err != nil || n < 0 || n > maxBlock {
		return 0, false
	}
	return n, true
}

// metaReply reports whether fields are a meta command's reply header.
func metaReply(f []string) bool {
	if len(f) == 0 {
		return false
	}
	switch f[0] {
	case "VA", "HD", "EN", "NF", "NS", "EX":
		return true
	}
	return false
}

// learnCAS records the CAS value a reply line (split into fields f)
// reports for a key: a gets VALUE line, or a meta reply carrying both c
// and k flags.
func (s *side) learnCAS(f []string) {
	if len(f) == 5 && f[0] == "VALUE" {
		if v, err := strconv.ParseUint(f[4], 10, 64); err == nil {
			s.cas[f[1]] = v
		}
		return
	}
	if !metaReply(f) {
		return
	}
	var key, cas string
	b64 := false
	for _, t := range f[1:] {
		switch {
		case t == "b":
			b64 = true
		case strings.HasPrefix(t, "k"):
			key = t[1:]
		case strings.HasPrefix(t, "c"):
			cas = t[1:]
		}
	}
	if key == "" || cas == "" {
		return
	}
	if b64 {
		k, err := base64.StdEncoding.DecodeString(key)
		if err != nil {
			return
		}
		key = string(k)
	}
	if v, err := strconv.ParseUint(cas, 10, 64); err == nil {
		s.cas[key] = v
	}
}

// casIdentities returns line with the CAS values it reports (see learnCAS)
// replaced by their identities on this side, "#1" for the first value
// seen, and so on (Options.CASByIdentity); f are line's fields, which it
// may change.
func (s *side) casIdentities(line []byte, f []string) []byte {
	id := func(v string) string {
		n, ok := s.casIDs[v]
		if !ok {
			n = len(s.casIDs) + 1
			s.casIDs[v] = n
		}
		return "#" + strconv.Itoa(n)
	}
	switch {
	case len(f) == 5 && f[0] == "VALUE":
		f[4] = id(f[4])
	case metaReply(f):
		changed := false
		for i, t := range f[1:] {
			if len(t) > 1 && t[0] == 'c' {
				f[i+1] = "c" + id(t[1:])
				changed = true
			}
		}
		if !changed {
			return line
		}
	default:
		return line
	}
	return []byte(strings.Join(f, " ") + "\r\n")
}

// roundTTLs returns line with each positive t token of a meta reply
// header rounded to the nearest thousand; f are line's fields, which it
// may change.
func roundTTLs(line []byte, f []string) []byte {
	if !metaReply(f) {
		return line
	}
	changed := false
	for i, t := range f[1:] {
		if len(t) < 2 || t[0] != 't' {
			continue
		}
		v, err := strconv.ParseInt(t[1:], 10, 64)
		if err != nil || v <= 0 {
			continue
		}
		f[i+1] = "t" + strconv.FormatInt((v+500)/1000*1000, 10)
		changed = true
	}
	if !changed {
		return line
	}
	return []byte(strings.Join(f, " ") + "\r\n")
}

// describe builds the Diff for batch bi, whose first command has index
// first in the stream.
func describe(bi, first int, b *Batch, a, bb *outcome, quote int) *Diff {
	off := 0
	for off < len(a.reply) && off < len(bb.reply) && a.reply[off] == bb.reply[off] {
		off++
	}
	// The reply group the difference falls in, and where it starts.
	g, start := 0, 0
	for g < len(a.groups) && a.groups[g] <= off {
		start = a.groups[g]
		g++
	}
	ci := len(b.Cmds) - 1
	acc := 0
	for i := range b.Cmds {
		r := b.Cmds[i].Replies
		if r < 0 {
			r = 0
		}
		if g < acc+r {
			ci = i
			break
		}
		acc += r
	}
	c := &b.Cmds[ci]
	// Quote from the start of the reply the difference is in, or from a
	// little before the difference if that reply is long.
	if off-start > quote/3 {
		start = off - quote/3
	}
	return &Diff{
		Batch: bi, First: first, Last: first + len(b.Cmds) - 1,
		Cmd: first + ci, Kind: c.Kind, Command: clip(append(c.Text[:len(c.Text):len(c.Text)], c.Data...), quote),
		Offset: off,
		A:      clip(tail(a.reply, start), quote), B: clip(tail(bb.reply, start), quote),
		EndA: a.end, EndB: bb.end,
	}
}

func tail(b []byte, from int) []byte {
	if from > len(b) {
		return nil
	}
	return b[from:]
}

// clip quotes b, cut to n bytes.
func clip(b []byte, n int) string {
	if len(b) <= n {
		return strconv.Quote(string(b))
	}
	return strconv.Quote(string(b[:n])) + fmt.Sprintf("... (%d bytes)", len(b))
}
