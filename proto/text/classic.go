package text

// admin parses an administrative command v. Those memcached runs through
// set_noreply_maybe (cache_memlimit, lru, extstore, slabs automove, watch:
// QuietNoreply in the table) send nothing when they end in noreply, not
// even an error: NoReply says so, and a proxy that refuses them refuses
// them silently then.
func (c *Command) admin(n, nt int, v *Verb) (int, error) {
	c.Kind = KindAdmin
	c.Args = append(c.Args, c.toks[:nt-1]...)
	if v.Quiet == QuietNoreply && (v.Name != "slabs" || len(c.Args) > 1 && string(c.Args[1]) == "automove") {
		c.noreply(nt)
	}
	return n, nil
}

// noreply is memcached's set_noreply_maybe: the last token is "noreply".
func (c *Command) noreply(nt int) bool {
	c.NoReply = string(c.toks[nt-2]) == stringNoreply
	return c.NoReply
}

// failReply refuses a classic command, silently when it asked for noreply.
func (c *Command) failReply(n int, line string) (int, error) {
	return n, c.fail(Error{Line: line, Silent: c.NoReply})
}

func (c *Command) get(n, nt int, rest []byte, k Kind) (int, error) {
	c.Kind = k
	i := 1
	if k == KindGat || k == KindGats {
		e, ok := parseInt32(c.toks[1])
		if !ok {
			return n, c.fail(Error{Line: msgBadExptime})
		}
		c.Exptime = e
		i = 2
	}
	for {
		for ; i < nt-1; i++ {
			key := c.toks[i]
			if len(key) > MaxKeyLen {
				return n, c.fail(Error{Line: msgBadFormat})
			}
			c.Keys = append(c.Keys, key)
		}
		if rest == nil {
			break
		}
		nt, rest = c.tokenize(rest)
		i = 0
	}
	if len(c.Keys) > 0 {
		c.Key = c.Keys[0]
	}
	return n, nil
}

// update parses set, add, replace, append, prepend and cas, which memcached
// handles in process_update_command.
func (c *Command) update(buf []byte, n, nt, maxValue int, k Kind) (int, error) {
	t := &c.toks
	if k == KindCas {
		if nt != 7 && nt != 8 {
			return n, c.fail(Error{Line: msgError})
		}
	} else if nt != 6 && nt != 7 {
		return n, c.fail(Error{Line: msgError})
	}
	c.Kind = k
	c.noreply(nt)
	if len(t[1]) > MaxKeyLen {
		return c.failReply(n, msgBadFormat)
	}
	c.Key = t[1]
	flags, ok1 := parseUint32(t[2])
	exp, ok2 := parseInt32(t[3])
	vlen, ok3 := parseInt32(t[4])
	if !ok1 || !ok2 || !ok3 {
		return c.failReply(n, msgBadFormat)
	}
	c.Flags, c.Exptime = flags, exp
	if k == KindCas {
		cas, ok := parseUint64(t[5])
		if !ok {
			return c.failReply(n, msgBadFormat)
		}
		c.CAS = cas
	}
	if vlen < 0 || int64(vlen) > maxValueLenMemcd {
		return c.failReply(n, msgBadFormat)
	}
	return c.data(buf, n, int(vlen), maxValue, false)
}

// data reads the data block of vlen bytes that follows the command line
// (n bytes) of a storage command. meta: errors are never silent.
func (c *Command) data(buf []byte, n, vlen, maxValue int, meta bool) (int, error) {
	c.DataLen = vlen
	if maxValue > 0 && vlen > maxValue {
		return n, c.fail(Error{Line: msgTooLarge, Silent: c.NoReply && !meta, Swallow: vlen + 2, TooLarge: true})
	}
	end := n + vlen + 2
	if len(buf) < end {
		c.Need = end
		return 0, nil
	}
	if buf[end-2] != '\r' || buf[end-1] != '\n' {
		return end, c.fail(Error{Line: msgBadChunk, Silent: c.NoReply && !meta})
	}
	c.Value = buf[n : n+vlen]
	return end, nil
}

func (c *Command) touch(n, nt int) (int, error) {
	if nt != 4 && nt != 5 {
		return n, c.fail(Error{Line: msgError})
	}
	c.Kind = KindTouch
	c.noreply(nt)
	if len(c.toks[1]) > MaxKeyLen {
		return c.failReply(n, msgBadFormat)
	}
	c.Key = c.toks[1]
	e, ok := parseInt32(c.toks[2])
	if !ok {
		return c.failReply(n, msgBadExptime)
	}
	c.Exptime = e
	return n, nil
}

func (c *Command) arithmetic(n, nt int, k Kind) (int, error) {
	if nt != 4 && nt != 5 {
		return n, c.fail(Error{Line: msgError})
	}
	c.Kind = k
	c.noreply(nt)
	if len(c.toks[1]) > MaxKeyLen {
		return c.failReply(n, msgBadFormat)
	}
	c.Key = c.toks[1]
	d, ok := parseUint64(c.toks[2])
	if !ok {
		return c.failReply(n, msgBadDelta)
	}
	c.Delta = d
	return n, nil
}

func (c *Command) delete(n, nt int) (int, error) {
	if nt < 3 || nt > 5 {
		return n, c.fail(Error{Line: msgError})
	}
	c.Kind = KindDelete
	if nt > 3 {
		zero := string(c.toks[2]) == "0"
		nr := c.noreply(nt)
		if !(nt == 4 && (zero || nr) || nt == 5 && zero && nr) {
			return c.failReply(n, msgDeleteUsage)
		}
	}
	if len(c.toks[1]) > MaxKeyLen {
		return c.failReply(n, msgBadFormat)
	}
	c.Key = c.toks[1]
	return n, nil
}

func (c *Command) verbosity(n, nt int) (int, error) {
	if nt != 3 && nt != 4 {
		return n, c.fail(Error{Line: msgError})
	}
	c.Kind = KindVerbosity
	c.noreply(nt)
	l, ok := parseUint32(c.toks[1])
	if !ok {
		return c.failReply(n, msgBadFormat)
	}
	c.Level = l
	return n, nil
}

func (c *Command) flushAll(n, nt int) (int, error) {
	if nt < 2 || nt > 4 {
		return n, c.fail(Error{Line: msgError})
	}
	c.Kind = KindFlushAll
	want := 2
	if c.noreply(nt) {
		want = 3
	}
	if nt != want {
		e, ok := parseInt32(c.toks[1])
		if !ok {
			return c.failReply(n, msgBadExptime)
		}
		c.Exptime, c.HasDelay = e, true
	}
	return n, nil
}
